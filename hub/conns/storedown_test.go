package conns_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/testwait"
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

// rowsDown fails every read of session rows (a connection's own, and the
// batch reads of the expiry check and the sweep) while down is set.
type rowsDown struct {
	sessionstore.Store
	down                   atomic.Bool
	getFailed, headsFailed atomic.Int64
}

func (s *rowsDown) GetSession(ctx context.Context, k sessionstore.Key, now time.Time) (sessionstore.Session, error) {
	if s.down.Load() {
		s.getFailed.Add(1)
		return sessionstore.Session{}, sessionstore.ErrUnavailable
	}
	return s.Store.GetSession(ctx, k, now)
}

func (s *rowsDown) SessionHeads(ctx context.Context, keys []sessionstore.Key, now time.Time) (map[sessionstore.Key]sessionstore.SessionHead, error) {
	if s.down.Load() {
		s.headsFailed.Add(1)
		return nil, sessionstore.ErrUnavailable
	}
	return s.Store.SessionHeads(ctx, keys, now)
}

// A check wake-up whose read of the row fails is not dropped: the expiry
// check reads the row at its next run, and at each run until the store
// answers (not the writer in a loop), then closes the connection as the
// row calls for, with the pending sweep off.
func TestCheckWakeUpOnAStoreDownIsRetried(t *testing.T) {
	bob := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	for _, store := range stores {
		t.Run(store, func(t *testing.T) {
			st := &rowsDown{Store: openStore(t, store)}
			bus := handBus{onWake: make(chan func(sessionstore.Wake), 1)}
			h := hubtest.Start(t, hubtest.Options{Store: st, Bus: bus, Config: hub.Config{
				PendingSweep: noSweep, ExpiryCheck: 10 * time.Millisecond,
			}})
			onWake := testwait.Receive(t, "the bus listener", 10*time.Second, bus.onWake)
			c := dial(t, h, register(t, h, "bob"))
			if f := read(t, c); f["type"] != "welcome" {
				t.Fatalf("first frame %v", f)
			}

			// Another instance resumes bob with another token, while this
			// one cannot read the store.
			now := time.Now()
			sess, err := st.Store.GetSession(context.Background(), bob, now)
			if err == nil {
				_, err = st.ResumeSession(context.Background(), bob, sess.TokenHash, []byte("another token's hash"),
					sessionstore.Touch{SeenAt: now, ExpiresAt: now.Add(time.Hour)}, now)
			}
			if err != nil {
				t.Fatal(err)
			}
			st.down.Store(true)
			onWake(sessionstore.Wake{Key: bob, Seq: fabric.CheckSeq})
			waitFor(t, "the check's read to fail", func() bool { return st.getFailed.Load() >= 1 })
			waitFor(t, "three expiry checks to fail", func() bool { return st.headsFailed.Load() >= 3 })
			if n := st.getFailed.Load(); n != 1 {
				t.Fatalf("%d reads of bob's row by his writer, want 1: the retries are the expiry check's", n)
			}
			st.down.Store(false)

			if got := closeCode(t, c); got != 4409 {
				t.Fatalf("closed with %d, want 4409", got)
			}
		})
	}
}
