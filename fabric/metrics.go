package fabric

import "github.com/prometheus/client_golang/prometheus"

// metrics are this instance's fabric series. The fabric summary's totals
// are the cluster-wide counterparts, kept in the store.
type metrics struct {
	fallbacks          prometheus.Counter
	reassignments      prometheus.Counter
	adaptivePlacements prometheus.Counter
	mismatches         prometheus.Counter
	instanceHealthy    *prometheus.GaugeVec
	rolledBack         prometheus.Gauge
	signalsDropped     *prometheus.CounterVec
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		fallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_fabric_fallbacks_total",
			Help: "Sticky sessions this instance took over because their assigned instance was unhealthy.",
		}),
		reassignments: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_fabric_reassignments_total",
			Help: "Sticky sessions this instance placed anew because they had no queue for longer than the reconnect grace window.",
		}),
		adaptivePlacements: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_adaptive_placements_total",
			Help: "New sessions whose runtime mode this instance took from the adaptive classifier.",
		}),
		mismatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_adaptive_placement_mismatches_total",
			Help: "Adaptive placement mismatches reported to this instance (POST /v1/placement-mismatch).",
		}),
		instanceHealthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "marconi_instance_healthy",
			Help: "1 when the instance is healthy as this instance sees it (fresh heartbeat, not draining), else 0; one series per row of the instance table.",
		}, []string{"instance_id"}),
		rolledBack: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "marconi_adaptive_placement_rolled_back",
			Help: "1 once the adaptive gate rolled back (MARCONI_ADAPTIVE_ROLLBACK_AFTER mismatches), else 0.",
		}),
		signalsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marconi_signals_dropped_total",
			Help: "Pending signals discarded without delivery, by reason (affinity_reset: disconnect policy drop).",
		}, []string{"reason"}),
	}
	m.signalsDropped.WithLabelValues("affinity_reset")
	for _, c := range []prometheus.Collector{m.fallbacks, m.reassignments, m.adaptivePlacements, m.mismatches,
		m.instanceHealthy, m.rolledBack, m.signalsDropped} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
