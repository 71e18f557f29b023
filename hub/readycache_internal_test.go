package hub

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/testwait"
)

// waiting is how many checks wait for the probe under way.
func (r *readyCache) waiting() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waiters
}

// pollWaiting polls until n checks wait for the probe under way.
func pollWaiting(t *testing.T, r *readyCache, n int) {
	t.Helper()
	testwait.For(t, fmt.Sprintf("%d checks to wait for the probe", n), 10*time.Second, func() bool { return r.waiting() == n })
}

// handWitness is a store's witness the test sets by hand: sinceWrite
// (negative: no write since the last failure) and failures.
type handWitness struct {
	sinceWrite atomic.Int64
	failures   atomic.Uint64
}

func newHandWitness() *handWitness {
	w := &handWitness{}
	w.sinceWrite.Store(-1)
	return w
}

func (w *handWitness) Witness() (time.Duration, uint64) {
	return time.Duration(w.sinceWrite.Load()), w.failures.Load()
}

// probeCounter is a probe that counts its runs and answers err.
type probeCounter struct {
	runs atomic.Int32
	err  error
}

func (p *probeCounter) probe() error {
	p.runs.Add(1)
	return p.err
}

// fakeNow is a clock the test moves (hubtest.Clock would be an import cycle).
type fakeNow struct{ ns atomic.Int64 }

func newFakeNow() *fakeNow {
	c := &fakeNow{}
	c.ns.Store(time.Unix(1e9, 0).UnixNano())
	return c
}

func (c *fakeNow) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *fakeNow) add(d time.Duration) { c.ns.Add(int64(d)) }

// TestReadyChecksDuringAProbeShareIt: with the cache off, checks that come
// while a probe runs wait for it and take its verdict: one probe for all.
func TestReadyChecksDuringAProbeShareIt(t *testing.T) {
	const n = 8
	clock := newFakeNow()
	r := newReadyCache(-1, clock.now, nil)
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // a failed test leaves no probe blocked
	var runs atomic.Int32
	errGone := errors.New("gone")
	probe := func() error {
		runs.Add(1)
		<-release
		return errGone
	}
	errs := make(chan error, n)
	go func() { errs <- r.check(context.Background(), probe) }()
	testwait.For(t, "the first check to start its probe", 10*time.Second, func() bool { return runs.Load() == 1 })
	for range n - 1 {
		go func() { errs <- r.check(context.Background(), probe) }()
	}
	pollWaiting(t, r, n-1)
	once.Do(func() { close(release) })
	for range n {
		if err := <-errs; !errors.Is(err, errGone) {
			t.Fatalf("a check answered %v, want the probe's verdict", err)
		}
	}
	if got := runs.Load(); got != 1 {
		t.Fatalf("%d probes for %d concurrent checks, want 1", got, n)
	}
	if err := r.check(context.Background(), probe); !errors.Is(err, errGone) || runs.Load() != 2 {
		t.Fatalf("a check after the probe, cache off: %v after %d probes; want a probe of its own", err, runs.Load())
	}
}

// TestReadyWaiterGivesUpWithItsContext: a check waiting for another's probe
// returns when its own context ends; the probe is not disturbed.
func TestReadyWaiterGivesUpWithItsContext(t *testing.T) {
	r := newReadyCache(time.Minute, time.Now, nil)
	release, started := make(chan struct{}), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	done := make(chan error, 1)
	go func() {
		done <- r.check(context.Background(), func() error { close(started); <-release; return nil })
	}()
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() { waited <- r.check(ctx, func() error { t.Error("a second probe ran"); return nil }) }()
	pollWaiting(t, r, 1)
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiting check after its context ended: %v", err)
	}
	once.Do(func() { close(release) })
	if err := <-done; err != nil {
		t.Fatalf("the probing check: %v", err)
	}
}

