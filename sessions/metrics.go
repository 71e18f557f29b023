package sessions

import "github.com/prometheus/client_golang/prometheus"

// metrics are the service's series.
type metrics struct {
	registrations *prometheus.CounterVec
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marconi_registrations_total",
			Help: "Session registrations by result (created, resumed, retried).",
		}, []string{"result"}),
	}
	for _, o := range []Outcome{OutcomeCreated, OutcomeResumed, OutcomeRetried} {
		m.registrations.WithLabelValues(string(o))
	}
	if err := r.Register(m.registrations); err != nil {
		return nil, err
	}
	return m, nil
}
