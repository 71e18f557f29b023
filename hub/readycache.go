package hub

import (
	"context"
	"sync"
	"time"
)

// witness is met by a store that keeps what its own statements saw
// (pgstore.Store, breaker.Store): how long ago it last accepted a write
// with no failure since (negative: none), and how many calls have found it
// unavailable, a count that only grows. /readyz takes that write for a
// passed probe and drops a cached "ready" once the count moves.
type witness interface {
	Witness() (sinceWrite time.Duration, failures uint64)
}

// readyCache shares one store probe among /readyz checks: a check while a
// probe runs waits for it, and a verdict serves every check for window
// after its probe began. A cached "ready" is dropped as soon as the store
// witnesses a failure, so a cut that any call has met is reported by the
// next check; one that no call has met, by the first check past the window.
// It is safe for concurrent use.
type readyCache struct {
	window  time.Duration // <= 0: only checks during a probe share it
	now     func() time.Time
	witness witness // nil: the store counts nothing; the window alone bounds a verdict's life

	mu      sync.Mutex
	verdict readyVerdict
	flight  *readyFlight // the probe under way; nil when none
	waiters int          // checks waiting for the probe under way (the tests read it to see one wait)
}

// readyVerdict is the outcome of one probe, or of a write that stood for one.
type readyVerdict struct {
	set      bool
	err      error
	at       time.Time // when the probe began: the store's state is no older
	failures uint64    // the store's failure count when the probe began
}

// readyFlight is a probe under way; done closes once err is set.
type readyFlight struct {
	done chan struct{}
	err  error
}

func newReadyCache(window time.Duration, now func() time.Time, w witness) *readyCache {
	return &readyCache{window: window, now: now, witness: w}
}

// check returns the store's readiness: the cached verdict while it is
// fresh, else the outcome of probe, run by one check while the others
// wait for it (or for their ctx). probe is called without the lock held.
func (r *readyCache) check(ctx context.Context, probe func() error) error {
	r.mu.Lock()
	now := r.now()
	failures := r.look(now)
	if r.fresh(now, failures) {
		err := r.verdict.err
		r.mu.Unlock()
		return err
	}
	if f := r.flight; f != nil {
		r.waiters++
		r.mu.Unlock()
		return r.await(ctx, f)
	}
	f := &readyFlight{done: make(chan struct{})}
	r.flight = f
	r.mu.Unlock()
	r.run(f, probe, readyVerdict{set: true, at: now, failures: failures})
	return f.err
}

// run runs probe for flight f and keeps its outcome as v; the waiters are
// released even if probe panics.
func (r *readyCache) run(f *readyFlight, probe func() error, v readyVerdict) {
	defer func() {
		r.mu.Lock()
		v.err = f.err
		r.verdict, r.flight = v, nil
		r.mu.Unlock()
		close(f.done)
	}()
	f.err = probe()
}

// await waits for flight f's verdict, or for ctx to end.
func (r *readyCache) await(ctx context.Context, f *readyFlight) error {
	defer func() {
		r.mu.Lock()
		r.waiters--
		r.mu.Unlock()
	}()
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// look reads the store's witness at now (under r.mu) and returns its
// failure count. A write accepted with no failure since says the store was
// reachable and writable then: it stands for a probe begun at that moment
// when it is newer than the verdict, or the verdict predates a failure.
func (r *readyCache) look(now time.Time) uint64 {
	if r.witness == nil {
		return 0
	}
	sinceWrite, failures := r.witness.Witness()
	if sinceWrite < 0 {
		return failures
	}
	at, v := now.Add(-sinceWrite), r.verdict
	if !v.set || at.After(v.at) || v.failures != failures {
		r.verdict = readyVerdict{set: true, at: at, failures: failures}
	}
	return failures
}

// fresh reports whether the cached verdict answers a check at now: taken
// less than the window ago and, when it is "ready", with no failure
// witnessed since. A cached failure stands for its window.
func (r *readyCache) fresh(now time.Time, failures uint64) bool {
	v := r.verdict
	switch {
	case !v.set || now.Sub(v.at) >= r.window:
		return false
	case v.err == nil && failures != v.failures:
		return false
	}
	return true
}

// forget drops the cached verdict: the hub saw the store fail a request.
func (r *readyCache) forget() {
	r.mu.Lock()
	r.verdict = readyVerdict{}
	r.mu.Unlock()
}
