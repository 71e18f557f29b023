package signals

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi"
)

type metrics struct {
	sent *prometheus.CounterVec
	// sentBy is sent's series of each Delivery, resolved once: a send
	// counts itself without hashing its label.
	sentBy      map[marconi.Delivery]prometheus.Counter
	duplicates  prometheus.Counter
	acked       prometheus.Counter
	sendSeconds prometheus.Histogram
	// recipients counts how a send found its recipient: hit, read recently
	// and the append found it unchanged; miss, read from the store;
	// changed, read recently but the append found it changed, so read
	// again. Its three series are resolved once.
	recipients                  *prometheus.CounterVec
	recipientHit, recipientMiss prometheus.Counter
	recipientChanged            prometheus.Counter
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marconi_signals_sent_total",
			Help: "Signals stored by a send, by delivery classification.",
		}, []string{"delivery"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_signals_duplicate_total",
			Help: "Sends answered from an earlier signal with the same idempotency key.",
		}),
		acked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_signals_acked_total",
			Help: "Signals acknowledged by their recipients.",
		}),
		sendSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "marconi_send_duration_seconds",
			Help:    "Time to handle a send, from validation to the answer (excluding HTTP).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		recipients: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marconi_send_recipient_lookups_total",
			Help: "How sends found their recipient: hit (read recently, unchanged), miss (read from the store), changed (read recently but changed since: read again).",
		}, []string{"result"}),
	}
	for _, c := range []prometheus.Collector{m.sent, m.duplicates, m.acked, m.sendSeconds, m.recipients} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	m.sentBy = make(map[marconi.Delivery]prometheus.Counter, len(marconi.Deliveries))
	for _, d := range marconi.Deliveries {
		m.sentBy[d] = m.sent.WithLabelValues(string(d))
	}
	m.recipientHit = m.recipients.WithLabelValues("hit")
	m.recipientMiss = m.recipients.WithLabelValues("miss")
	m.recipientChanged = m.recipients.WithLabelValues("changed")
	return m, nil
}

// countSent counts a signal stored with delivery d.
func (m *metrics) countSent(d marconi.Delivery) {
	if c, ok := m.sentBy[d]; ok {
		c.Inc()
		return
	}
	m.sent.WithLabelValues(string(d)).Inc()
}
