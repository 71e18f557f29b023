package hub

import "github.com/prometheus/client_golang/prometheus"

// metrics are the hub's own series; signals and fabric register theirs.
type metrics struct {
	registryErrors prometheus.Counter
	pruned         *prometheus.CounterVec
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		registryErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_registry_errors_total",
			Help: "Requests answered 503 registry_unavailable because the store could not be reached.",
		}),
		pruned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marconi_pruned_total",
			Help: "Rows removed by the retention loop, by kind (signals, sessions).",
		}, []string{"kind"}),
	}
	m.pruned.WithLabelValues("signals")
	m.pruned.WithLabelValues("sessions")
	for _, c := range []prometheus.Collector{m.registryErrors, m.pruned} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
