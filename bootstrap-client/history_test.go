package bootstrap

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/marconihub/marconi"
)

// historyHub is a fake hub's store that fails over: history A holds
// signals a1..a3; after the failover, history B lost a3 and gave its seq
// to b3, then b4 came. Drains answer as the hub does: under another
// history than the client names, from the acknowledged seq (0 here), at
// most limit a page; acks under another history are refused 409.
type historyHub struct {
	mu      sync.Mutex
	current string
	limit   int
}

var (
	historyA = []Signal{{ID: "a1", Seq: 1}, {ID: "a2", Seq: 2}, {ID: "a3", Seq: 3}}
	historyB = []Signal{{ID: "a1", Seq: 1}, {ID: "a2", Seq: 2}, {ID: "b3", Seq: 3}, {ID: "b4", Seq: 4}}
)

func (s *historyHub) failover() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.current = "B"
}

func (s *historyHub) drain(after, history string) drainResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	sigs := historyA
	if s.current == "B" {
		sigs = historyB
	}
	res := drainResponse{History: s.current, Signals: []Signal{}}
	n := parseSeq(after)
	if history != "" && history != s.current {
		n, res.HistoryChanged = 0, true
	}
	res.NextAfterSeq = n
	for _, sig := range sigs {
		if sig.Seq > n && (s.limit == 0 || len(res.Signals) < s.limit) {
			res.Signals = append(res.Signals, sig)
			res.NextAfterSeq = sig.Seq
		}
	}
	return res
}

func (s *historyHub) ack(a ackRequest) (int, any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.History != "" && a.History != s.current {
		return 409, map[string]any{"error": map[string]any{"code": marconi.CodeHistoryChanged, "message": "another history"}}
	}
	return 200, map[string]any{"acked": 1}
}

func parseSeq(s string) int64 {
	var n int64
	for _, c := range s {
		n = n*10 + int64(c-'0')
	}
	return n
}

// dialHistoryHub starts a drain-only client (codex) on a fake hub whose
// store is st.
func dialHistoryHub(t *testing.T, st *historyHub, cfg Config) (*fakeHub, *Client, func() []string) {
	t.Helper()
	h := newFakeHub(t)
	t.Cleanup(h.close)
	h.drainAnswer, h.ackAnswer = st.drain, st.ack
	var mu sync.Mutex
	var got []string
	cfg.OnSignal = func(s Signal) { mu.Lock(); got = append(got, s.ID); mu.Unlock() }
	cfg.HubURL, cfg.APIKey, cfg.Surface = h.srv.URL, "key", "codex"
	cfg.AckInterval = time.Millisecond
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := DialPiggyback(ctx, cfg)
	if err != nil {
		t.Fatalf("DialPiggyback: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return h, c, func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(got) }
}

// drainUntil drains until the handler has seen want.
func drainUntil(t *testing.T, c *Client, got func() []string, want string) {
	t.Helper()
	eventually(t, "the handler to see "+want, func() bool {
		if _, err := c.Drain(context.Background()); err != nil {
			t.Fatalf("Drain: %v", err)
		}
		return strings.Join(got(), ",") == want
	})
}

func (h *fakeHub) calls() (drains, acks []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.drains), slices.Clone(h.ackCalls)
}

// TestFakeDrainFollowsTheHistory: a client that drains names the history
// its seqs came under; when the hub answers under another (its store
// failed over and gave seq 3 to another signal), the client delivers the
// new signals at seqs it saw (b3), not the ones it delivered (a2), and
// drains on from the answer's next_after_seq under the new history, even
// when a page held only signals it had delivered. Its acks name the
// history too.
func TestFakeDrainFollowsTheHistory(t *testing.T) {
	st := &historyHub{current: "A"}
	h, c, got := dialHistoryHub(t, st, Config{})
	drainUntil(t, c, got, "a1,a2,a3")
	eventually(t, "the ack of a3 under A", func() bool { _, acks := h.calls(); return slices.Contains(acks, "3@A") })

	st.failover()
	st.mu.Lock()
	st.limit = 2 // the first page under B holds a1 and a2 alone: delivered already
	st.mu.Unlock()
	drainUntil(t, c, got, "a1,a2,a3,b3,b4")
	drains, acks := h.calls()
	if !slices.Contains(drains, "3@A") || !slices.Contains(drains, "2@B") || slices.Contains(drains, "3@B") {
		t.Fatalf("drains %v: want one after 3 under A (answered from 0 under B), then after 2 under B (the page's next_after_seq), never after 3 under B", drains)
	}
	eventually(t, "the ack of b4 under B", func() bool { _, acks = h.calls(); return slices.Contains(acks, "4@B") })
}

// TestFakeAckUnderAnOldHistoryIsDroppedAndTheSignalsComeAgain: with
// DeferAck (the MCP bridge's codex mode), the application acknowledges a
// signal it held across a failover; the hub refuses it history_changed:
// Ack returns nil (nothing to do but drain), the next drain, under the old
// history, starts over under the new one and delivers what took the seqs,
// and its ack, under the new history, is taken.
func TestFakeAckUnderAnOldHistoryIsDroppedAndTheSignalsComeAgain(t *testing.T) {
	st := &historyHub{current: "A"}
	h, c, got := dialHistoryHub(t, st, Config{DeferAck: true})
	drainUntil(t, c, got, "a1,a2,a3")

	st.failover()
	if err := c.Ack(context.Background(), historyA[2]); err != nil {
		t.Fatalf("Ack of a3 after the failover: %v, want nil (refused history_changed: nothing to do but drain)", err)
	}
	if _, acks := h.calls(); !slices.Equal(acks, []string{"3@A"}) {
		t.Fatalf("acks %v, want one of 3 under A", acks)
	}
	drainUntil(t, c, got, "a1,a2,a3,b3,b4")
	if err := c.Ack(context.Background(), historyB[3]); err != nil {
		t.Fatalf("Ack of b4: %v", err)
	}
	eventually(t, "the ack of b4 under B", func() bool { _, acks := h.calls(); return slices.Contains(acks, "4@B") })
}
