package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi"
)

// Reconnect backoff of `marconi attach`: the wait before the n-th attempt
// in a row is uniform in [0, min(attachMaxDelay, attachBaseDelay·2ⁿ)) (full
// jitter, as the Go client's), so the attaches a restart closed do not come
// back in one wave.
const (
	attachBaseDelay = 250 * time.Millisecond
	attachMaxDelay  = 4 * time.Second
)

// exitSessionEnded is attach's exit code when the hub ended the session
// (close 4410, or 410 session_expired to a reattach): register again.
const exitSessionEnded = 3

// attach is `marconi attach HUB_URL SESSION_TOKEN`: a minimal WebSocket
// client for the README tour and for debugging. It prints every frame on
// stdout and acks each signal after printing it, until Ctrl-C (nil) or until
// the hub ends the session for good. A close with 1012 (a restart, a drain,
// an operator's disconnect), any other close and a dropped connection are
// reconnected with backoff, as the Go client does, and said on stderr; only
// 4410 (the session ended: exitSessionEnded), 4409 (a newer connection
// replaced it), 4401, or a reattach refused for good end it. The first
// attach is not retried: a wrong URL or token fails at once.
func attach(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) != 2 {
		return usagef("usage: marconi attach HUB_URL SESSION_TOKEN")
	}
	u := strings.TrimRight(args[0], "/")
	a := attacher{
		url:    "ws" + strings.TrimPrefix(strings.TrimPrefix(u, "http"), "ws") + "/v1/ws",
		token:  args[1],
		stdout: stdout, stderr: stderr,
	}
	c, err := a.dial(ctx)
	if err != nil {
		var refused *attachRefused
		if errors.As(err, &refused) && refused.end() != nil {
			return refused.end()
		}
		return err
	}
	for {
		err := a.hold(ctx, c)
		if ctx.Err() != nil {
			c.Close(websocket.StatusNormalClosure, "bye")
			return nil
		}
		c.CloseNow()
		if end := connectionEnd(err); end != nil {
			return end
		}
		fmt.Fprintf(a.stderr, "marconi attach: connection ended (%v); reconnecting\n", err)
		if c, err = a.reconnect(ctx); err != nil || c == nil {
			return err // nil: interrupted
		}
	}
}

// attacher holds one session's WebSocket for attach.
type attacher struct {
	url, token     string
	stdout, stderr io.Writer
}

// dial attaches once. A refused handshake is an *attachRefused.
func (a attacher) dial(ctx context.Context) (*websocket.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel() // the connection outlives the dial's context
	c, resp, err := websocket.Dial(dctx, a.url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + a.token}}})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			body, _ := io.ReadAll(resp.Body)
			secs, _ := strconv.Atoi(resp.Header.Get(marconi.HeaderRetryAfter))
			return nil, &attachRefused{status: resp.StatusCode, text: resp.Status + " " + strings.TrimSpace(string(body)),
				retryAfter: time.Duration(secs) * time.Second}
		}
		return nil, fmt.Errorf("attach %s: %w", a.url, err)
	}
	c.SetReadLimit(1 << 20)
	return c, nil
}

// hold prints c's frames and acks each signal until the connection ends,
// and returns why it ended.
func (a attacher) hold(ctx context.Context, c *websocket.Conn) error {
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintln(a.stdout, string(data))
		var f struct {
			Type marconi.FrameType `json:"type"`
			Seq  int64             `json:"seq"`
		}
		if json.Unmarshal(data, &f) == nil && f.Type == marconi.FrameSignal {
			ack, _ := json.Marshal(map[string]any{"type": marconi.FrameAck, "up_to_seq": f.Seq})
			if err := c.Write(ctx, websocket.MessageText, ack); err != nil {
				return err
			}
		}
	}
}

// reconnect attaches again, waiting before each attempt with the backoff
// and at least a refusal's Retry-After, until attached, interrupted (nil,
// nil) or refused for good (that refusal's error).
func (a attacher) reconnect(ctx context.Context) (*websocket.Conn, error) {
	var asked time.Duration // the last refusal's Retry-After
	for attempt := 0; ; attempt++ {
		ceiling := min(attachMaxDelay, attachBaseDelay<<min(attempt, 16))
		t := time.NewTimer(max(asked, rand.N(ceiling)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil
		case <-t.C:
		}
		c, err := a.dial(ctx)
		if err == nil {
			fmt.Fprintln(a.stderr, "marconi attach: reconnected")
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		var refused *attachRefused
		if errors.As(err, &refused) {
			if end := refused.end(); end != nil {
				return nil, end
			}
			asked = refused.retryAfter
		}
		fmt.Fprintf(a.stderr, "marconi attach: %v; retrying\n", err)
	}
}

// attachRefused is an attach the hub answered in HTTP instead of upgrading.
type attachRefused struct {
	status     int
	text       string // the status line and the error body
	retryAfter time.Duration
}

func (e *attachRefused) Error() string { return "attach refused: " + e.text }

// end is the error a reattach refused so ends attach with, nil when
// trying again may help: 429 (after its Retry-After), and the answers of
// a hub or a proxy that is restarting or out of reach (502, 503, 504).
func (e *attachRefused) end() error {
	switch e.status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return nil
	case http.StatusGone:
		return exitError{exitSessionEnded, e.Error() + " (the session ended; register again)"}
	}
	return e
}

// connectionEnd is the error the end of an attached connection (err, from
// its read or its ack) ends attach with, nil when it is reconnected.
func connectionEnd(err error) error {
	switch websocket.CloseStatus(err) {
	case marconi.CloseSessionExpired:
		return exitError{exitSessionEnded, "the hub ended the session (close 4410: deregistered or expired); register again"}
	case marconi.CloseReplaced:
		return fmt.Errorf("a newer connection of this session replaced this one (close 4409)")
	case marconi.CloseUnauthorized:
		return fmt.Errorf("the session token stopped working (close 4401)")
	}
	return nil
}
