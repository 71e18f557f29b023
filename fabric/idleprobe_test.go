package fabric

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/testwait"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// countingProber is a fakeProber that counts its calls (each one a store
// statement with pgstore.Bus). Its live set must not change while Run runs.
type countingProber struct {
	fakeProber
	calls atomic.Int64
}

func (p *countingProber) ConnectedInstances(ctx context.Context) (map[string]time.Time, string, error) {
	p.calls.Add(1)
	return p.fakeProber.ConnectedInstances(ctx)
}

// beatCounter counts this instance's heartbeats, so a test can tell how many
// of Run's ticks went by without reading a clock.
type beatCounter struct {
	sessionstore.Store
	beats  atomic.Int64
	counts atomic.Int64
}

// Counts counts the reads of the cluster-wide counters.
func (s *beatCounter) Counts(ctx context.Context) (sessionstore.Counts, error) {
	s.counts.Add(1)
	return s.Store.Counts(ctx)
}

func (s *beatCounter) HeartbeatInstance(ctx context.Context, in sessionstore.Instance) error {
	s.beats.Add(1)
	return s.Store.HeartbeatInstance(ctx, in)
}

func newCountedFabric(t *testing.T, st sessionstore.Store, p Prober, cfg Config) *Fabric {
	t.Helper()
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg.InstanceID, cfg.PublicURL = "a", "http://a"
	f, err := New(cfg, Deps{Store: st, Prober: p, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// An idle instance's ticks cost no probe once every other process has been
// seen connected; the first decision after that probes before it reads, and
// a process not yet seen connected is probed for at each tick.
func TestTicksOfAnIdleInstanceProbeOnlyForTheUnseen(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	p := &countingProber{fakeProber: fakeProber{st: st, live: map[string]bool{"b": true}}}
	a := newCountedFabric(t, st, p, Config{ProbeEvery: time.Hour})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := st.HeartbeatInstance(ctx, sessionstore.Instance{ID: "b", URL: "http://b", StartedAt: now, LastHeartbeatAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := a.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if got := p.calls.Load(); got != 1 {
		t.Fatalf("first tick with b not yet seen connected: %d probes, want 1", got)
	}
	for range 5 {
		if err := a.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := p.calls.Load(); got != 1 {
		t.Fatalf("five idle ticks after b was seen connected: %d probes in all, want still 1", got)
	}

	// A decision wants a fresh view: with a probe tried within ProbeEvery it
	// reads the view as it is, and the next tick probes for it.
	if !a.Members.Healthy(ctx, "b") {
		t.Fatal("b unhealthy")
	}
	if err := a.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if got := p.calls.Load(); got != 2 {
		t.Fatalf("a tick after a decision read the view: %d probes in all, want 2", got)
	}

	// A restarted b (a new StartedAt, not yet connected) is probed for at
	// every tick until it is seen connected.
	delete(p.live, "b")
	now = now.Add(time.Second)
	if err := st.HeartbeatInstance(ctx, sessionstore.Instance{ID: "b", URL: "http://b", StartedAt: now, LastHeartbeatAt: now}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := a.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := p.calls.Load(); got != 4 {
		t.Fatalf("two ticks with b's new process not yet connected: %d probes in all, want 4", got)
	}
}

// Run's probe loop asks the store nothing while no decision reads the view,
// and the first decision after such a pause probes before it reads: a
// process killed meanwhile is not judged from a stale view.
func TestRunProbesOnlyOnDemand(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	st := &beatCounter{Store: memstore.New()}
	p := &countingProber{fakeProber: fakeProber{st: st, live: map[string]bool{"b": true}}}
	a := newCountedFabric(t, st, p, Config{HeartbeatEvery: 2 * time.Millisecond, ProbeEvery: time.Millisecond})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := st.HeartbeatInstance(ctx, sessionstore.Instance{ID: "b", URL: "http://b", StartedAt: now, LastHeartbeatAt: now}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.Run(ctx)
	}()
	defer func() { cancel(); <-done }()

	// b's own heartbeat above is one; 30 more of a's are at least 60 ms of
	// Run, some 60 ticks of the probe loop.
	testwait.For(t, "30 ticks of a", 10*time.Second, func() bool { return st.beats.Load() >= 31 })
	// The first tick probes (b is not yet seen connected); the loop may
	// have probed once too, between the tick's refresh and its probe.
	if got := p.calls.Load(); got > 2 {
		t.Fatalf("%d probes over 30 idle heartbeats, want at most 2 (b seen connected once)", got)
	}

	before := p.calls.Load()
	if !a.Members.Healthy(ctx, "b") {
		t.Fatal("b unhealthy")
	}
	if got := p.calls.Load(); got < before+1 {
		t.Fatal("a decision after an idle pause read the view without a probe")
	}
	testwait.For(t, "the probe loop to resume on demand", 10*time.Second, func() bool { return p.calls.Load() > before+1 })
}

// A tick reads the cluster-wide counters only when the adaptive gate can
// roll back (MARCONI_ADAPTIVE_ROLLBACK_AFTER above 0, not yet rolled back).
func TestTickReadsCountersOnlyWhenTheGateCanRollBack(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		after int64
		want  int64
	}{{0, 0}, {1, 3}} {
		st := &beatCounter{Store: memstore.New()}
		a := newCountedFabric(t, st, nil, Config{Placement: PlacementConfig{RollbackAfter: tc.after}})
		for range 3 {
			if err := a.Tick(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if got := st.counts.Load(); got != tc.want {
			t.Errorf("rollback after %d: three ticks read the counters %d times, want %d", tc.after, got, tc.want)
		}
	}
}
