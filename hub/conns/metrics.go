package conns

import "github.com/prometheus/client_golang/prometheus"

// metrics are the connection hub's series.
type metrics struct {
	connections prometheus.Gauge
	disconnects *prometheus.CounterVec
	queueDrops  *prometheus.CounterVec
	wakeups     *prometheus.CounterVec
	connects    prometheus.Counter
	sweeps      prometheus.Counter
	rewinds     prometheus.Counter
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "marconi_ws_connections",
			Help: "WebSocket connections attached to this instance.",
		}),
		disconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marconi_ws_disconnects_total",
			Help: "WebSocket connections ended, by reason.",
		}, []string{"reason"}),
		queueDrops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marconi_queue_drops_total",
			Help: "Signals not pushed to a WebSocket queue, by reason; each stays durable in the store.",
		}, []string{"reason"}),
		wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marconi_wakeups_total",
			Help: "Cross-instance wake-ups by result: published, publish_failed (the pending sweep delivers), received, and carried (received with its signal, queued for the connection without a store read).",
		}, []string{"result"}),
		connects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_wake_listener_connects_total",
			Help: "Times the wake-up listener started listening, or caught up after the NATS bus reconnected or dropped wake-ups; each is followed by a wake of every local queue. marconi_pg_listener_connects_total counts the Postgres listener's connects alone.",
		}),
		sweeps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_pending_sweeps_total",
			Help: "Runs of the pending sweep, which checks every queue attached to this instance against the store and wakes those with signals left to write.",
		}),
		rewinds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_ws_rewinds_total",
			Help: "WebSocket connections asked to write their session's unacknowledged signals again because the store's history changed (a standby promoted, a restore), which may have given lost signals' seqs to new ones.",
		}),
	}
	for _, l := range disconnectLabels {
		m.disconnects.WithLabelValues(l)
	}
	m.queueDrops.WithLabelValues("slow_consumer")
	for _, r := range []string{"published", "publish_failed", "received", "carried"} {
		m.wakeups.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.connections, m.disconnects, m.queueDrops, m.wakeups, m.connects, m.sweeps, m.rewinds} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
