package conns

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// acks coalesces a connection's acks: the newest up_to_seq wins, and it is
// written to the store at most once per AckInterval, by a timer's goroutine
// that exists only while an ack waits. flush writes what is left when the
// connection ends, so an ack the hub read is durable before it detaches.
type acks struct {
	c *Conn

	mu      sync.Mutex
	pending int64  // newest up_to_seq not yet written; -1 when none
	history uint64 // the store's history pending was read under (history.go)
	armed   bool   // a write is scheduled or running
	timer   *time.Timer
	closed  bool
	wg      sync.WaitGroup // the timer's write, while it runs
}

func newAcks(c *Conn) *acks { return &acks{c: c, pending: -1} }

// add records an ack of every signal up to seq, read under the store's
// history: an ack under a later history replaces one under an earlier, as
// the store would refuse that one.
func (a *acks) add(seq int64, history uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if seq > a.pending || history != a.history {
		a.pending, a.history = seq, history
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
	if a.timer == nil {
		a.timer = time.AfterFunc(a.c.h.cfg.AckInterval, a.fire)
		return
	}
	a.timer.Reset(a.c.h.cfg.AckInterval) // stopped or fired: fire is not pending
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
	seq, history := a.pending, a.history
	a.pending = -1
	a.mu.Unlock()
	if seq >= 0 {
		a.c.ackUpTo(context.Background(), seq, history)
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

// ackUpTo acknowledges the session's signals up to seq while c still
// speaks for it, checked by the store in the ack's own write: acks are keyed
// by session key, and one from a connection of an earlier registration or
// token would ack the signals of the session that replaced it. A refusal
// closes c as the check of a keepalive would.
func (c *Conn) ackUpTo(ctx context.Context, seq int64, history uint64) {
	actx, cancel := context.WithTimeout(ctx, c.h.cfg.StoreTimeout)
	defer cancel()
	_, err := c.h.ack(actx, c.key, sessionstore.Holder{RegisteredAt: c.incarnation, TokenHash: c.tokenHash, History: history}, seq)
	switch {
	case err == nil:
	case errors.Is(err, sessionstore.ErrHistoryChanged):
		// Read before the store went back in time: the writer catches up
		// again (FollowHistory) and the client acks what it then receives.
		c.h.log.Info("ack from websocket refused: the store's history changed since it was read", KeyAttrs(c.key), "up_to_seq", seq)
	case errors.Is(err, sessionstore.ErrNotFound):
		c.kick(DisconnectSessionGone) // the writer closes it
	case errors.Is(err, sessionstore.ErrTokenMismatch):
		c.kick(DisconnectTokenReplaced)
	case errors.Is(err, sessionstore.ErrConflict):
		// The row changed while the ack was checked: read it to learn how.
		d, err := c.stillCurrent(ctx)
		if err != nil {
			c.h.log.Warn("ack from websocket: check the session", KeyAttrs(c.key), "err", err)
		} else if d != nil {
			c.kick(*d)
		}
	default:
		c.h.log.Warn("ack from websocket", KeyAttrs(c.key), "err", err)
	}
}
