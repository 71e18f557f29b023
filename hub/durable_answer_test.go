package hub_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// failingPending fails PendingSignals while fail is set.
type failingPending struct {
	sessionstore.Store
	fail atomic.Bool
}

func (f *failingPending) PendingSignals(ctx context.Context, k sessionstore.Key, after int64, limit int) ([]sessionstore.Signal, error) {
	if f.fail.Load() {
		return nil, sessionstore.ErrUnavailable
	}
	return f.Store.PendingSignals(ctx, k, after, limit)
}

// TestSendAnswers200OnceDurable: once the signal is stored, a failure to
// read the sender's piggyback must not fail the send (a client would retry
// and store it twice); pending is just empty.
func TestSendAnswers200OnceDurable(t *testing.T) {
	st := &failingPending{Store: memstore.New()}
	h := hubtest.Start(t, hubtest.Options{Store: st})
	alice := register(t, h, "alice", "codex")
	register(t, h, "bob", "codex")
	send(t, h, register(t, h, "carol", "codex"), "alice", "waiting for alice")

	st.fail.Store(true)
	r := send(t, h, alice, "bob", "hello")
	if p, ok := r["pending"].([]any); !ok || len(p) != 0 {
		t.Fatalf("pending = %v, want [] when it cannot be read", r["pending"])
	}
	st.fail.Store(false)
	if n, err := st.CountPending(t.Context(), sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}); err != nil || n != 1 {
		t.Fatalf("bob has %d pending (%v), want the one signal, stored once", n, err)
	}
	// And the piggyback comes back with the store.
	r = send(t, h, alice, "bob", "again")
	if p, _ := r["pending"].([]any); len(p) != 1 {
		t.Fatalf("pending after recovery = %v, want alice's one signal", r["pending"])
	}
}
