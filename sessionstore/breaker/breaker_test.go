package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/marconihub/marconi/internal/testwait"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/breaker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pingTimesOut has only Ping, which times out; any other call that reaches
// it panics (nil embedded interface).
type pingTimesOut struct{ sessionstore.Store }

func (pingTimesOut) Ping(context.Context) error {
	return fmt.Errorf("ping: %w: %w", sessionstore.ErrUnavailable, context.DeadlineExceeded)
}

// TestEveryMethodIsGuarded calls every method of sessionstore.Store, found
// by reflection, on an open breaker: each must answer ErrOpen without
// reaching the wrapped store. A method added to the interface but not
// written out in methods.go reaches it (through the embedded interface)
// and fails here.
func TestEveryMethodIsGuarded(t *testing.T) {
	b, err := breaker.New(pingTimesOut{}, breaker.Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Ping(context.Background()); err == nil || !b.Open() {
		t.Fatalf("a timed-out ping: %v, open %v; want an open breaker", err, b.Open())
	}
	iface := reflect.TypeFor[sessionstore.Store]()
	v := reflect.ValueOf(b)
	for i := range iface.NumMethod() {
		name := iface.Method(i).Name
		if name == "Close" {
			continue // always reaches the store
		}
		m := v.MethodByName(name)
		args := make([]reflect.Value, m.Type().NumIn())
		for j := range args {
			args[j] = reflect.Zero(m.Type().In(j))
		}
		args[0] = reflect.ValueOf(context.Background())
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s reached the wrapped store through an open breaker: write it out in methods.go", name)
				}
			}()
			out := m.Call(args)
			err, _ := out[len(out)-1].Interface().(error)
			if !errors.Is(err, breaker.ErrOpen) || !errors.Is(err, sessionstore.ErrUnavailable) {
				t.Errorf("%s on an open breaker returned %v, want ErrOpen (ErrUnavailable)", name, err)
			}
		}()
	}
}

// value reads one unlabelled series from reg.
func value(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.Gauge != nil {
				return m.Gauge.GetValue()
			}
			return m.Counter.GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// fakeStore is a store that can be down (every call waits for its context
// and fails as a partition does) or up. It counts the calls that reach it.
type fakeStore struct {
	sessionstore.Store
	down  atomic.Bool
	calls atomic.Int64
}

func (f *fakeStore) wait(ctx context.Context) error {
	f.calls.Add(1)
	if !f.down.Load() {
		return nil
	}
	<-ctx.Done()
	return fmt.Errorf("fake: %w: %w", sessionstore.ErrUnavailable, ctx.Err())
}

func (f *fakeStore) Ping(ctx context.Context) error { return f.wait(ctx) }

func (f *fakeStore) GetSession(ctx context.Context, k sessionstore.Key, _ time.Time) (sessionstore.Session, error) {
	if err := f.wait(ctx); err != nil {
		return sessionstore.Session{}, err
	}
	if k.SessionID == "" {
		return sessionstore.Session{}, sessionstore.ErrNotFound
	}
	return sessionstore.Session{Key: k}, nil
}

func (f *fakeStore) Close() error { return nil }

func run(t *testing.T, b *breaker.Store) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = b.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func within(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// TestOpensOnTimeoutFailsFastAndRecovers: one timed-out call opens the
// breaker; later calls fail at once without reaching the store; a probe
// that succeeds closes it; the metrics say so.
func TestOpensOnTimeoutFailsFastAndRecovers(t *testing.T) {
	f := &fakeStore{}
	reg := prometheus.NewRegistry()
	b, err := breaker.New(f, breaker.Config{ProbeEvery: 10 * time.Millisecond, ProbeTimeout: 20 * time.Millisecond}, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, b)
	k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "s"}
	if _, err := b.GetSession(context.Background(), k, time.Now()); err != nil {
		t.Fatalf("store up: %v", err)
	}

	// Not-found and a caller's own cancellation say nothing about the store.
	if _, err := b.GetSession(context.Background(), sessionstore.Key{}, time.Now()); !errors.Is(err, sessionstore.ErrNotFound) || b.Open() {
		t.Fatalf("not found: %v, open %v", err, b.Open())
	}
	f.down.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.GetSession(ctx, k, time.Now()); err == nil || b.Open() {
		t.Fatalf("cancelled call: %v, open %v (a caller's cancel must not open it)", err, b.Open())
	}

	ctx, cancel = within(30 * time.Millisecond)
	_, err = b.GetSession(ctx, k, time.Now())
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || !b.Open() {
		t.Fatalf("timed-out call: %v, open %v; want the timeout and an open breaker", err, b.Open())
	}
	before := f.calls.Load()
	for range 20 {
		ctx, cancel := within(time.Hour) // an open breaker never waits for it
		_, err := b.GetSession(ctx, k, time.Now())
		cancel()
		if !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("call on an open breaker: %v, want ErrOpen", err)
		}
	}
	// Only the probe loop reaches the store now: one probe at a time, each
	// waiting out its 20 ms timeout, so far fewer than the 20 refused calls.
	if reached := f.calls.Load() - before; reached >= 20 {
		t.Fatalf("%d calls reached the down store while the breaker was open", reached)
	}
	if got := value(t, reg, "marconi_store_breaker_rejections_total"); got != 20 {
		t.Fatalf("rejections = %v, want 20", got)
	}
	if value(t, reg, "marconi_store_breaker_open") != 1 || value(t, reg, "marconi_store_breaker_trips_total") != 1 {
		t.Fatal("open gauge or trips counter wrong while open")
	}

	f.down.Store(false)
	testwait.For(t, "the breaker to close once the store came back", 10*time.Second, func() bool { return !b.Open() })
	if _, err := b.GetSession(context.Background(), k, time.Now()); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
	if value(t, reg, "marconi_store_breaker_open") != 0 {
		t.Fatal("open gauge still 1 after recovery")
	}
}

