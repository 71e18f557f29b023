package bootstrap

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

const (
	defaultHolderHints      = 1024
	defaultHolderRetryAfter = 30 * time.Second
)

// holders remembers, per recipient, the URL of the instance the hub last
// named as holding its queue (recipient_instance_url), and the holder URLs
// that could not be reached lately. Both maps are bounded by max. Safe for
// concurrent use.
type holders struct {
	max        int
	retryAfter time.Duration
	now        func() time.Time
	// hubs are the client's own hub URLs: a hint naming one of them is no
	// route of its own, and an https one forbids http hints.
	hubs []string

	mu    sync.Mutex
	hints map[string]string    // recipient session id → holder URL
	bad   map[string]time.Time // holder URL → until when it is left alone
	// checked holds what usable said of the hints seen lately: most
	// answers name one of a few instances, which need not be parsed again.
	checked map[string]string
}

func newHolders(max int, retryAfter time.Duration, hubs []string) *holders {
	return &holders{
		max: max, retryAfter: retryAfter, now: time.Now, hubs: hubs,
		hints: make(map[string]string), bad: make(map[string]time.Time), checked: make(map[string]string),
	}
}

// route is the holder URL to send to's next signal to, or "" for the hub
// URL: none hinted, or the hinted one could not be reached lately.
func (h *holders) route(to string) string {
	if h == nil {
		return ""
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	u, ok := h.hints[to]
	if !ok {
		return ""
	}
	if until, bad := h.bad[u]; bad {
		if h.now().Before(until) {
			delete(h.hints, to)
			return ""
		}
		delete(h.bad, u)
	}
	return u
}

// learn records the hint of a send's answer to to: hint, when it is usable,
// or none (forgetting the last one) when it is absent or not usable.
func (h *holders) learn(to, hint string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	u, ok := h.checked[hint]
	if !ok {
		u = h.usable(hint)
		if len(h.checked) >= h.max {
			clear(h.checked)
		}
		h.checked[hint] = u
	}
	if u == "" {
		delete(h.hints, to)
		return
	}
	if _, ok := h.hints[to]; !ok && len(h.hints) >= h.max {
		for k := range h.hints { // full: make room with any one
			delete(h.hints, k)
			break
		}
	}
	h.hints[to] = u
}

// forget drops to's hint.
func (h *holders) forget(to string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.hints, to)
}

// unreachable drops to's hint and leaves holder alone for retryAfter, so
// that a dead holder costs one failed dial, not one per send.
func (h *holders) unreachable(to, holder string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.hints, to)
	now := h.now()
	if _, ok := h.bad[holder]; !ok && len(h.bad) >= h.max {
		for k, until := range h.bad { // full: the expired go, or any one
			if !now.Before(until) {
				delete(h.bad, k)
			}
		}
		for k := range h.bad {
			if len(h.bad) < h.max {
				break
			}
			delete(h.bad, k)
		}
	}
	h.bad[holder] = now.Add(h.retryAfter)
}

// usable is hint without its trailing slashes when the client may send its
// session token there (tokenURL) and it is not one of the client's own hub
// URLs (those need no route). "" otherwise.
func (h *holders) usable(hint string) string {
	s := tokenURL(h.hubs, hint)
	if slices.Contains(h.hubs, s) {
		return ""
	}
	return s
}

// tokenURL is raw without its trailing slashes when a client whose hub URLs
// are hubs may send its session token there, as to a holder hint or a 409
// wrong_instance's instance_url: an http(s) URL with a host, no
// credentials, query or fragment, not plain http when the client reaches
// its hub over https, and not a loopback host unless the client reaches a
// hub on loopback too. "" otherwise.
//
// The loopback rule: an instance without MARCONI_PUBLIC_URL publishes
// http://127.0.0.1:PORT, which names that instance only for a client on its
// own machine; a client reaching its hub by another name would send its
// token to whatever listens on that port where the client runs.
func tokenURL(hubs []string, raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		u.RawQuery != "" || u.Fragment != "" {
		return ""
	}
	if u.Scheme == "http" && slices.ContainsFunc(hubs, func(hub string) bool { return strings.HasPrefix(hub, "https:") }) {
		return ""
	}
	if isLoopback(u.Hostname()) && !slices.ContainsFunc(hubs, func(hub string) bool {
		hu, err := url.Parse(hub)
		return err == nil && isLoopback(hu.Hostname())
	}) {
		return ""
	}
	return strings.TrimRight(raw, "/")
}

// isLoopback reports whether host names this machine: localhost (or a name
// under .localhost), a loopback address, or the unspecified one (0.0.0.0,
// ::), which a dial also takes to this machine.
func isLoopback(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
}

// notProcessed reports whether err certainly means the request never reached
// a hub: the dial failed (connection refused, no route, no such host), or a
// balancer answered 502 or 503 in a shape that is not the hub's own error
// (HAProxy's "no server available"). Anything else may have been stored.
func notProcessed(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return true
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return true
	}
	var he *Error
	return errors.As(err, &he) && he.Code == codeUnexpected &&
		(he.Status == http.StatusBadGateway || he.Status == http.StatusServiceUnavailable)
}

// sendCall makes one send: to the instance the hub last named as holding
// the recipient's queue when there is one, else (and when the holder
// certainly did not get it) through the hub URL. It learns the answer's hint.
func (c *Client) sendCall(ctx context.Context, to string, req encodedBody, resp *sendResponse) (auth, error) {
	if holder := c.holders.route(to); holder != "" {
		*resp = sendResponse{}
		a, err := c.sessionCallAt(ctx, holder, http.MethodPost, "/v1/signals", req, resp)
		switch {
		case err == nil:
			c.holderSends.Add(1)
			c.holders.learn(to, resp.RecipientInstanceURL)
			return a, nil
		case !notProcessed(ctx, err):
			// Perhaps stored: returned as any send's failure is (a retry
			// carries the same idempotency key), through the hub URL.
			c.holders.forget(to)
			return a, err
		}
		c.holders.unreachable(to, holder)
		c.holderFallbacks.Add(1)
		c.log.Info("marconi: the recipient's instance is unreachable; sending through the hub URL",
			"to_session", to, "instance_url", holder, "retry_after", c.cfg.HolderRetryAfter, "err", err)
	}
	*resp = sendResponse{}
	a, err := c.sessionCall(ctx, http.MethodPost, "/v1/signals", req, resp)
	if err == nil {
		c.holders.learn(to, resp.RecipientInstanceURL)
	}
	return a, err
}
