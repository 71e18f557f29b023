package conns

import (
	"context"

	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/sessionstore"
)

// Cross-instance delivery. A send that stores a signal for a queue held by
// another instance publishes a wake-up on the bus (Deliver → fabric.Wake →
// Bus.Publish); the holder's listener hands it to WakeLocal and the queue's
// writer catches up from the store. The pending sweep reads, on a slow
// timer, how far every local queue's session has signals (one store read
// per batch of queues) and wakes each queue that has not written them all,
// so a lost wake-up delays a signal, never loses it.
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

func (b countingBus) Publish(ctx context.Context, instance string, k sessionstore.Key, seq int64) error {
	err := b.Bus.Publish(ctx, instance, k, seq)
	if err != nil {
		b.m.wakeups.WithLabelValues("publish_failed").Inc()
	} else {
		b.m.wakeups.WithLabelValues("published").Inc()
	}
	return err
}

// CountBus wraps bus so that what is published on it is counted in
// marconi_wakeups_total.
func (h *Hub) CountBus(bus fabric.Bus) fabric.Bus { return countingBus{Bus: bus, m: h.metrics} }

// Listen runs the bus listener for this instance until ctx ends.
func (h *Hub) Listen(ctx context.Context, bus fabric.Bus) error {
	return bus.Listen(ctx, h.cfg.InstanceID,
		func(k sessionstore.Key, seq int64) {
			h.metrics.wakeups.WithLabelValues("received").Inc()
			if seq == fabric.CheckSeq {
				h.check(k)
				return
			}
			h.WakeLocal(k)
		},
		func() {
			h.metrics.connects.Inc()
			h.wakeAll()
		})
}

// WakeLocal is how the fabric hands a cross-instance wake-up to this
// instance: the session's writer catches up from the store (and checks,
// before it writes, that the signals are its incarnation's).
func (h *Hub) WakeLocal(k sessionstore.Key) {
	h.offer(h.registry.get(k), queueItem{})
}

// check asks k's connection here, if any, to check itself against its
// session's store row (its writer reads it: the listener never waits on the
// store). A full queue is left to the sweep.
func (h *Hub) check(k sessionstore.Key) {
	if c := h.registry.get(k); c != nil && !c.closing() && c.enqueue(queueItem{check: true}) {
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
	open := make([]*Conn, 0, len(cs))
	keys := make([]sessionstore.Key, 0, len(cs))
	for _, c := range cs {
		if !c.closing() {
			open = append(open, c)
			keys = append(keys, c.key)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, h.cfg.StoreTimeout)
	heads, err := h.store.SessionHeads(rctx, keys, h.now())
	cancel()
	if err != nil {
		return err
	}
	for _, c := range open {
		head, ok := heads[c.key]
		if !ok {
			c.kick(DisconnectSessionGone)
			continue
		}
		h.reconcile(c, head.Session)
		// Written is read after the row: a signal written since the read
		// only makes the wake-up one the writer finds nothing for.
		if !c.closing() && head.LastSeq > max(head.AckedSeq, c.written.Load()) && c.enqueue(queueItem{}) {
			c.wake()
		}
	}
	return nil
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
