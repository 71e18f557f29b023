package conns

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// catchUpPage is how many stored signals a writer reads at a time.
const catchUpPage = 100

// wake makes sure a writer runs while there is something to write: it
// starts one unless one runs (that one sees what was queued before wake,
// since it checks for work under c.mu before it stops), or start has not
// yet finished (its own wake covers what came before). It reports whether
// it started one.
func (c *Conn) wake() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.writing || c.ended || !c.started {
		return false
	}
	c.writing = true
	c.wg.Add(1)
	c.h.writers.Add(1)
	go c.writeRun()
	return true
}

// pushFirst lets a writer that the calling goroutine has just started write
// first. A new goroutine waits in its parent's next-run slot until the parent
// blocks (after the HTTP answer) or, after a pause, another processor steals
// it; the yield puts the caller on the global run queue instead. The caller
// never waits on what the writer waits for: a full socket (a slow consumer)
// or a store read parks the writer, not the sender. Deliver yields only when
// the writer it started is the only one running: with other writers busy
// the processors are too, and the yield would only cost the sender a trip
// through the run queue (about a sixth of the throughput of eight
// concurrent senders). Measured in docs/benchmarks-history.md (issue 10).
func pushFirst() { runtime.Gosched() }

// enqueue adds it to the outgoing queue unless the queue is full.
func (c *Conn) enqueue(it queueItem) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) >= c.h.cfg.QueueSize {
		return false
	}
	c.queue = append(c.queue, it)
	return true
}

// dequeue takes the oldest queued item, if any.
func (c *Conn) dequeue() (queueItem, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		return queueItem{}, false
	}
	it := c.queue[0]
	c.queue[0] = queueItem{}
	c.queue = c.queue[1:]
	if len(c.queue) == 0 {
		c.queue = nil
	}
	return it, true
}

