package hubtest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi/internal/testwait"
)

// The hub as a client sees it: calls over HTTP, a WebSocket and its frames,
// for the tests of every package that drives a started hub.

// Agent is a registered session: its id and its token.
type Agent struct{ ID, Token string }

// Call makes one HTTP call with cred as the bearer credential (none when
// empty) and body as JSON (a string or []byte goes as it is), and returns
// the status and the JSON answer (nil when the body is empty). hdr are
// extra header name and value pairs. An answer that is not JSON fails t.
func Call(t testing.TB, method, url, cred string, body any, hdr ...string) (int, map[string]any) {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("%s %s: answer is not JSON: %q", method, url, raw)
		}
	}
	return resp.StatusCode, out
}

// Register registers session id (surface claude_code) with h's API key and
// fails t unless it gets 201.
func (h *Hub) Register(t testing.TB, id string) Agent {
	t.Helper()
	st, resp := Call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": id, "surface": "claude_code"})
	if st != http.StatusCreated {
		t.Fatalf("register %s: %d %v", id, st, resp)
	}
	return Agent{ID: resp["session_id"].(string), Token: resp["token"].(string)}
}

// Send sends payload from from to session to, fails t unless it gets 200,
// and returns the answer.
func (h *Hub) Send(t testing.TB, from Agent, to string, payload any) map[string]any {
	t.Helper()
	st, resp := Call(t, "POST", h.URL+"/v1/signals", from.Token, map[string]any{"to_session": to, "payload": payload})
	if st != http.StatusOK {
		t.Fatalf("send %s→%s: %d %v", from.ID, to, st, resp)
	}
	return resp
}

// Dial attaches token's WebSocket (closed when the test ends), reads its
// first frame, fails t unless it is the welcome, and returns both.
func (h *Hub) Dial(t testing.TB, token string) (*websocket.Conn, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, h.WSURL(), &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.SetReadLimit(1 << 20)
	t.Cleanup(func() { c.CloseNow() })
	w := ReadFrame(t, c)
	if w["type"] != "welcome" {
		t.Fatalf("first frame is %v, want welcome", w)
	}
	return c, w
}

// ReadFrame reads one JSON frame from c within 10 s.
func ReadFrame(t testing.TB, c *websocket.Conn) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, data, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("read frame: %v", err)
	}
	var f map[string]any
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatalf("frame is not JSON: %q", data)
	}
	return f
}

// WaitFor polls cond until it holds, and fails t after 15 s.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testwait.For(t, what, 15*time.Second, cond)
}
