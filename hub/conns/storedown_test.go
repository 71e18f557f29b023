package conns_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// pendingDown fails every read of pending signals while down is set, as a
// store that is unreachable or failing over does.
type pendingDown struct {
	sessionstore.Store
	down   atomic.Bool
	failed atomic.Int64
}

func (s *pendingDown) PendingSignals(ctx context.Context, k sessionstore.Key, after int64, limit int) ([]sessionstore.Signal, error) {
	if s.down.Load() {
		s.failed.Add(1)
		return nil, sessionstore.ErrUnavailable
	}
	return s.Store.PendingSignals(ctx, k, after, limit)
}

// A catch-up that cannot read the store leaves the connection open: the
// signals are durable, and the next wake-up reads again once the store
// answers. Closing it would send every receiving client of an outage or a
// failover into a redial at once.
func TestCatchUpOnAStoreDownKeepsTheConnection(t *testing.T) {
	st := &pendingDown{Store: memstore.New()}
	h, conns := attachIdle(t, st, time.Hour, 1)
	k := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "s0"}

	st.down.Store(true)
	h.Server.WakeLocal(sessionstore.Wake{Key: k}) // a bare wake-up: the writer reads the store
	waitFor(t, "the woken writer's read to fail", func() bool { return st.failed.Load() >= 1 })
	st.down.Store(false)

	storeDirect(t, st, "s0")
	h.Server.WakeLocal(sessionstore.Wake{Key: k})
	if f := read(t, conns[0]); f["type"] != "signal" || f["seq"] != 1.0 {
		t.Fatalf("frame after the store came back: %v, want signal 1 on the same connection", f)
	}
}

// The replay that follows the welcome is a catch-up like the others: a
// store that cannot serve it leaves the new connection open, and the
// signals come with the next wake-up.
func TestReplayOnAStoreDownKeepsTheConnection(t *testing.T) {
	st := &pendingDown{Store: memstore.New()}
	h, _ := attachIdle(t, st, time.Hour, 0)
	k := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "late"}
	tok := register(t, h, k.SessionID)
	storeDirect(t, st, k.SessionID)

	st.down.Store(true)
	c := dial(t, h, tok)
	if f := read(t, c); f["type"] != "welcome" {
		t.Fatalf("first frame %v, want the welcome", f)
	}
	waitFor(t, "the replay's read to fail", func() bool { return st.failed.Load() >= 1 })
	st.down.Store(false)

	h.Server.WakeLocal(sessionstore.Wake{Key: k})
	if f := read(t, c); f["type"] != "signal" || f["seq"] != 1.0 {
		t.Fatalf("frame after the store came back: %v, want signal 1 on the same connection", f)
	}
}