// writeRun is the writer: it owns every write (the welcome, the replay,
// live signals, error frames, and the close frame of a kick) and returns
// when there is nothing left to write, or when a write ends the connection.
func (c *Conn) writeRun() {
	defer c.wg.Done()
	defer c.h.writers.Add(-1)
	for {
		if err := c.writeSome(c.ctx); err != nil {
			c.fail(err) // the connection ends; writing stays set, so no writer starts again
			return
		}
		c.mu.Lock()
		if len(c.queue) == 0 && len(c.ctrl) == 0 && !c.checkDue.Load() && !c.closing() {
			c.writing = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
	}
}

// writeSome writes what is waiting: the welcome and the replay first, then
// a kick's close, a check wake-up's close, error frames and the queue.
func (c *Conn) writeSome(ctx context.Context) error {
	if !c.welcomed {
		if err := c.writeJSON(c.welcome); err != nil {
			return err
		}
		// A replay the store cannot serve now is a catch-up like any other:
		// the connection stays, and the next wake-up or sweep replays.
		if err := c.catchUpOrLater(ctx); err != nil {
			return err
		}
		c.mu.Lock()
		c.welcomed = true
		c.mu.Unlock()
	}
	for {
		if c.closing() {
			return c.closeKicked()
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if c.takeCheck() {
			if err := c.check(ctx); err != nil {
				return err
			}
			continue
		}
		if token, ok := c.takeRewind(); ok {
			if token != "" {
				if err := c.writeJSON(historyFrame{Type: marconi.FrameHistory, History: token}); err != nil {
					return err
				}
			}
			if err := c.catchUpOrLater(ctx); err != nil {
				return err
			}
			continue
		}
		if f, ok := c.takeCtrl(); ok {
			if err := c.write(f); err != nil {
				return err
			}
			continue
		}
		it, ok := c.dequeue()
		if !ok {
			return nil
		}
		if err := c.writeItem(ctx, it); err != nil {
			return err
		}
	}
}

// writeItem writes a queued signal in seq order, or catches up from the
// store on a gap or a wake-up.
func (c *Conn) writeItem(ctx context.Context, it queueItem) error {
	switch {
	case it.sig != nil && it.sig.Seq <= c.last:
		// Already written by a catch-up.
		return nil
	case it.sig != nil && it.sig.Seq == c.last+1:
		if err := c.writeSignal(*it.sig); err != nil {
			return err
		}
		c.wrote(it.sig.Seq)
		return nil
	default:
		// A gap (a concurrent send overtook this one) or a wake-up: the
		// store has every signal in order.
		return c.catchUpOrLater(ctx)
	}
}

// catchUpOrLater catches up (catchUp); a store read that fails leaves the
// connection open (storeLater).
func (c *Conn) catchUpOrLater(ctx context.Context) error {
	if err := c.catchUp(ctx); errors.Is(err, errStoreRead) {
		return c.storeLater(ctx, err)
	} else if err != nil {
		return err
	}
	return nil
}

// takeCheck reports whether a check wake-up is due, and clears it: a check
// asked for from here on reads the row again.
func (c *Conn) takeCheck() bool {
	return c.checkDue.Swap(false)
}

// check reads the session's row and closes the connection when it shows
// it superseded (a check wake-up: the row changed on another instance). A
// read that fails leaves the check due: the next expiry check reads the row
// (checkLater).
func (c *Conn) check(ctx context.Context) error {
	d, err := c.stillCurrent(ctx)
	if err != nil {
		c.h.checkLater(c)
		return c.storeLater(ctx, err)
	}
	if d == nil {
		return nil
	}
	c.kick(*d)
	return c.closeKicked()
}

// errStoreRead marks a writer's store read that failed: the store is
// unreachable, or failing over.
var errStoreRead = errors.New("read the store")

// storeLater answers a store read that failed on a live connection (a
// catch-up or a check): the connection stays open, since the signals are
// durable and the next wake-up or the pending sweep reads again once the
// store answers (a check: the expiry check, see checkLater). Closing it
// would send every receiving client of an outage or a failover into a
// redial at once. A cancelled ctx still ends it.
func (c *Conn) storeLater(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	c.h.log.Warn("websocket writer: store read failed; a wake-up, the expiry check or the pending sweep reads again",
		KeyAttrs(c.key), "err", err)
	return nil
}

// wrote records that the signal seq is written.
func (c *Conn) wrote(seq int64) {
	c.last = seq
	c.written.Store(seq)
}

// catchUp writes every stored unacknowledged signal after c.last, in seq
// order, once it has checked that they are the signals of c's session
// incarnation (stillCurrent). The store holds them all, so queue items are
// redundant while it runs: it drops them as it goes (a live send racing a
// long replay must not fill the queue and close a healthy consumer with
// 4429), and reads once more when it dropped any, so none is left for the
// next wake-up.
func (c *Conn) catchUp(ctx context.Context) error {
	dropQueued := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		dropped := len(c.queue) > 0
		c.queue = nil
		return dropped
	}
	for {
		// Items queued before the read are covered by it; only those dropped
		// while writing call for another read.
		dropQueued()
		dropped := false
		rctx, cancel := context.WithTimeout(ctx, c.h.cfg.StoreTimeout)
		sigs, err := c.h.store.PendingSignals(rctx, c.key, c.last, catchUpPage)
		cancel()
		if err == nil && len(sigs) > 0 {
			// The store keys signals by session key only: those just read
			// may be a later incarnation's, when the session was
			// deregistered and registered again. Checked after the read, so
			// a match means they were this incarnation's when read.
			var d *Disconnect
			if d, err = c.stillCurrent(ctx); err == nil && d != nil {
				c.kick(*d)
				return c.closeKicked()
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// The store is unreachable: nothing is lost (the caller decides
			// whether the connection ends).
			return fmt.Errorf("%w: %w", errStoreRead, err)
		}
		for _, sig := range sigs {
			select {
			case <-c.kicked:
				return c.closeKicked()
			default:
			}
			if err := c.writeSignal(sig); err != nil {
				return err
			}
			c.wrote(sig.Seq)
			dropped = dropQueued() || dropped
		}
		if len(sigs) < catchUpPage && !dropped {
			return nil
		}
	}
}

func (c *Conn) closeKicked() error {
	d, _ := c.kickedBy()
	if err := c.ws.Close(d.Code, d.Reason); err != nil {
		c.h.log.Debug("close after kick", KeyAttrs(c.key), "err", err)
	}
	return errConnEnded
}

// frameBufs holds the buffers signal frames are encoded into: a push
// allocates none. Buffers past maxPooledFrame (a large payload's) are left
// to the GC rather than kept.
var frameBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

const maxPooledFrame = 16 << 10

func (c *Conn) writeSignal(sig sessionstore.Signal) error {
	bp := frameBufs.Get().(*[]byte)
	b, err := appendSignalFrame((*bp)[:0], sig)
	if err == nil {
		err = c.write(b) // the library keeps nothing of b once it returns
	}
	if cap(b) <= maxPooledFrame {
		*bp = b[:0]
		frameBufs.Put(bp)
	}
	return err
}

func (c *Conn) writeJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.write(b)
}

// writeBound bounds each of a connection's frame writes by WriteTimeout and
// ends a write under way when the connection's context ends, as a context
// per write would, without allocating a context, a timer and the library's
// watch on that context for every frame: one timer and one watch on c.ctx,
// made on the first write, serve them all. Only the writer uses it.
type writeBound struct {
	once     sync.Once
	timer    *time.Timer // armed while a write is under way
	writing  atomic.Bool // a write is under way
	timedOut atomic.Bool // the timer closed the connection
}

// arm makes c's timer and its watch on c.ctx, once: either closes the
// connection if it finds a write under way.
func (w *writeBound) arm(c *Conn) {
	w.once.Do(func() {
		w.timer = time.AfterFunc(time.Hour, func() {
			if w.writing.Load() {
				w.timedOut.Store(true)
				c.ws.CloseNow()
			}
		})
		w.timer.Stop()
		context.AfterFunc(c.ctx, func() {
			if w.writing.Load() {
				c.ws.CloseNow()
			}
		})
	})
}

// write writes b as one text frame, within WriteTimeout, unless c.ctx has
// ended; a write cut short by either closes the connection.
func (c *Conn) write(b []byte) error {
	w := &c.wb
	w.arm(c)
	w.writing.Store(true)
	defer w.writing.Store(false)
	// Checked once writing is set: c.ctx ending from here on finds it set.
	if err := c.ctx.Err(); err != nil {
		return err
	}
	w.timer.Reset(c.h.cfg.WriteTimeout)
	// A context that never ends: the library then sets up no watch of its
	// own; w's timer and watch end the write instead.
	err := c.ws.Write(context.Background(), websocket.MessageText, b)
	w.timer.Stop()
	if err != nil && w.timedOut.Load() {
		return fmt.Errorf("write a frame: %w: %w", context.DeadlineExceeded, err)
	}
	return err
}
