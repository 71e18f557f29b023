package conns

import (
	"context"
	"time"

	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/sessionstore"
)

// Cross-instance delivery. A send that stores a signal for a queue held by
// another instance publishes a wake-up on the bus (Deliver → publish →
// Bus.Publish), carrying the signal; the holder's listener hands it to
// WakeLocal, which queues the signal itself for the connection of the
// session's incarnation, so the writer pushes it without reading it back.
// The writer keeps seq order: a signal past the one it owes next, or a
// wake-up that carries none, has it catch up from the store.
//
// The pending sweep reads, on a slow timer, how far every local queue's
// session has signals (one store read per batch of queues) and wakes each
// queue that has not written them all, so a lost wake-up delays a signal,
// never loses it.
//
// The same sweep reconciles every local connection with its session's store
// row, which is how a change made on another instance reaches a WebSocket
// held here when its check wake-up (CheckSeq, sent by the instance that
// made the change) is lost: a session deregistered there (row gone) or
// registered again (another incarnation) closes it with 4410, a token
// replaced there (resume, takeover) or a newer attach there (the row's
// queue is another instance's, attached later) closes it with 4409. Sends, acks and catch-ups check the same
// before they use a connection, so the sweep bounds how long a superseded
// connection stays open, not what it sees.

// countingBus counts what is published on the bus it wraps.
type countingBus struct {
	fabric.Bus
	m *metrics
}

func (b countingBus) Publish(ctx context.Context, instance string, w sessionstore.Wake) error {
	err := b.Bus.Publish(ctx, instance, w)
	if err != nil {
		b.m.wakeups.WithLabelValues("publish_failed").Inc()
	} else {
		b.m.wakeups.WithLabelValues("published").Inc()
	}
	return err
}

// publish wakes instance for sig, stored for the session row to, best
// effort: a failure is logged, and the holder's pending sweep delivers the
// signal later.
func (h *Hub) publish(ctx context.Context, instance string, to sessionstore.Session, sig *sessionstore.Signal) {
	w := sessionstore.Wake{Key: to.Key, Seq: sig.Seq, Signal: sig, Incarnation: to.RegisteredAt}
	if err := h.bus.Publish(ctx, instance, w); err != nil {
		h.log.Warn("cross-instance wake-up not sent; the pending sweep will deliver the signal",
			"to_instance", instance, KeyAttrs(to.Key), "seq", sig.Seq, "err", err)
	}
}

// Listen runs the bus listener for this instance until ctx ends.
func (h *Hub) Listen(ctx context.Context) error {
	return h.bus.Listen(ctx, h.cfg.InstanceID, h.cfg.StartedAt,
		func(w sessionstore.Wake) {
			h.metrics.wakeups.WithLabelValues("received").Inc()
			if w.Seq == fabric.CheckSeq {
				h.check(w.Key)
				return
			}
			h.WakeLocal(w)
		},
		func() {
			h.metrics.connects.Inc()
			h.wakeAll()
		})
}

// WakeLocal is how the bus hands a cross-instance wake-up to this
// instance. A carried signal is queued for the session's connection when
// that connection is of w's incarnation; otherwise the writer catches up
// from the store (and checks, before it writes, that the signals are its
// incarnation's).
func (h *Hub) WakeLocal(w sessionstore.Wake) {
	c := h.registry.get(w.Key)
	it := queueItem{}
	if w.Signal != nil && w.Signal.Seq == w.Seq && c != nil && c.incarnation.Equal(w.Incarnation) {
		it.sig = w.Signal
		h.metrics.wakeups.WithLabelValues("carried").Inc()
	}
	h.offer(c, it)
}

// check asks k's connection here, if any, to check itself against its
// session's store row (its writer reads it: the listener never waits on the
// store). The ask is a flag beside the queue, not an item on it, so a full
// queue does not lose it, and any number of checks cost one read.
func (h *Hub) check(k sessionstore.Key) {
	if c := h.registry.get(k); c != nil && !c.closing() {
		c.checkDue.Store(true) // before wake's lock: a writer ending under it sees the flag, or wake starts one
		c.wake()
	}
}

// sweepBatch is how many connections one store read of the pending sweep
// covers, so that each read stays small under StoreTimeout.
const sweepBatch = 1000

// Sweep is one run of the pending sweep: for every connection attached
// here it reads the session's row and seqs, a batch of connections per
// store read (SessionHeads), closes those the row shows superseded, and
// wakes those whose session has a signal past what they have written. A
// failed read ends this run; the next sweep starts over.
func (h *Hub) Sweep(ctx context.Context) {
	h.metrics.sweeps.Inc()
	cs := h.registry.all()
	for len(cs) > 0 {
		n := min(len(cs), sweepBatch)
		if err := h.sweep(ctx, cs[:n]); err != nil {
			// Most likely the store is unreachable: stop here rather than
			// wait out a timeout per batch; the next sweep starts over.
			if ctx.Err() == nil {
				h.log.Debug("sweep connections", "connections", len(cs), "err", err)
			}
			return
		}
		cs = cs[n:]
	}
}

// sweep reconciles and wakes cs with one store read.
func (h *Hub) sweep(ctx context.Context, cs []*Conn) error {
	cs, heads, err := h.reconcileRows(ctx, cs, h.now(), func(*Conn) Disconnect { return DisconnectSessionGone })
	if err != nil {
		return err
	}
	for _, c := range cs {
		// Written is read after the row: a signal written since the read
		// only makes the wake-up one the writer finds nothing for.
		head := heads[c.key]
		if !c.closing() && head.LastSeq > max(head.AckedSeq, c.written.Load()) && c.enqueue(queueItem{}) {
			c.wake()
		}
	}
	return nil
}

// reconcileRows reads the rows live at now of the connections of cs not
// being closed, in one store read (SessionHeads), closes those without one
// with what gone says, and reconciles the others with theirs, whose expiry
// they know from then on. It returns the connections it read for and the rows.
func (h *Hub) reconcileRows(ctx context.Context, cs []*Conn, now time.Time, gone func(*Conn) Disconnect) ([]*Conn, map[sessionstore.Key]sessionstore.SessionHead, error) {
	open := make([]*Conn, 0, len(cs))
	keys := make([]sessionstore.Key, 0, len(cs))
	for _, c := range cs {
		if !c.closing() {
			open = append(open, c)
			keys = append(keys, c.key)
		}
	}
	if len(keys) == 0 {
		return nil, nil, nil
	}
	rctx, cancel := context.WithTimeout(ctx, h.cfg.StoreTimeout)
	heads, err := h.store.SessionHeads(rctx, keys, now)
	cancel()
	if err != nil {
		return nil, nil, err
	}
	for _, c := range open {
		head, ok := heads[c.key]
		if !ok {
			c.kick(gone(c))
			continue
		}
		c.knowExpiry(head.ExpiresAt)
		h.reconcile(c, head.Session)
	}
	return open, heads, nil
}

// wakeAll asks every queue attached here to catch up from the store, as
// the bus listener does when it (re)connects, having maybe missed
// wake-ups. Unlike a send, it never closes a full queue: a full queue's
// writer is busy with queued work, and the next sweep comes back to it
// (Sweep wakes the same way).
func (h *Hub) wakeAll() {
	for _, c := range h.registry.all() {
		if c.enqueue(queueItem{}) {
			c.wake()
		}
	}
}
