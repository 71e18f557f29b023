package pgstore

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/marconihub/marconi/sessionstore"
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
	c := newCommitter(maxBatch, 4*maxBatch, 1, func(_ int, batch []*appendReq) {
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
	c := newCommitter(8, 32, 1, func(_ int, batch []*appendReq) {
		once.Do(func() { close(firstRunning); <-release })
		for _, r := range batch {
			ran.Store(r, true)
			r.out.acked = 1
		}
	})
	first, gone, kept := &appendReq{}, &appendReq{}, &appendReq{}
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.do(context.Background(), first) })
	<-firstRunning
	ctx, cancel := context.WithCancel(context.Background())
	goneErr := make(chan error, 1)
	wg.Go(func() { goneErr <- c.do(ctx, gone) })
	waitQueued(t, c, 1)
	wg.Go(func() { _ = c.do(context.Background(), kept) })
	waitQueued(t, c, 2)
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
		t.Fatalf("after all answers: %d running, %d queued, %d slots held; want idle", c.running, len(c.queue), len(c.slots))
	}
}

// TestCommitterBatchesInFlight: with maxInFlight 3, three batches run at
// once, never more, each in a lane no other running batch holds; no session
// is in two running batches at once, and each session's requests run in the
// order they were queued, across batches.
// The first three batches are held while the rest queue one by one, so
// that the order of arrival is known.
func TestCommitterBatchesInFlight(t *testing.T) {
	const inFlight, maxBatch, sessions, perSession = 3, 4, 5, 12
	var (
		mu        sync.Mutex
		running   = map[sessionstore.Key]bool{}
		lanes     = map[int]bool{}             // the lanes of the running batches
		next      = map[sessionstore.Key]int{} // the rank of each session's next request
		rank      = map[*appendReq]int{}
		now, most int
		release   = make(chan struct{})
		held      sync.WaitGroup
		heldOnce  atomic.Int64
	)
	held.Add(inFlight)
	c := newCommitter(maxBatch, inFlight+sessions*perSession, inFlight, func(lane int, batch []*appendReq) {
		mu.Lock()
		now++
		most = max(most, now)
		if lane < 0 || lane >= inFlight || lanes[lane] {
			t.Errorf("a batch ran in lane %d, with lanes %v running", lane, lanes)
		}
		lanes[lane] = true
		if len(batch) > maxBatch {
			t.Errorf("batch of %d, want at most %d", len(batch), maxBatch)
		}
		mine := map[sessionstore.Key]bool{}
		for _, r := range batch {
			k := r.recipient()
			if running[k] && !mine[k] {
				t.Errorf("%s is in two running batches", k.SessionID)
			}
			running[k], mine[k] = true, true
			if rank[r] != next[k] {
				t.Errorf("%s: request %d ran when %d was next", k.SessionID, rank[r], next[k])
			}
			next[k] = rank[r] + 1
			r.out.acked = 1
		}
		mu.Unlock()
		if heldOnce.Add(1) <= inFlight {
			held.Done()
			<-release
		} else {
			runtime.Gosched() // let other batches start meanwhile
		}
		mu.Lock()
		now--
		delete(lanes, lane)
		for k := range mine {
			delete(running, k)
		}
		mu.Unlock()
	})
	session := func(i int) sessionstore.Key {
		return sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: fmt.Sprint("s", i)}
	}
	var wg sync.WaitGroup
	var reqs []*appendReq
	start := func(k sessionstore.Key) {
		r := &appendReq{row: &rowReq{k: k}}
		mu.Lock()
		rank[r] = countOf(reqs, k)
		reqs = append(reqs, r)
		mu.Unlock()
		wg.Go(func() {
			if err := c.do(context.Background(), r); err != nil {
				t.Error(err)
			}
		})
	}
	for i := range inFlight { // three batches, held
		start(session(i))
	}
	held.Wait()
	for range perSession {
		for i := range sessions {
			start(session(i))
			waitQueued(t, c, len(reqs)-inFlight)
		}
	}
	close(release)
	wg.Wait()
	for i, r := range reqs {
		if r.out.acked != 1 {
			t.Fatalf("request %d was not answered", i)
		}
	}
	if most != inFlight {
		t.Errorf("at most %d batches ran at once, want %d", most, inFlight)
	}
	if c.running != 0 || len(c.queue) != 0 || len(c.busy) != 0 {
		t.Fatalf("after all answers: %d running, %d queued, %d sessions busy; want idle", c.running, len(c.queue), len(c.busy))
	}
}

