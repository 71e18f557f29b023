package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/internal/pgcluster"
	"github.com/marconihub/marconi/internal/testwait"
)

// TestAsyncFailoverDrainOnlyDeliversWhatFollows is
// TestAsyncFailoverDeliversWhatFollows for a recipient that reads by HTTP
// drain only (a codex surface, or any client while its WebSocket is down):
// it drains five signals, then five more that only the primary commits,
// then the primary crashes and the lagging standby is promoted, and the ten
// signals sent after it take the lost seqs again. The client asks after the
// highest seq it delivered, which would skip the new signals at the lost
// seqs; it names the history that seq came under, so the hub answers from
// the acknowledged seq under the new one, and every signal answered 200
// reaches it, once. An HTTP ack naming the old history after the promotion
// is refused history_changed and acknowledges nothing.
func TestAsyncFailoverDrainOnlyDeliversWhatFollows(t *testing.T) {
	c := pgcluster.New(t)
	h := startFailoverHubs(t, c.URL(), "hub-a")[0]
	led := newFailoverLedger()
	sender := dialAgent(t, h, "sender", "stateless", led)
	rcpt := dialDrainAgent(t, h, "rcpt", led)
	raw := registerRaw(t, h, "raw")

	n := 0
	send := func(to string) int64 { t.Helper(); return sendUntilOK(t, sender, to, led, &n) }
	toRaw := newFailoverLedger() // raw's signals are not drained by the client
	sendRaw := func() { t.Helper(); sendUntilOK(t, sender, "raw", toRaw, &n) }
	drainAll := func(what string) {
		t.Helper()
		testwait.ForNil(t, what, 60*time.Second, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, _ = rcpt.c.Drain(ctx) // refused while the store is away: drained again
			_, err := led.undelivered()
			return err
		})
	}
	for range 5 {
		send("rcpt")
	}
	sendRaw()
	drainAll("the first five drained")
	standby := c.StopStandby()
	var lost []int64
	for range 5 {
		lost = append(lost, send("rcpt"))
	}
	drainAll("the five the standby lacks drained")
	code, page := raw.call(t, "GET", "/v1/signals?after_seq=0", nil)
	old, _ := page["history"].(string)
	if code != http.StatusOK || old == "" {
		t.Fatalf("raw drain before the crash: %d %v, want 200 naming the store's history", code, page)
	}

	c.CrashPrimary()
	c.StartStandby(standby)
	c.Promote()
	var after []int64
	for range 10 {
		after = append(after, send("rcpt"))
	}
	t.Logf("seqs drained before the crash and lost with the primary: %v; answered after the promotion: %v", lost, after)
	if after[0] > lost[0] {
		t.Fatalf("the first send after the promotion took seq %d, after the lost %v: the standby was not behind, the test proves nothing", after[0], lost)
	}
	drainAll("every signal answered 200 drained, those at the lost seqs included")
	led.mu.Lock()
	for id, k := range led.got["rcpt"] {
		if k > 1 {
			t.Errorf("rcpt got signal %s %d times; the client delivers each id once", id, k)
		}
	}
	led.mu.Unlock()

	sendRaw()
	code, e := raw.call(t, "POST", "/v1/signals/ack", map[string]any{"up_to_seq": 100, "history": old})
	if code != http.StatusConflict || e["error"].(map[string]any)["code"] != "history_changed" {
		t.Fatalf("ack under the history before the promotion: %d %v, want 409 history_changed", code, e)
	}
	code, page = raw.call(t, "GET", "/v1/signals?after_seq=0", nil)
	if code != http.StatusOK || len(page["signals"].([]any)) != 2 || page["history"] == old {
		t.Fatalf("raw drain after the refused ack: %d %v, want both signals still pending, under the new history", code, page)
	}
}

// dialDrainAgent dials one agent on h that reads by drain only (codex).
func dialDrainAgent(t *testing.T, h *Main, id string, led *failoverLedger) *failoverAgent {
	t.Helper()
	a := &failoverAgent{id: id}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := bootstrap.DialPiggyback(ctx, bootstrap.Config{
		HubURL: h.URL(), APIKey: failoverKey, SessionID: id, Surface: "codex",
		OnSignal: func(s bootstrap.Signal) { led.delivered(id, s) },
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("dial %s: %v", id, err)
	}
	a.c = c
	t.Cleanup(func() { _ = c.Close() })
	return a
}

// rawSession is a session driven by plain HTTP calls.
type rawSession struct{ base, token string }

// registerRaw registers session id (codex) on h.
func registerRaw(t *testing.T, h *Main, id string) rawSession {
	t.Helper()
	s := rawSession{base: h.URL(), token: failoverKey}
	code, r := s.call(t, "POST", "/v1/sessions", map[string]any{"session_id": id, "surface": "codex"})
	if code != http.StatusCreated {
		t.Fatalf("register %s: %d %v", id, code, r)
	}
	s.token = r["token"].(string)
	return s
}

// call makes one call with the session's token and decodes its answer.
func (s rawSession) call(t *testing.T, method, path string, body any) (int, map[string]any) {
	t.Helper()
	var in io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		in = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.base+path, in)
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}
