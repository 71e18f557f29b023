package pgstore

import (
	"context"
	"slices"
	"sync"

	"github.com/marconihub/marconi/sessionstore"
)

// committer gathers concurrent appends into batches, at most maxInFlight
// batches running at once. It starts no goroutine: while fewer batches run
// than it allows, a batch is cut from the head of the queue and handed to
// its oldest request, whose caller runs it; when a batch is done, the next
// ones are cut before its members are answered. So a lone append runs at
// once, and under load each batch carries whatever arrived while the
// others committed. It is safe for concurrent use.
//
// The requests of one session (appendReq.recipient) are in one running
// batch at a time: a batch is cut from the queue in arrival order, passing
// over those whose session is in a batch still running (and so every later
// one of that session too). Two batches running at once take their locks
// and commit in an order of their own, so this is what keeps a recipient's
// appends committing (and taking their seqs) in arrival order.
//
// Each running batch runs in a lane of its own, numbered 0 to maxInFlight-1
// and free again once the batch is done: the store keeps a quota lease per
// lane (append.go), which only one batch at a time may use.
type committer struct {
	run         func(lane int, batch []*appendReq) // sets every req's outcome
	maxBatch    int
	maxInFlight int
	// maxAcks is how many acknowledgements a batch carries beside other
	// requests (cut); 0: no bound.
	maxAcks int
	// slots bounds the requests queued or in flight; a caller past it
	// waits for room (or its context).
	slots chan struct{}

	mu      sync.Mutex
	queue   []*appendReq
	running int   // batches cut and not yet answered
	lanes   []int // the lanes no running batch holds
	// busy counts, per session, its requests in running batches; kept only
	// with maxInFlight > 1.
	busy map[sessionstore.Key]int
}

func newCommitter(maxBatch, maxQueued, maxInFlight int, run func(int, []*appendReq)) *committer {
	maxInFlight = max(maxInFlight, 1)
	lanes := make([]int, maxInFlight)
	for i := range lanes {
		lanes[i] = maxInFlight - 1 - i // taken from the end: lane 0 first
	}
	return &committer{run: run, maxBatch: maxBatch, maxInFlight: maxInFlight,
		slots: make(chan struct{}, maxQueued), busy: map[sessionstore.Key]int{}, lanes: lanes}
}

// do runs r in a batch and returns once r's outcome is set. It returns an
// error, and r runs in no batch, when ctx ends before r was queued or while
// it waits in the queue; once a batch took r, r is answered (batches are
// bounded by the store's query timeout).
func (c *committer) do(ctx context.Context, r *appendReq) error {
	select {
	case c.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.slots }()
	r.turn = make(chan turn, 1)
	c.mu.Lock()
	c.queue = append(c.queue, r)
	c.dispatch()
	c.mu.Unlock()
	select {
	case t := <-r.turn:
		c.serve(t)
		return nil
	case <-ctx.Done():
		if c.withdraw(r) {
			return ctx.Err()
		}
	}
	// A batch took r: as if ctx had not ended.
	c.serve(<-r.turn)
	return nil
}

// withdraw takes r off the queue, unless a batch took it.
func (c *committer) withdraw(r *appendReq) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.Index(c.queue, r)
	if i < 0 {
		return false
	}
	c.queue = slices.Delete(c.queue, i, i+1)
	return true
}

// turn is what a queued request is handed: nothing (batch nil) when its
// outcome is set, or a batch to run (itself first) in lane.
type turn struct {
	lane  int
	batch []*appendReq
}

// dispatch cuts batches while fewer than maxInFlight run and the queue
// holds requests free to go, and hands each, with a free lane, to its first
// request. c.mu is held.
func (c *committer) dispatch() {
	for c.running < c.maxInFlight && len(c.queue) > 0 {
		batch := c.cut()
		if len(batch) == 0 {
			return // every queued session is in a running batch
		}
		c.running++
		lane := c.lanes[len(c.lanes)-1]
		c.lanes = c.lanes[:len(c.lanes)-1]
		batch[0].turn <- turn{lane: lane, batch: batch}
	}
}

// cut takes the next batch off the queue: up to maxBatch requests, in
// arrival order, but for those whose session is in a running batch, and
// for acknowledgements past maxAcks (below). c.mu is held.
//
// An acknowledgement reads every signal it covers (and wrote each one,
// until migration 0016), and a fleet whose agents were started together
// acknowledges in bursts (each client at most every AckInterval): tens of
// acks of tens of signals each, a batch of which
// held every append beside it several times its usual time (the p99 of a
// durable send in docs/benchmarks-history.md, "The acknowledgement
// bursts"). So a batch that carries other requests takes at most maxAcks
// acks; the others wait for the next batches, spread among their appends,
// and so do the later acks and row writes of their sessions, which keep
// their order (an append does not need it: an ack covers only seqs given
// before it). Acks go at once when nothing else waits; when many wait, a
// batch takes a sixteenth of them (ackLimit), so that no backlog outgrows
// what the batches carry.
func (c *committer) cut() []*appendReq {
	limit, capAcks := c.ackLimit()
	if c.maxInFlight == 1 && !capAcks { // nothing else runs: the head of the queue
		n := min(len(c.queue), c.maxBatch)
		batch := slices.Clone(c.queue[:n])
		c.queue = slices.Delete(c.queue, 0, n)
		return batch
	}
	var (
		batch []*appendReq
		acks  int
		held  map[sessionstore.Key]bool // sessions with an ack left for later
	)
	kept := c.queue[:0]
	for _, r := range c.queue {
		k := r.recipient()
		switch {
		case len(batch) == c.maxBatch, c.busy[k] > 0,
			held[k] && !r.isAppend():
			kept = append(kept, r)
			continue
		case r.ack != nil && capAcks && acks == limit:
			if held == nil {
				held = map[sessionstore.Key]bool{}
			}
			held[k] = true
			kept = append(kept, r)
			continue
		case r.ack != nil:
			acks++
		}
		batch = append(batch, r)
	}
	clear(c.queue[len(kept):]) // drop the references the batch took
	c.queue = kept
	if c.maxInFlight > 1 {
		for _, r := range batch {
			c.busy[r.recipient()]++
		}
	}
	return batch
}

// ackSpread is how many batches at most a burst of acks is spread over:
// beyond maxAcks, a batch takes this share of the acks waiting.
const ackSpread = 16

// ackLimit is how many acks the next batch takes, and whether that holds
// any back: when acks wait beside requests of another kind, maxAcks, or a
// ackSpread-th of those waiting when that is more. c.mu is held.
func (c *committer) ackLimit() (int, bool) {
	if c.maxAcks <= 0 {
		return 0, false
	}
	acks, others := 0, false
	for _, r := range c.queue {
		if r.ack != nil {
			acks++
		} else {
			others = true
		}
	}
	limit := max(c.maxAcks, (acks+ackSpread-1)/ackSpread)
	return limit, others && acks > limit
}

// serve runs t's batch, when r was handed one, then starts the batches it
// made room for and answers its members (batch[0] is the caller).
func (c *committer) serve(t turn) {
	batch := t.batch
	if batch == nil {
		return // answered by another's batch
	}
	c.run(t.lane, batch)
	c.mu.Lock()
	c.running--
	c.lanes = append(c.lanes, t.lane)
	if c.maxInFlight > 1 {
		for _, r := range batch {
			k := r.recipient()
			if c.busy[k]--; c.busy[k] == 0 {
				delete(c.busy, k)
			}
		}
	}
	c.dispatch()
	c.mu.Unlock()
	for _, r := range batch[1:] {
		r.turn <- turn{}
	}
}