// diagnosing is a store whose Ping fails and that names the failure.
type diagnosing struct{ sessionstore.Store }

var errRefused = fmt.Errorf("connect: %w: connection refused", sessionstore.ErrUnavailable)

func (diagnosing) Ping(context.Context) error { return errRefused }

func (diagnosing) Diagnose(err error) string {
	if errors.Is(err, errRefused) {
		return "connection refused at db:5432"
	}
	return "unknown: " + err.Error()
}

func (diagnosing) Classify(err error) string {
	if errors.Is(err, errRefused) {
		return "connection refused"
	}
	return "unclassified"
}

// TestDiagnoseNamesWhatOpenedTheBreaker: while the breaker is open, calls
// fail with ErrOpen, yet an operator is told the wrapped store's diagnosis
// of what opened it, not "breaker open".
func TestDiagnoseNamesWhatOpenedTheBreaker(t *testing.T) {
	b, err := breaker.New(diagnosing{}, breaker.Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Ping(context.Background()); b.Diagnose(err) != "connection refused at db:5432" || !b.Open() {
		t.Fatalf("first failure: %q, open %v", b.Diagnose(err), b.Open())
	}
	err = b.Ping(context.Background())
	if !errors.Is(err, breaker.ErrOpen) {
		t.Fatalf("second call: %v, want ErrOpen", err)
	}
	if got := b.Diagnose(err); got != "connection refused at db:5432" {
		t.Errorf("Diagnose(ErrOpen) = %q, want the cause that opened the breaker", got)
	}
	if got := b.Classify(err); got != "connection refused" {
		t.Errorf("Classify(ErrOpen) = %q, want the class of the cause that opened the breaker", got)
	}
	plain, _ := breaker.New(pingTimesOut{}, breaker.Config{}, nil, nil)
	if err := plain.Ping(context.Background()); plain.Diagnose(err) != err.Error() {
		t.Errorf("a store that cannot diagnose: %q", plain.Diagnose(err))
	}
	if got := plain.Classify(breaker.ErrOpen); got != "" {
		t.Errorf("a store that cannot classify: %q, want \"\"", got)
	}
}

// slowPrune is a store whose Prune works until its caller's budget ends, as
// a long backlog does (every batch answered), or whose batch times out on
// its own, as in a partition.
type slowPrune struct {
	sessionstore.Store
	ownTimeout bool
}

func (s slowPrune) Prune(ctx context.Context, _, _ time.Time) (int, int, error) {
	if s.ownTimeout {
		return 3, 0, fmt.Errorf("prune batch: %w: %w", sessionstore.ErrUnavailable, context.DeadlineExceeded)
	}
	<-ctx.Done()
	return 500, 2, fmt.Errorf("prune: %w", ctx.Err())
}

// TestPruneOutOfBudgetKeepsBreakerClosed: the retention loop's own deadline
// ending a long prune says the backlog is long, not that the store is gone:
// the breaker stays closed (before, it opened and every call answered 503
// until the next probe). A batch that times out by itself still opens it.
func TestPruneOutOfBudgetKeepsBreakerClosed(t *testing.T) {
	b, err := breaker.New(slowPrune{}, breaker.Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := within(20 * time.Millisecond)
	sigs, _, err := b.Prune(ctx, time.Now(), time.Now())
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || sigs != 500 || b.Open() {
		t.Fatalf("prune out of budget: %d, %v, open %v; want its counts, the deadline, a closed breaker", sigs, err, b.Open())
	}

	b, err = breaker.New(slowPrune{ownTimeout: true}, breaker.Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Prune(context.Background(), time.Now(), time.Now()); err == nil || !b.Open() {
		t.Fatalf("prune batch timed out by itself: %v, open %v; want an open breaker", err, b.Open())
	}
}

// slowOrGone is a store whose GetSession runs out of time (slow) or is
// refused (gone), and whose probe answers as reachable says. It counts the
// probes that reach it.
type slowOrGone struct {
	sessionstore.Store
	gone      bool        // GetSession refused rather than out of time
	reachable atomic.Bool // what Reachable answers
	probes    atomic.Int64
}

var errReset = fmt.Errorf("get session: %w: connection reset", sessionstore.ErrUnavailable)

func (s *slowOrGone) GetSession(ctx context.Context, _ sessionstore.Key, _ time.Time) (sessionstore.Session, error) {
	if s.gone {
		return sessionstore.Session{}, errReset
	}
	<-ctx.Done()
	return sessionstore.Session{}, fmt.Errorf("get session: %w: %w", sessionstore.ErrUnavailable, ctx.Err())
}

func (s *slowOrGone) Reachable(context.Context) error {
	s.probes.Add(1)
	if s.reachable.Load() {
		return nil
	}
	return errRefused
}

func (s *slowOrGone) Close() error { return nil }

// TestReadyWhileSlowNotWhileGone: a call out of time opens the breaker (it
// still refuses calls at once) but Ready stays nil until a probe finds the
// store unreachable; a refused call makes Ready fail at once. The probe is
// the store's Reachable, which tells slow from gone, not Ping.
func TestReadyWhileSlowNotWhileGone(t *testing.T) {
	k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "s"}
	slow := &slowOrGone{}
	b, err := breaker.New(slow, breaker.Config{ProbeEvery: 10 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := within(20 * time.Millisecond)
	_, err = b.GetSession(ctx, k, time.Now())
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || !b.Open() {
		t.Fatalf("call out of time: %v, open %v; want an open breaker", err, b.Open())
	}
	if _, err := b.GetSession(context.Background(), k, time.Now()); !errors.Is(err, breaker.ErrOpen) {
		t.Fatalf("call on the open breaker: %v, want ErrOpen (still shed at once)", err)
	}
	if err := b.Ready(context.Background()); err != nil {
		t.Fatalf("Ready after a call out of time, before any probe: %v; want ready (slow is not gone)", err)
	}
	run(t, b) // its probes find the store unreachable
	testwait.For(t, "a failed probe to make Ready fail", 10*time.Second, func() bool { return errors.Is(b.Ready(context.Background()), breaker.ErrOpen) })
	if b.Diagnose(breaker.ErrOpen) != errRefused.Error() {
		t.Errorf("Diagnose = %q, want the failed probe's cause", b.Diagnose(breaker.ErrOpen))
	}
	slow.reachable.Store(true) // answers again: the probe closes the breaker
	testwait.For(t, "the breaker to close", 10*time.Second, func() bool { return !b.Open() })
	if err := b.Ready(context.Background()); err != nil {
		t.Fatalf("Ready once reachable: %v", err)
	}

	gone := &slowOrGone{gone: true}
	b, err = breaker.New(gone, breaker.Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetSession(context.Background(), k, time.Now()); !errors.Is(err, errReset) || !b.Open() {
		t.Fatalf("refused call: %v, open %v", err, b.Open())
	}
	if err := b.Ready(context.Background()); !errors.Is(err, breaker.ErrOpen) {
		t.Fatalf("Ready after a refused call: %v, want ErrOpen at once, without a probe", err)
	}
	if n := gone.probes.Load(); n != 0 {
		t.Fatalf("%d probes: Ready must not wait for one when a call was refused", n)
	}
}

// TestReadyOnAClosedBreakerProbes: with the breaker closed, Ready asks the
// store's Reachable (not Ping, which waits for a pooled connection), and a
// failure opens the breaker as unreachable.
func TestReadyOnAClosedBreakerProbes(t *testing.T) {
	s := &slowOrGone{}
	s.reachable.Store(true)
	b, err := breaker.New(s, breaker.Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Ready(context.Background()); err != nil || s.probes.Load() != 1 {
		t.Fatalf("Ready: %v after %d probes; want nil after 1", err, s.probes.Load())
	}
	s.reachable.Store(false)
	if err := b.Ready(context.Background()); !errors.Is(err, errRefused) || !b.Open() {
		t.Fatalf("Ready with the store gone: %v, open %v", err, b.Open())
	}
	if err := b.Ready(context.Background()); !errors.Is(err, breaker.ErrOpen) {
		t.Fatalf("Ready again: %v, want ErrOpen", err)
	}
}
