package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// The operator's commands (buskey, route, sessions, signals, disconnect,
// deregister, fabric, apikey) call a hub's /v1/ops API with the admin token
// of MARCONI_ADMIN_TOKEN, never a flag, which `ps` would show. This file is
// what they share: where the hub is, the call, and the hub's refusals.

// opsTimeout bounds one call of an operator's command to the hub.
const opsTimeout = 10 * time.Second

// opsAnswerLimit bounds the answer an operator's command reads: a listing
// of the hub's largest page of route states fits.
const opsAnswerLimit = 8 << 20

// hubError is the hub's refusal of an ops call: its HTTP status and its
// error body's stable code and message (docs/api.md).
type hubError struct {
	Status                  string // "409 Conflict"
	Code, Message           string
	InstanceID, InstanceURL string // with wrong_instance
}

func (e *hubError) Error() string {
	if e.Code == "" {
		return "the hub answered " + e.Status
	}
	return fmt.Sprintf("%s (%s): %s", e.Code, e.Status, e.Message)
}

// opsClient calls one hub's ops API with the admin token. The token is sent
// in the Authorization header only and is never printed.
type opsClient struct {
	hub   string // the hub's URL, without a trailing slash
	token string
}

// opsAnswer is a successful answer: its body as the hub sent it, and the
// hub's clock when it answered (its Date header; this machine's clock when
// there is none), so that ages are the hub's, whatever this clock says.
type opsAnswer struct {
	body []byte
	at   time.Time
}

// call sends one request (in, when not nil, as its JSON body) and returns
// the answer of a 2xx, a *hubError for any other status, or an error
// naming what failed on the way.
func (o opsClient) call(ctx context.Context, method, path string, in any) (opsAnswer, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return opsAnswer{}, err
		}
		body = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, opsTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, o.hub+path, body)
	if err != nil {
		return opsAnswer{}, usagef("HUB_URL %q: %v", o.hub, err)
	}
	req.Header.Set("Authorization", "Bearer "+o.token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return opsAnswer{}, fmt.Errorf("cannot reach the hub: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, opsAnswerLimit+1))
	if err != nil {
		return opsAnswer{}, fmt.Errorf("read the hub's answer: %w", err)
	}
	if len(raw) > opsAnswerLimit {
		return opsAnswer{}, fmt.Errorf("the hub's answer is larger than %d bytes", opsAnswerLimit)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct {
				Code        string `json:"code"`
				Message     string `json:"message"`
				InstanceID  string `json:"instance_id"`
				InstanceURL string `json:"instance_url"`
			} `json:"error"`
		}
		_ = json.Unmarshal(raw, &e) // a body not in the error shape leaves the code empty
		return opsAnswer{}, &hubError{Status: resp.Status, Code: e.Error.Code,
			Message: e.Error.Message, InstanceID: e.Error.InstanceID, InstanceURL: e.Error.InstanceURL}
	}
	at, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		at = time.Now()
	}
	return opsAnswer{body: raw, at: at}, nil
}

// get is call for a GET whose answer is decoded into out; what names the
// answer expected, for the error when it is not that.
func (o opsClient) get(ctx context.Context, path, what string, out any) (opsAnswer, error) {
	a, err := o.call(ctx, http.MethodGet, path, nil)
	if err != nil {
		return a, err
	}
	return a, a.decode(what, out)
}

// decode reads the answer's body into out.
func (a opsAnswer) decode(what string, out any) error {
	if err := json.Unmarshal(a.body, out); err != nil {
		return fmt.Errorf("the hub's answer is not %s: %w", what, err)
	}
	return nil
}

// age is how long before the answer t was, never negative (the Date header
// counts whole seconds).
func (a opsAnswer) age(t time.Time) time.Duration {
	return max(a.at.Sub(t), 0)
}

// opsTarget splits a command's positional arguments into the hub to call
// and the n arguments that follow its URL. HUB_URL may be left out when
// MARCONI_HUB_URL names the hub. A missing admin token is a usage error.
func (c cli) opsTarget(pos []string, n int, usage string) (opsClient, []string, error) {
	var raw, source string
	switch len(pos) {
	case n + 1:
		raw, source, pos = pos[0], "HUB_URL", pos[1:]
	case n:
		if n > 0 && strings.Contains(pos[0], "://") { // the hub, and not what follows it
			return opsClient{}, nil, usagef("%s", usage)
		}
		raw, source = strings.TrimSpace(c.getenv("MARCONI_HUB_URL")), "MARCONI_HUB_URL"
		if raw == "" {
			return opsClient{}, nil, usagef("no hub: name it as HUB_URL or set MARCONI_HUB_URL; %s", usage)
		}
		if strings.Contains(raw, ",") {
			return opsClient{}, nil, usagef("MARCONI_HUB_URL names several hubs: name one as HUB_URL; %s", usage)
		}
	default:
		return opsClient{}, nil, usagef("%s", usage)
	}
	if u, err := url.Parse(raw); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return opsClient{}, nil, usagef("%s %q: want an http:// or https:// URL; %s", source, raw, usage)
	}
	token := c.getenv("MARCONI_ADMIN_TOKEN")
	if token == "" {
		return opsClient{}, nil, usagef("MARCONI_ADMIN_TOKEN is not set: this command is the admin's (set it to the hub's admin token)")
	}
	return opsClient{hub: strings.TrimRight(raw, "/"), token: token}, pos, nil
}

// followed is o aimed at the instance a wrong_instance named, or an error
// saying why the admin token will not be sent there: the rules the clients
// keep for their session token (bootstrap-client tokenURL): an http(s) URL
// with a host and nothing else, not plain http when o's hub is https, and
// not loopback unless o's hub is too.
func (o opsClient) followed(raw string) (opsClient, error) {
	u, err := url.Parse(raw)
	if raw == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		u.RawQuery != "" || u.Fragment != "" {
		return o, fmt.Errorf("the hub names no usable URL for that instance (%q)", raw)
	}
	hub, _ := url.Parse(o.hub)
	if u.Scheme == "http" && hub.Scheme == "https" {
		return o, fmt.Errorf("not following to %s: plain http from a hub reached over https would expose the admin token", raw)
	}
	if loopbackHost(u.Hostname()) && !loopbackHost(hub.Hostname()) {
		return o, fmt.Errorf("not following to %s: a loopback URL names that instance only on its own machine", raw)
	}
	return opsClient{hub: strings.TrimRight(raw, "/"), token: o.token}, nil
}

// loopbackHost reports whether host names this machine.
func loopbackHost(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
}

// wrongInstance returns err's *hubError when it is a 409 wrong_instance.
func wrongInstance(err error) (*hubError, bool) {
	he, ok := errors.AsType[*hubError](err)
	return he, ok && he.Code == "wrong_instance"
}
