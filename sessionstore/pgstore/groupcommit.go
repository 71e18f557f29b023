package pgstore

import (
	"context"
	"slices"
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
	r.turn = make(chan bool, 1)
	c.mu.Lock()
	c.queue = append(c.queue, r)
	lead := !c.busy
	c.busy = true
	c.mu.Unlock()
	if lead {
		c.lead()
		return nil
	}
	select {
	case answered := <-r.turn:
		if !answered {
			c.lead()
		}
		return nil
	case <-ctx.Done():
		if c.withdraw(r) {
			return ctx.Err()
		}
	}
	// A batch took r, or r was handed the lead: as if ctx had not ended.
	if !<-r.turn {
		c.lead()
	}
	return nil
}

// withdraw takes r off the queue, unless a batch took it or it was handed
// the lead (both happen under c.mu, so its turn says which).
func (c *committer) withdraw(r *appendReq) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.Index(c.queue, r)
	if i < 0 || len(r.turn) > 0 {
		return false
	}
	c.queue = slices.Delete(c.queue, i, i+1)
	return true
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
