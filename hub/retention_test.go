package hub_test

import (
	"testing"
	"time"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
)

// TestRetentionLoopPrunes: the background loop removes acknowledged signals
// past MARCONI_RETAIN_ACKED_SECONDS and expired sessions past
// MARCONI_RETAIN_EXPIRED_SECONDS, and keeps pending signals.
func TestRetentionLoopPrunes(t *testing.T) {
	clock := hubtest.NewClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	h := hubtest.Start(t, hubtest.Options{Now: clock.Now, Config: hub.Config{
		SessionTTL: 2 * time.Hour,
		Retention:  hub.Retention{Acked: time.Hour, Expired: time.Hour, Every: 5 * time.Millisecond},
	}})
	alice := register(t, h, "alice", "claude_code")
	bob := register(t, h, "bob", "claude_code")
	ghost := register(t, h, "ghost", "codex")
	for i := 0; i < 3; i++ {
		send(t, h, alice, "bob", i)
	}
	send(t, h, alice, "ghost", "never read")
	if st, r := call(t, "POST", h.URL+"/v1/signals/ack", bob.Token, map[string]any{"up_to_seq": 2}); st != 200 || r["acked"] != float64(2) {
		t.Fatalf("ack: %d %v", st, r)
	}
	_ = ghost

	// 90 minutes on: the acks are older than an hour; nobody has expired yet.
	clock.Advance(90 * time.Minute)
	call(t, "POST", h.URL+"/v1/heartbeat", bob.Token, nil)
	call(t, "POST", h.URL+"/v1/heartbeat", alice.Token, nil)
	key := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	waitFor(t, "the acked signals to be pruned", func() bool {
		return metric(t, h, "marconi_pruned_total", "kind", "signals") == 2
	})
	// The loop also samples the pending gauge: bob's seq 3 and ghost's one.
	waitFor(t, "the pending gauge", func() bool { return metric(t, h, "marconi_pending_signals") == 2 })
	pending, err := h.Store.PendingSignals(t.Context(), key, 0, 10)
	if err != nil || len(pending) != 1 || pending[0].Seq != 3 {
		t.Fatalf("bob's pending after prune: %v %v, want seq 3 kept", pending, err)
	}

	// ghost never proved life again: expired after 2 h, pruned an hour later.
	clock.Advance(2 * time.Hour)
	waitFor(t, "the expired session to be pruned", func() bool {
		return metric(t, h, "marconi_pruned_total", "kind", "sessions") >= 1
	})
	if n, err := h.Store.CountPending(t.Context(), sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "ghost"}); err != nil || n != 0 {
		t.Fatalf("ghost's signals after prune: %d %v", n, err)
	}
}
