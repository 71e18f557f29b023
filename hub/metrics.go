package hub

import "github.com/prometheus/client_golang/prometheus"

// metrics are the hub's own series; signals and fabric register theirs.
type metrics struct {
	registryErrors prometheus.Counter
	registrations  *prometheus.CounterVec
	connections    prometheus.Gauge
	disconnects    *prometheus.CounterVec
	queueDrops     *prometheus.CounterVec
	pruned         *prometheus.CounterVec
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		registryErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_registry_errors_total",
			Help: "Requests answered 503 registry_unavailable because the store could not be reached.",
		}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marconi_registrations_total",
			Help: "Session registrations by result (created, resumed).",
		}, []string{"result"}),
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
		pruned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marconi_pruned_total",
			Help: "Rows removed by the retention loop, by kind (signals, sessions).",
		}, []string{"kind"}),
	}
	for _, r := range []string{"client_closed", "connection_lost", "ping_timeout", "replaced", "slow_consumer", "deregistered", "shutdown", "message_too_big", "affinity_reset"} {
		m.disconnects.WithLabelValues(r)
	}
	m.queueDrops.WithLabelValues("slow_consumer")
	m.pruned.WithLabelValues("signals")
	m.pruned.WithLabelValues("sessions")
	for _, c := range []prometheus.Collector{m.registryErrors, m.registrations, m.connections, m.disconnects, m.queueDrops, m.pruned} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	m.registrations.WithLabelValues("created")
	m.registrations.WithLabelValues("resumed")
	return m, nil
}
