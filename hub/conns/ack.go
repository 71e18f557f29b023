package conns

import (
	"context"
	"sync"
	"time"
)

// acks coalesces a connection's acks: the newest up_to_seq wins, and it is
// written to the store at most once per AckInterval, by a timer's goroutine
// that exists only while an ack waits. flush writes what is left when the
// connection ends, so an ack the hub read is durable before it detaches.
type acks struct {
	c *Conn

	mu      sync.Mutex
	pending int64 // newest up_to_seq not yet written; -1 when none
	armed   bool  // a write is scheduled or running
	timer   *time.Timer
	closed  bool
	wg      sync.WaitGroup // the timer's write, while it runs
}

func newAcks(c *Conn) *acks { return &acks{c: c, pending: -1} }

// add records an ack of every signal up to seq.
func (a *acks) add(seq int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if seq > a.pending {
		a.pending = seq
	}
	a.armLocked()
}

// armLocked schedules a write AckInterval from now, unless one is scheduled
// or running, or the connection has ended.
func (a *acks) armLocked() {
	if a.armed || a.closed || a.pending < 0 {
		return
	}
	a.armed = true
	a.wg.Add(1)
	a.timer = time.AfterFunc(a.c.h.cfg.AckInterval, a.fire)
}

// fire is the timer's write; it schedules the next one if acks came meanwhile.
func (a *acks) fire() {
	defer a.wg.Done()
	a.write()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.armed = false
	a.armLocked()
}

// write writes the pending ack, if any.
func (a *acks) write() {
	a.mu.Lock()
	seq := a.pending
	a.pending = -1
	a.mu.Unlock()
	if seq >= 0 {
		a.c.ackUpTo(context.Background(), seq)
	}
}

// flush stops the timer, waits for a write in progress and writes what is
// left. After flush, add writes nothing.
func (a *acks) flush() {
	a.mu.Lock()
	a.closed = true
	if a.timer != nil && a.timer.Stop() {
		a.wg.Done() // its fire will not run
	}
	a.mu.Unlock()
	a.wg.Wait()
	a.write()
}
