package conns_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/testwait"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// countingStore counts the ack writes that reach the store.
type countingStore struct {
	sessionstore.Store
	acks atomic.Int64
}

func (s *countingStore) AckSignals(ctx context.Context, k sessionstore.Key, upTo int64, at time.Time) (int, error) {
	s.acks.Add(1)
	return s.Store.AckSignals(ctx, k, upTo, at)
}

func (s *countingStore) AckSignalsAs(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, upTo int64, at time.Time) (int, error) {
	s.acks.Add(1)
	return s.Store.AckSignalsAs(ctx, k, h, upTo, at)
}

// post does one JSON call and decodes the answer.
func post(t testing.TB, url, cred string, body any) map[string]any {
	t.Helper()
	raw, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", url, bytes.NewReader(raw))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+cred)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode >= 300 {
		t.Fatalf("POST %s: %d %v %v", url, resp.StatusCode, out, err)
	}
	return out
}

func register(t testing.TB, h *hubtest.Hub, id string) string {
	t.Helper()
	return post(t, h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": id, "surface": "claude_code"})["token"].(string)
}

func dial(t testing.TB, h *hubtest.Hub, token string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, h.WSURL(), &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

func read(t testing.TB, c *websocket.Conn) map[string]any {
	t.Helper()
	return hubtest.ReadFrame(t, c)
}

func write(t *testing.T, c *websocket.Conn, v any) {
	t.Helper()
	b, _ := json.Marshal(v)
	if err := c.Write(context.Background(), websocket.MessageText, b); err != nil {
		t.Fatalf("write: %v", err)
	}
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	hubtest.WaitFor(t, what, cond)
}

func pending(t *testing.T, st sessionstore.Store, id string) int {
	t.Helper()
	n, err := st.CountPending(context.Background(), sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: id})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// ackFlood starts a hub, sends n signals to bob, attaches him, reads them
// all and acks each one with its own frame, newest last.
func ackFlood(t *testing.T, cfg hub.Config, n int) (*hubtest.Hub, *countingStore, *websocket.Conn) {
	st := &countingStore{Store: memstore.New()}
	cfg.WSFramesPerSecond = 1e6 // the flood is the point here, not the frame rate
	h := hubtest.Start(t, hubtest.Options{Store: st, Config: cfg})
	bob := register(t, h, "bob")
	alice := register(t, h, "alice")
	for i := range n {
		post(t, h.URL+"/v1/signals", alice, map[string]any{"to_session": "bob", "kind": "k", "payload": i})
	}
	c := dial(t, h, bob)
	if w := read(t, c); w["type"] != "welcome" {
		t.Fatalf("first frame %v", w)
	}
	for range n {
		read(t, c)
	}
	for seq := 1; seq <= n; seq++ {
		write(t, c, map[string]any{"type": "ack", "up_to_seq": seq})
	}
	return h, st, c
}

// Issue 12.6: acks are coalesced per connection and an ack the hub read is
// durable when the connection ends, however long the interval.
func TestAckFloodIsOneWriteAndFlushedOnClose(t *testing.T) {
	const n = 300
	h, st, c := ackFlood(t, hub.Config{WSAckInterval: time.Hour}, n)
	// A frame after the acks that the hub answers: once it has, it has read them all.
	write(t, c, map[string]any{"type": "nonsense"})
	if f := read(t, c); f["type"] != "error" {
		t.Fatalf("answer to an unknown frame: %v", f)
	}
	if got := st.acks.Load(); got != 0 {
		t.Fatalf("%d ack writes within the interval, want 0", got)
	}
	if p := pending(t, st, "bob"); p != n {
		t.Fatalf("%d pending before close, want %d (the interval has not passed)", p, n)
	}
	_ = c.Close(websocket.StatusNormalClosure, "done")
	waitFor(t, "the ack to be flushed", func() bool { return pending(t, st, "bob") == 0 })
	if got := st.acks.Load(); got != 1 {
		t.Fatalf("%d ack writes for a flood of %d acks, want 1", got, n)
	}
	h.Close()
}

// Within a connection, an ack flood costs at most one write per interval.
func TestAckFloodCostsBoundedWrites(t *testing.T) {
	const n, interval = 300, 20 * time.Millisecond
	start := time.Now()
	_, st, _ := ackFlood(t, hub.Config{WSAckInterval: interval}, n)
	waitFor(t, "every ack written", func() bool { return pending(t, st, "bob") == 0 })
	elapsed := time.Since(start)
	if got, most := st.acks.Load(), int64(elapsed/interval)+1; got > most || got >= n {
		t.Fatalf("%d ack writes for %d acks in %v, want at most %d (one per %v)", got, n, elapsed, most, interval)
	}
}

// Past MARCONI_WS_FRAMES_PER_SECOND (burst twice it) the hub closes the
// connection with 1008 and a reason that names the quota.
func TestFrameRateClosesWith1008(t *testing.T) {
	frozen := time.Now()
	h := hubtest.Start(t, hubtest.Options{Now: func() time.Time { return frozen }, Config: hub.Config{WSFramesPerSecond: 5}})
	c := dial(t, h, register(t, h, "bob"))
	read(t, c) // the welcome

	for range 9 { // the burst is twice the rate: 10 frames
		write(t, c, map[string]any{"type": "ping"})
	}
	// The 10th is still read: an unknown frame is answered.
	write(t, c, map[string]any{"type": "nonsense"})
	if f := read(t, c); f["type"] != "error" {
		t.Fatalf("answer to the 10th frame: %v", f)
	}
	write(t, c, map[string]any{"type": "ping"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, err := c.Read(ctx)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, "frames_per_second") {
		t.Fatalf("the 11th frame with the clock frozen: %v, want close 1008 naming frames_per_second", err)
	}
	if got := metric(t, h, "marconi_ws_disconnects_total", "reason", "quota_exceeded"); got != 1 {
		t.Fatalf("disconnects{quota_exceeded} = %v, want 1", got)
	}
	if got := metric(t, h, "marconi_quota_refusals_total", "quota", "frames_per_second"); got != 1 {
		t.Fatalf("quota_refusals{frames_per_second} = %v, want 1 (the hook is wired)", got)
	}
}

// metric reads the counter name{label="value"}; label "" reads a counter
// without labels.
func metric(t *testing.T, h *hubtest.Hub, name, label, value string) float64 {
	t.Helper()
	mfs, err := h.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" && len(m.GetLabel()) == 0 {
				return m.GetCounter().GetValue()
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}

// An idle attached session costs one goroutine, its handler's (the reader):
// the writer runs only while there is something to write, and keepalive is
// a timer, not a goroutine.
func TestIdleConnectionIsOneGoroutine(t *testing.T) {
	const n, slack = 100, 10 // slack: HTTP keep-alive connections of the test's calls
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{QuotaRegistrationsPerSecond: 1e6}})
	alice := register(t, h, "alice")
	tokens := make([]string, n)
	for i := range n {
		tokens[i] = register(t, h, fmt.Sprintf("s%d", i))
	}
	before := runtime.NumGoroutine()
	conns := make([]*websocket.Conn, n)
	for i, tok := range tokens {
		conns[i] = dial(t, h, tok)
		read(t, conns[i]) // the welcome
	}
	// A live push wakes a writer, which ends once it has written.
	post(t, h.URL+"/v1/signals", alice, map[string]any{"to_session": "s0", "kind": "k", "payload": 1})
	if f := read(t, conns[0]); f["type"] != "signal" {
		t.Fatalf("pushed frame %v", f)
	}
	// The client side of a coder/websocket connection that is not being
	// read runs no goroutine, so what is left per connection is the hub's.
	var got int
	testwait.ForNil(t, "about one goroutine per idle connection", 10*time.Second, func() error {
		if got = runtime.NumGoroutine() - before; got > n+slack {
			return fmt.Errorf("%d goroutines for %d idle connections", got, n)
		}
		return nil
	})
	if got < n-slack {
		t.Fatalf("%d goroutines for %d connections: the measure is broken", got, n)
	}
}

// TestAckOfWrongTypeIsInvalidField: an ack whose up_to_seq is not a whole
// number is the field's fault, invalid_field, as the same mistake is over
// HTTP; a frame that is not JSON at all is invalid_json.
func TestAckOfWrongTypeIsInvalidField(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	c := dial(t, h, register(t, h, "bob"))
	read(t, c) // the welcome
	for _, tc := range []struct{ frame, code string }{
		{`{"type":"ack","up_to_seq":"3"}`, "invalid_field"},
		{`{"type":"ack","up_to_seq":1.5}`, "invalid_field"},
		{`{"type":"ack","up_to_seq":`, "invalid_json"},
	} {
		if err := c.Write(context.Background(), websocket.MessageText, []byte(tc.frame)); err != nil {
			t.Fatal(err)
		}
		if f := read(t, c); f["type"] != "error" || f["code"] != tc.code {
			t.Errorf("answer to %s: %v, want an error frame %s", tc.frame, f, tc.code)
		}
	}
}
