package pgstore

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestCommitterBatches: every request is answered exactly once, by one batch
// of at most maxBatch, with one batch in flight at a time; a caller whose
// context ended before it was queued gets an error and runs in no batch.
func TestCommitterBatches(t *testing.T) {
	const callers, maxBatch = 200, 8
	var (
		inFlight, most, batches atomic.Int64
		seen                    sync.Map
		release                 = make(chan struct{})
		firstRunning            = make(chan struct{})
		once                    sync.Once
	)
	c := newCommitter(maxBatch, 4*maxBatch, 1, func(batch []*appendReq) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		once.Do(func() { close(firstRunning); <-release }) // hold the first batch so that others queue
		batches.Add(1)
		if len(batch) > maxBatch {
			t.Errorf("batch of %d, want at most %d", len(batch), maxBatch)
		}
		for _, r := range batch {
			if _, dup := seen.LoadOrStore(r, true); dup {
				t.Error("a request ran in two batches")
			}
			r.out.acked = 1
		}
	})
	var wg sync.WaitGroup
	reqs := make([]*appendReq, callers)
	for i := range reqs {
		reqs[i] = &appendReq{}
	}
	wg.Go(func() {
		if err := c.do(context.Background(), reqs[0]); err != nil {
			t.Error(err)
		}
	})
	<-firstRunning
	for _, r := range reqs[1:] {
		wg.Go(func() {
			if err := c.do(context.Background(), r); err != nil {
				t.Error(err)
			}
		})
	}
	// A caller whose context is over finds no room (the queue is full
	// while the first batch is held) and is refused without running.
	full := &appendReq{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for len(c.slots) < cap(c.slots) { // the callers above are starting
		if time.Now().After(deadline) {
			t.Fatal("the queue never filled")
		}
		runtime.Gosched()
	}
	if err := c.do(ctx, full); err == nil {
		t.Fatal("do with an ended context and a full queue succeeded")
	}
	close(release)
	wg.Wait()
	for i, r := range reqs {
		if r.out.acked != 1 {
			t.Fatalf("request %d was not answered", i)
		}
	}
	if _, ran := seen.Load(full); ran {
		t.Fatal("a refused request ran")
	}
	if most.Load() != 1 {
		t.Fatalf("%d batches ran at once, want 1", most.Load())
	}
	if b := batches.Load(); b < callers/maxBatch || b >= callers {
		t.Fatalf("%d batches for %d requests of at most %d: want them gathered", b, callers, maxBatch)
	}
	if c.running != 0 || len(c.queue) != 0 {
		t.Fatalf("after all answers: %d running, %d queued; want idle and empty", c.running, len(c.queue))
	}
}

// TestCommitterWithdrawsOnContextEnd: a caller whose context ends while it
// waits in the queue gets its error at once and runs in no batch; the
// callers queued beside it are answered as before.
func TestCommitterWithdrawsOnContextEnd(t *testing.T) {
	var (
		ran          sync.Map
		release      = make(chan struct{})
		firstRunning = make(chan struct{})
		once         sync.Once
	)
	c := newCommitter(8, 32, 1, func(batch []*appendReq) {
		once.Do(func() { close(firstRunning); <-release })
		for _, r := range batch {
			ran.Store(r, true)
			r.out.acked = 1
		}
	})
	queued := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			c.mu.Lock()
			got := len(c.queue)
			c.mu.Unlock()
			if got == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d requests queued, want %d", got, n)
			}
			runtime.Gosched()
		}
	}
	first, gone, kept := &appendReq{}, &appendReq{}, &appendReq{}
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.do(context.Background(), first) })
	<-firstRunning
	ctx, cancel := context.WithCancel(context.Background())
	goneErr := make(chan error, 1)
	wg.Go(func() { goneErr <- c.do(ctx, gone) })
	queued(1)
	wg.Go(func() { _ = c.do(context.Background(), kept) })
	queued(2)
	cancel()
	select {
	case err := <-goneErr:
		if err == nil {
			t.Fatal("do whose context ended in the queue returned nil")
		}
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("do whose context ended in the queue still waits for its batch")
	}
	close(release)
	wg.Wait()
	if _, ok := ran.Load(gone); ok {
		t.Fatal("a withdrawn request ran")
	}
	if first.out.acked != 1 || kept.out.acked != 1 {
		t.Fatal("a request queued beside the withdrawn one was not answered")
	}
	if c.running != 0 || len(c.queue) != 0 || len(c.slots) != 0 {
		t.Fatalf("after all answers: busy %v, %d queued, %d slots held; want idle", c.busy, len(c.queue), len(c.slots))
	}
}
