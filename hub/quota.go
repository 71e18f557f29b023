package hub

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi"
)

// quotaMetrics counts every quota refusal, by quota.
type quotaMetrics struct {
	refusals *prometheus.CounterVec
}

func newQuotaMetrics(r prometheus.Registerer) (*quotaMetrics, error) {
	m := &quotaMetrics{refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "marconi_quota_refusals_total",
		Help: "Requests and connections refused because a quota was exceeded, by quota (docs/security.md).",
	}, []string{"quota"})}
	for _, q := range marconi.Quotas {
		m.refusals.WithLabelValues(string(q))
	}
	if err := r.Register(m.refusals); err != nil {
		return nil, err
	}
	return m, nil
}

// QuotaRefused counts one refusal of quota q in marconi_quota_refusals_total.
// Refusals answered through the hub's error handler (the connection caps
// included) are counted there; the connection layer calls this for those it
// answers itself (a frame-rate close). An unknown quota is not counted, so the label set stays
// the bounded list marconi.Quotas.
func (s *Server) QuotaRefused(q marconi.Quota) {
	for _, known := range marconi.Quotas {
		if q == known {
			s.quotas.refusals.WithLabelValues(string(q)).Inc()
			return
		}
	}
	s.log.Warn("quota refusal with an unknown quota name", "quota", string(q))
}