// TestReadyVerdictLastsItsWindow: checks within the window reuse the
// verdict; the first at or past it probes again.
func TestReadyVerdictLastsItsWindow(t *testing.T) {
	clock := newFakeNow()
	r := newReadyCache(500*time.Millisecond, clock.now, newHandWitness())
	p := &probeCounter{}
	for range 5 {
		if err := r.check(context.Background(), p.probe); err != nil {
			t.Fatal(err)
		}
		clock.add(99 * time.Millisecond)
	}
	if got := p.runs.Load(); got != 1 {
		t.Fatalf("%d probes for five checks within 500 ms, want 1", got)
	}
	clock.add(5 * time.Millisecond) // 500 ms since the probe
	if err := r.check(context.Background(), p.probe); err != nil || p.runs.Load() != 2 {
		t.Fatalf("a check past the window: %v after %d probes, want a second probe", err, p.runs.Load())
	}
}

// TestReadyFailureEndsACachedReady: a failure the store witnessed after a
// probe passed makes the next check probe again, within the window; a
// cached failure is not shortened by further failures.
func TestReadyFailureEndsACachedReady(t *testing.T) {
	clock := newFakeNow()
	w := newHandWitness()
	r := newReadyCache(time.Minute, clock.now, w)
	p := &probeCounter{}
	if err := r.check(context.Background(), p.probe); err != nil {
		t.Fatal(err)
	}
	w.failures.Add(1) // a call found the store gone
	p.err = errors.New("gone")
	if err := r.check(context.Background(), p.probe); !errors.Is(err, p.err) {
		t.Fatalf("check after a witnessed failure: %v, want the new probe's %v", err, p.err)
	}
	w.failures.Add(1)
	if err := r.check(context.Background(), p.probe); !errors.Is(err, p.err) || p.runs.Load() != 2 {
		t.Fatalf("check with a cached failure: %v after %d probes; want the cached failure, 2 probes", err, p.runs.Load())
	}
}

// TestReadyWriteStandsForAProbe: a write the store accepted with no
// failure since stands for a probe begun when it was accepted; none when a
// failure followed it (the store says so with a negative age).
func TestReadyWriteStandsForAProbe(t *testing.T) {
	clock := newFakeNow()
	w := newHandWitness()
	r := newReadyCache(500*time.Millisecond, clock.now, w)
	p := &probeCounter{}
	check := func(what string, wantRuns int32) {
		t.Helper()
		if err := r.check(context.Background(), p.probe); err != nil || p.runs.Load() != wantRuns {
			t.Fatalf("%s: %v after %d probes, want %d", what, err, p.runs.Load(), wantRuns)
		}
	}
	check("first check", 1)
	for range 4 { // a busy store: a write 100 ms before each check
		clock.add(500 * time.Millisecond)
		w.sinceWrite.Store(int64(100 * time.Millisecond))
		check("a check 100 ms after a write", 1)
	}
	clock.add(500 * time.Millisecond)
	w.sinceWrite.Store(int64(500 * time.Millisecond))
	check("a check 500 ms after the last write", 2)
	clock.add(500 * time.Millisecond)
	w.sinceWrite.Store(-1) // a write, then a failure
	w.failures.Add(1)
	check("a check after a write and a failure", 3)
}

// TestReadyWriteEndsACachedFailure: a write accepted after the failure
// that a cached verdict reports (the probe's own, counted by the store)
// says the store is back; a write older than the failed probe does not.
func TestReadyWriteEndsACachedFailure(t *testing.T) {
	clock := newFakeNow()
	w := newHandWitness()
	r := newReadyCache(time.Minute, clock.now, w)
	p := &probeCounter{err: errors.New("read-only")}
	if err := r.check(context.Background(), p.probe); !errors.Is(err, p.err) {
		t.Fatalf("first check: %v", err)
	}
	clock.add(time.Second)
	w.sinceWrite.Store(int64(2 * time.Second)) // accepted before the probe
	if err := r.check(context.Background(), p.probe); !errors.Is(err, p.err) || p.runs.Load() != 1 {
		t.Fatalf("check with a write older than the failed probe: %v after %d probes; want the cached failure", err, p.runs.Load())
	}
	w.failures.Add(1) // the probe's failure, counted by the store
	w.sinceWrite.Store(int64(10 * time.Millisecond))
	if err := r.check(context.Background(), p.probe); err != nil || p.runs.Load() != 1 {
		t.Fatalf("check after a write that followed the failure: %v after %d probes; want ready without a probe", err, p.runs.Load())
	}
}