// countOf is how many of reqs are k's.
func countOf(reqs []*appendReq, k sessionstore.Key) int {
	n := 0
	for _, r := range reqs {
		if r.recipient() == k {
			n++
		}
	}
	return n
}

// waitQueued waits until c's queue holds n requests.
func waitQueued(t *testing.T, c *committer, n int) {
	t.Helper()
	waitCommitter(t, c, fmt.Sprintf("%d requests queued", n), func() bool { return len(c.queue) == n })
}

// waitCommitter waits until cond, read under c.mu, holds, failing the test
// after 10 s.
func waitCommitter(t *testing.T, c *committer, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		ok := cond()
		c.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}

// TestCutSpreadsAnAckBurst: a batch carries at most maxAcks acks beside
// other requests, or a sixteenth of those waiting when that is more; an ack
// left for later holds its session's later acks and row writes, not its
// appends; acks go at once when nothing else waits.
func TestCutSpreadsAnAckBurst(t *testing.T) {
	key := func(i int) sessionstore.Key {
		return sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: fmt.Sprint("s", i)}
	}
	ack := func(i int) *appendReq { return &appendReq{ack: &ackReq{k: key(i)}} }
	row := func(i int) *appendReq { return &appendReq{row: &rowReq{k: key(i)}} }
	send := func(i int) *appendReq { return &appendReq{ns: sessionstore.NewSignal{To: key(i)}} }
	names := map[*appendReq]string{}
	named := func(name string, r *appendReq) *appendReq { names[r] = name; return r }
	cuts := func(c *committer) [][]string { // each batch done before the next is cut
		var out [][]string
		for len(c.queue) > 0 && len(out) < 10 {
			var b []string
			for _, r := range c.cut() {
				b = append(b, names[r])
			}
			out = append(out, b)
			clear(c.busy)
		}
		return out
	}
	for _, inFlight := range []int{1, 3} { // cut's two paths
		c := newCommitter(16, 64, inFlight, nil)
		c.maxAcks = 2
		c.queue = []*appendReq{named("ack0", ack(0)), named("ack1", ack(1)), named("ack2", ack(2)), named("send2", send(2)),
			named("row2", row(2)), named("ack3", ack(3)), named("send0", send(0)), named("ack2'", ack(2))}
		got := cuts(c)
		want := [][]string{{"ack0", "ack1", "send2", "send0"}, {"ack2", "row2", "ack3"}, {"ack2'"}}
		if !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("%d in flight: batches %v, want %v", inFlight, got, want)
		}
	}

	c := newCommitter(256, 1024, 1, nil)
	c.maxAcks = 2
	for i := range 100 {
		c.queue = append(c.queue, named(fmt.Sprint("ack", i), ack(i)))
	}
	c.queue = append(c.queue, named("send0", send(0)))
	got := cuts(c)
	if len(got[0]) != 7+1 || got[0][7] != "send0" {
		t.Errorf("100 acks waiting beside a send: first batch %v, want a sixteenth of them (7) and the send", got[0])
	}
	if len(got) > ackSpread+1 {
		t.Errorf("100 acks spread over %d batches, want at most %d", len(got), ackSpread+1)
	}
	for i := range 5 {
		c.queue = append(c.queue, named(fmt.Sprint("ack", i), ack(i)))
	}
	if got := cuts(c); len(got) != 1 || len(got[0]) != 5 {
		t.Errorf("5 acks alone: %v, want one batch of them all", got)
	}
}
