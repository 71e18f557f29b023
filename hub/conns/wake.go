package conns

import (
	"context"
	"errors"

	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/sessionstore"
)

// Cross-instance delivery. A send that stores a signal for a queue held by
// another instance publishes a wake-up on the bus (Deliver → fabric.Wake →
// Bus.Publish); the holder's listener hands it to WakeLocal and the queue's
// writer catches up from the store. The pending sweep wakes every local
// queue on a slow timer, so a lost wake-up delays a signal, never loses it.
//
// The same sweep reconciles every local connection with its session's store
// row, which is how a change made on another instance reaches a WebSocket
// held here without a cross-instance message: a session deregistered there
// (row gone) or registered again (another incarnation) closes it with 4410,
// a newer attach there (the row's queue is another instance's, attached
// later) closes it with 4409. Sends, acks and catch-ups check the same
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
		func(k sessionstore.Key, _ int64) {
			h.metrics.wakeups.WithLabelValues("received").Inc()
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

// Sweep is one run of the pending sweep: reconcile, then wake.
func (h *Hub) Sweep(ctx context.Context) {
	h.metrics.sweeps.Inc()
	h.reconcileAll(ctx)
	h.wakeAll()
}

// reconcileAll checks every connection attached here against its session's
// store row, one read each, and closes those the row shows superseded. A
// failed read ends this run; the next sweep starts over.
func (h *Hub) reconcileAll(ctx context.Context) {
	for _, c := range h.registry.all() {
		if c.closing() {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, h.cfg.StoreTimeout)
		sess, err := h.store.GetSession(rctx, c.key, h.now())
		cancel()
		switch {
		case errors.Is(err, sessionstore.ErrNotFound):
			c.kick(DisconnectSessionGone)
		case err != nil:
			// Most likely the store is unreachable: stop here rather than
			// wait out a timeout per connection; the next sweep starts over.
			if ctx.Err() == nil {
				h.log.Debug("reconcile connections with their sessions", KeyAttrs(c.key), "err", err)
			}
			return
		default:
			h.reconcile(c, sess)
		}
	}
}

// wakeAll asks every queue attached here to catch up from the store. Unlike
// a send, it never closes a full queue: a full queue's writer is busy with
// queued work, and the next sweep comes back to it.
func (h *Hub) wakeAll() {
	for _, c := range h.registry.all() {
		if c.enqueue(queueItem{}) {
			c.wake()
		}
	}
}
