package pgstore

import (
	"context"
	"sync"
)

// committer gathers concurrent appends into batches, one batch in flight at
// a time. It starts no goroutine: the first caller to find no batch running
// leads, running the batch of everything queued (itself first); when its
// batch is done it hands the lead to the oldest request still queued and
// answers its batch. So a lone append runs at once, and under load each
// batch carries whatever arrived while the previous one committed. It is
// safe for concurrent use.
type committer struct {
	run      func(batch []*appendReq) // sets every req's outcome
	maxBatch int
	// slots bounds the requests queued or in flight; a caller past it
	// waits for room (or its context).
	slots chan struct{}

	mu    sync.Mutex
	queue []*appendReq
	busy  bool // a leader is running; false only while queue is empty
}

func newCommitter(maxBatch, maxQueued int, run func([]*appendReq)) *committer {
	return &committer{run: run, maxBatch: maxBatch, slots: make(chan struct{}, maxQueued)}
}

// do runs r in a batch and returns once r's outcome is set. It returns an
// error only when ctx ends before r was queued; once queued, r is answered
// (batches are bounded by the store's query timeout).
func (c *committer) do(ctx context.Context, r *appendReq) error {
	select {
	case c.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.slots }()
	r.turn = make(chan bool, 1)
	c.mu.Lock()
	c.queue = append(c.queue, r)
	lead := !c.busy
	c.busy = true
	c.mu.Unlock()
	if !lead && <-r.turn {
		return nil // answered by another leader's batch
	}
	c.lead()
	return nil
}

// lead runs one batch from the head of the queue, which holds the caller.
func (c *committer) lead() {
	c.mu.Lock()
	n := min(len(c.queue), c.maxBatch)
	batch := make([]*appendReq, n)
	copy(batch, c.queue)
	c.queue = append(c.queue[:0], c.queue[n:]...)
	c.mu.Unlock()

	c.run(batch)

	c.mu.Lock()
	if len(c.queue) > 0 {
		c.queue[0].turn <- false // the oldest waiter leads the next batch
	} else {
		c.busy = false
	}
	c.mu.Unlock()
	for _, r := range batch[1:] {
		r.turn <- true
	}
}
