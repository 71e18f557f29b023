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
			Help: "Times the wake-up listener started listening; more than one means reconnects, each followed by a wake of every local queue.",
		}),
		sweeps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_pending_sweeps_total",
			Help: "Runs of the pending sweep, which checks every queue attached to this instance against the store and wakes those with signals left to write.",
		}),
	}
	for _, l := range disconnectLabels {
		m.disconnects.WithLabelValues(l)
	}
	m.queueDrops.WithLabelValues("slow_consumer")
	for _, r := range []string{"published", "publish_failed", "received", "carried"} {
		m.wakeups.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.connections, m.disconnects, m.queueDrops, m.wakeups, m.connects, m.sweeps} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
