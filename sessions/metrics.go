package sessions

import "github.com/prometheus/client_golang/prometheus"

// metrics are the service's series.
type metrics struct {
	registrations *prometheus.CounterVec
	takeovers     prometheus.Counter
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marconi_registrations_total",
			Help: "Session registrations by result (created, resumed, retried).",
		}, []string{"result"}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_session_takeovers_total",
			Help: "Live sessions taken over by a registration with takeover true and the project's API key.",
		}),
	}
	for _, o := range []Outcome{OutcomeCreated, OutcomeResumed, OutcomeRetried} {
		m.registrations.WithLabelValues(string(o))
	}
	for _, c := range []prometheus.Collector{m.registrations, m.takeovers} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
