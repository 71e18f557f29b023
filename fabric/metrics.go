package fabric

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are this instance's fabric series. The fabric summary's totals
// are the cluster-wide counterparts, kept in the store.
type metrics struct {
	fallbacks          prometheus.Counter
	reassignments      prometheus.Counter
	adaptivePlacements prometheus.Counter
	mismatches         prometheus.Counter
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
		m.rolledBack, m.signalsDropped} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// healthCollector is marconi_instance_healthy, read from the health view at
// each scrape, after a probe when none was tried within ProbeEvery (fresh):
// it follows the liveness probe and a heartbeat growing old as soon as they
// change the view, not only the refresh every HeartbeatEvery.
type healthCollector struct{ m *Members }

var healthDesc = prometheus.NewDesc("marconi_instance_healthy",
	"1 when the instance is healthy as this instance sees it (fresh heartbeat, not draining, process not seen gone by the liveness probe), else 0; one series per row of the instance table.",
	[]string{"instance_id"}, nil)

// Describe implements prometheus.Collector.
func (healthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- healthDesc }

// Collect implements prometheus.Collector.
func (c healthCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.fresh(context.Background()) // the prober bounds its call by the store timeout
	now := c.m.now()
	c.m.mu.RLock()
	defer c.m.mu.RUnlock()
	for id, in := range c.m.instances {
		v := 0.0
		if c.m.healthyAt(in, now) {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(healthDesc, prometheus.GaugeValue, v, id)
	}
}
