package hub

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"

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

// wakeMetrics count the wake-up traffic of this instance.
type wakeMetrics struct {
	wakeups  *prometheus.CounterVec
	connects prometheus.Counter
	sweeps   prometheus.Counter
}

func newWakeMetrics(r prometheus.Registerer) (*wakeMetrics, error) {
	m := &wakeMetrics{
		wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marconi_wakeups_total",
			Help: "Cross-instance wake-ups by result: published, publish_failed (the pending sweep delivers), received.",
		}, []string{"result"}),
		connects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_wake_listener_connects_total",
			Help: "Times the wake-up listener started listening; more than one means reconnects, each followed by a wake of every local queue.",
		}),
		sweeps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_pending_sweeps_total",
			Help: "Runs of the pending sweep, which wakes every queue attached to this instance.",
		}),
	}
	for _, r := range []string{"published", "publish_failed", "received"} {
		m.wakeups.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.wakeups, m.connects, m.sweeps} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// countingBus counts what is published on the bus it wraps.
type countingBus struct {
	fabric.Bus
	m *wakeMetrics
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

// listenWakes runs the bus listener for this instance until ctx ends.
func (s *Server) listenWakes(ctx context.Context) error {
	return s.bus.Listen(ctx, s.cfg.InstanceID,
		func(k sessionstore.Key, _ int64) {
			s.wakeMetrics.wakeups.WithLabelValues("received").Inc()
			s.WakeLocal(k)
		},
		func() {
			s.wakeMetrics.connects.Inc()
			s.wakeAll()
		})
}

// sweepPending is one run of the pending sweep: reconcile, then wake.
func (s *Server) sweepPending(ctx context.Context) {
	s.wakeMetrics.sweeps.Inc()
	s.reconcile(ctx)
	s.wakeAll()
}

// reconcile checks every connection attached here against its session's
// store row, one read each, and kicks those the row shows superseded. A
// failed read ends this run; the next sweep starts over.
func (s *Server) reconcile(ctx context.Context) {
	for _, c := range s.registry.all() {
		if c.closing() {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
		sess, err := s.store.GetSession(rctx, c.key, s.now())
		cancel()
		switch {
		case errors.Is(err, sessionstore.ErrNotFound):
			c.kick(statusSessionExpired, reasonSessionGone, "deregistered")
		case err != nil:
			// Most likely the store is unreachable: stop here rather than
			// wait out a timeout per connection; the next sweep starts over.
			if ctx.Err() == nil {
				s.log.Debug("reconcile connections with their sessions", keyAttrs(c.key), "err", err)
			}
			return
		default:
			s.superseded(c, sess)
		}
	}
}

// wakeAll asks every queue attached here to catch up from the store. Unlike
// a send, it never closes a full queue: a full queue's writer is busy with
// queued work, and the next sweep comes back to it.
func (s *Server) wakeAll() {
	for _, c := range s.registry.all() {
		select {
		case c.out <- queueItem{}:
		default:
		}
	}
}
