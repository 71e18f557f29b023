package conns_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// sweepReads counts the store reads the pending sweep can cause: a batch
// read of session heads, and the per-connection reads of a session row and
// of pending signals (a reconcile, a woken writer's catch-up).
type sweepReads struct {
	sessionstore.Store
	heads, perConn atomic.Int64
}

func (s *sweepReads) SessionHeads(ctx context.Context, keys []sessionstore.Key, now time.Time) (map[sessionstore.Key]sessionstore.SessionHead, error) {
	s.heads.Add(1)
	return s.Store.SessionHeads(ctx, keys, now)
}

func (s *sweepReads) GetSession(ctx context.Context, k sessionstore.Key, now time.Time) (sessionstore.Session, error) {
	s.perConn.Add(1)
	return s.Store.GetSession(ctx, k, now)
}

func (s *sweepReads) PendingSignals(ctx context.Context, k sessionstore.Key, after int64, limit int) ([]sessionstore.Signal, error) {
	s.perConn.Add(1)
	return s.Store.PendingSignals(ctx, k, after, limit)
}

// sweeps reads marconi_pending_sweeps_total.
func sweeps(tb testing.TB, h *hubtest.Hub) int64 {
	tb.Helper()
	mfs, err := h.Registry.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "marconi_pending_sweeps_total" {
			return int64(mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
	tb.Fatal("no marconi_pending_sweeps_total")
	return 0
}

// attachIdle starts a hub sweeping every sweep over st, and attaches n
// idle sessions s0, s1, ... to it.
func attachIdle(tb testing.TB, st sessionstore.Store, sweep time.Duration, n int) (*hubtest.Hub, []*websocket.Conn) {
	tb.Helper()
	h := hubtest.Start(tb, hubtest.Options{Store: st, Config: hub.Config{
		PendingSweep: sweep, QuotaRegistrationsPerSecond: 1e9, MaxConnectionsPerAddress: n + 10,
	}})
	conns := make([]*websocket.Conn, n)
	for i := range conns {
		conns[i] = dial(tb, h, register(tb, h, fmt.Sprintf("s%d", i)))
	}
	for _, c := range conns {
		if f := read(tb, c); f["type"] != "welcome" {
			tb.Fatalf("first frame %v", f)
		}
	}
	return h, conns
}

// storeDirect stores a signal for session id without the hub: no wake-up
// goes with it, as with one lost on the bus.
func storeDirect(tb testing.TB, st sessionstore.Store, id string) {
	tb.Helper()
	_, _, err := st.AppendSignal(context.Background(), sessionstore.NewSignal{
		ID: uuid.NewString(), To: sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: id},
		FromSession: "elsewhere", Kind: "k", Payload: json.RawMessage(`1`), CreatedAt: time.Now(),
		Delivery: "queued", RouteState: "attached",
	}, time.Now())
	if err != nil {
		tb.Fatal(err)
	}
}

// The pending sweep of an instance whose connections have written every
// signal of their sessions reads no session row and no pending signal per
// connection: one read of session heads per sweep. A signal stored with no
// wake-up still reaches its connection by the next sweep, at the cost of
// that connection's catch-up alone, and a session deleted behind the hub's
// back still has its connection closed with 4410.
func TestSweepReadsOnlyWhatIsPending(t *testing.T) {
	const n = 50
	st := &sweepReads{Store: memstore.New()}
	h, conns := attachIdle(t, st, 10*time.Millisecond, n)

	// Idle: three sweeps in a row without a per-connection read (the
	// attaches' own catch-ups may still be running at first).
	var heads, swept int64
	// A sweep counts itself before its read: the sweeps are sampled before
	// the reads at the start and after them at the end, so every read
	// counted belongs to a sweep counted or to the one running at the start
	// (a Gather can take longer than a sweep period on a busy machine).
	waitFor(t, "three sweeps with no per-connection read", func() bool {
		s0 := sweeps(t, h)
		reads, h0 := st.perConn.Load(), st.heads.Load()
		waitFor(t, "three sweeps", func() bool { return sweeps(t, h) >= s0+3 })
		heads = st.heads.Load() - h0
		swept = sweeps(t, h) - s0
		return st.perConn.Load() == reads
	})
	if heads < 2 || heads > swept+1 {
		t.Fatalf("%d reads of session heads in %d sweeps, want one a sweep", heads, swept)
	}

	// A lost wake-up: healed by a sweep, with only its connection's reads.
	before := st.perConn.Load()
	storeDirect(t, st, "s7")
	if f := read(t, conns[7]); f["type"] != "signal" || f["seq"] != 1.0 {
		t.Fatalf("frame after a lost wake-up: %v", f)
	}
	s0 := sweeps(t, h)
	waitFor(t, "two more sweeps", func() bool { return sweeps(t, h) >= s0+2 })
	// The catch-up reads the signal, checks its incarnation, and reads again
	// if a sweep woke it meanwhile: a handful of reads, not n.
	if got := st.perConn.Load() - before; got > 6 {
		t.Fatalf("%d per-connection reads to heal one lost wake-up among %d connections", got, n)
	}

	// Deregistered without this instance hearing of it: closed by a sweep.
	if err := st.DeleteSession(context.Background(), sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "s3"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := conns[3].Read(ctx); websocket.CloseStatus(err) != 4410 {
		t.Fatalf("read on a deleted session's connection: %v, want a 4410 close", err)
	}
}
