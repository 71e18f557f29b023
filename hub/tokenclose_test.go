package hub_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
)

// wantClosed reads c until the hub closes it and fails unless it closed
// with code. Frames before the close (signals) are skipped.
func wantClosed(t *testing.T, what string, c *websocket.Conn, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, _, err := c.Read(ctx)
		if err == nil {
			continue
		}
		if got := closeStatus(err); got != code {
			t.Fatalf("%s: the WebSocket ended with %d (%v), want %d", what, got, err, code)
		}
		return
	}
}

// TestTokenChangeClosesWebSocket: a token that stops working closes the
// WebSocket opened with it at once (the pending sweep is off here, so the
// close cannot come from it): 4409 after a resume or a takeover, 4410
// after a deregistration; the connection opened with the current token
// keeps working.
func TestTokenChangeClosesWebSocket(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{PendingSweep: noSweep}})
	alice := register(t, h, "alice", "claude_code")
	bob := register(t, h, "bob", "claude_code")

	c, _ := dial(t, h, alice)
	st, r := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": "alice", "surface": "claude_code"},
		"X-Marconi-Session-Token", alice.Token)
	if st != http.StatusOK {
		t.Fatalf("resume: %d %v", st, r)
	}
	wantClosed(t, "the WebSocket of the resumed token", c, 4409)
	alice.Token = r["token"].(string)

	c, _ = dial(t, h, alice)
	st, r = call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": "alice", "surface": "claude_code", "takeover": true})
	if st != http.StatusOK || r["taken_over"] != true {
		t.Fatalf("takeover: %d %v", st, r)
	}
	wantClosed(t, "the WebSocket of the token taken over", c, 4409)
	alice.Token = r["token"].(string)

	// The new token's WebSocket is the session's queue and receives.
	c, _ = dial(t, h, alice)
	if got := send(t, h, bob, "alice", 1); got["delivery"] != "pushed_to_ws" {
		t.Fatalf("send to alice on the new token's WebSocket: %v", got)
	}
	if f := readFrame(t, c); f["type"] != "signal" {
		t.Fatalf("frame %v, want the signal", f)
	}
	if st, r := call(t, "DELETE", h.URL+"/v1/session", alice.Token, nil); st != http.StatusNoContent {
		t.Fatalf("deregister: %d %v", st, r)
	}
	wantClosed(t, "the WebSocket of the deregistered session", c, 4410)
}

// TestPGTokenChangeClosesWebSocketOnAnotherInstance: the WebSocket is held
// by instance b while the token changes on a: b closes it at once through
// a's check wake-up (b's pending sweep is off): 4409 after a resume and a
// takeover, 4410 after a deregistration.
func TestPGTokenChangeClosesWebSocketOnAnotherInstance(t *testing.T) {
	t.Parallel()
	p := startPair(t, pairOptions{sweepB: noSweep})
	reg := func(hdr ...string) map[string]any {
		t.Helper()
		body := map[string]any{"session_id": "alice", "surface": "claude_code"}
		if len(hdr) == 0 {
			body["takeover"] = true
		}
		st, r := call(t, "POST", p.a.URL+"/v1/sessions", p.a.APIKey, body, hdr...)
		if st != http.StatusOK && st != http.StatusCreated {
			t.Fatalf("register alice on a: %d %v", st, r)
		}
		return r
	}
	alice := agent{ID: "alice", Token: reg()["token"].(string)}

	c, _ := dial(t, p.b, alice)
	alice.Token = reg("X-Marconi-Session-Token", alice.Token)["token"].(string)
	wantClosed(t, "b's WebSocket of the token resumed on a", c, 4409)

	c, _ = dial(t, p.b, alice)
	r := reg()
	if r["taken_over"] != true {
		t.Fatalf("takeover on a: %v", r)
	}
	alice.Token = r["token"].(string)
	wantClosed(t, "b's WebSocket of the token taken over on a", c, 4409)

	c, _ = dial(t, p.b, alice)
	if st, r := call(t, "DELETE", p.a.URL+"/v1/session", alice.Token, nil); st != http.StatusNoContent {
		t.Fatalf("deregister on a: %d %v", st, r)
	}
	wantClosed(t, "b's WebSocket of the session deregistered on a", c, 4410)
}

// TestPGTokenChangeLostCheckIsSweptUp: when a's check wake-up is lost, b's
// pending sweep closes the WebSocket of the replaced token all the same.
func TestPGTokenChangeLostCheckIsSweptUp(t *testing.T) {
	t.Parallel()
	p := startPair(t, pairOptions{sweepB: 100 * time.Millisecond})
	st, r := call(t, "POST", p.a.URL+"/v1/sessions", p.a.APIKey, map[string]any{"session_id": "alice", "surface": "claude_code"})
	if st != http.StatusCreated {
		t.Fatalf("register alice on a: %d %v", st, r)
	}
	c, _ := dial(t, p.b, agent{ID: "alice", Token: r["token"].(string)})
	p.dropA.drop.Store(true)
	st, r = call(t, "POST", p.a.URL+"/v1/sessions", p.a.APIKey, map[string]any{"session_id": "alice", "surface": "claude_code", "takeover": true})
	if st != http.StatusOK || r["taken_over"] != true {
		t.Fatalf("takeover on a: %d %v", st, r)
	}
	if p.dropA.dropped.Load() == 0 {
		t.Fatal("a sent no check wake-up to b")
	}
	wantClosed(t, "b's WebSocket of the token taken over on a, its check wake-up lost", c, 4409)
}
