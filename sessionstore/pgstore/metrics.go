package pgstore

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
)

// batchMetrics describe the group commit: how much each transaction
// carries, how often Postgres refused a batch whole so that its members
// ran again one by one (each then a transaction of its own, the cost a
// contended fleet pays), and how many appends the batch's one statement
// left to a statement each, in a transaction after the batch's.
type batchMetrics struct {
	size   prometheus.Histogram
	reruns *prometheus.CounterVec
	alone  prometheus.Counter
}

// Rerun reasons (the reason label of marconi_store_batch_reruns_total).
const (
	rerunDeadlock = "deadlock" // Postgres aborted the batch to break a deadlock
	rerunQuota    = "quota"    // the batch would take a project past its pending-bytes limit
	rerunRefused  = "refused"  // any other error of one member (a value Postgres refused)
)

func newBatchMetrics() *batchMetrics {
	m := &batchMetrics{
		size: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "marconi_store_batch_size",
			Help:    "Requests (appends, acknowledgements, session-row writes) committed by one group commit of the Postgres store.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}),
		reruns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marconi_store_batch_reruns_total",
			Help: "Group commits Postgres refused whole, whose members then ran again one by one, by reason.",
		}, []string{"reason"}),
		alone: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_store_appends_alone_total",
			Help: "Appends the statement of their group commit's appends did not store (refused, a duplicate, a recipient changed or gone), run again each by a statement of its own, in a transaction after the group commit's.",
		}),
	}
	for _, r := range []string{rerunDeadlock, rerunQuota, rerunRefused} {
		m.reruns.WithLabelValues(r) // present from the start
	}
	return m
}

// register registers m with reg; nil registers nowhere.
func (m *batchMetrics) register(reg prometheus.Registerer) error {
	return registerAll(reg, m.size, m.reruns, m.alone)
}

// connectCounters count the connects of the two dedicated connections of
// the store's buses (Listen), each in a series of its own: a reconnect of
// either is a window in which the other alone holds the process's liveness
// lock.
type connectCounters struct {
	listener, liveness prometheus.Counter
}

func newConnectCounters() connectCounters {
	return connectCounters{
		listener: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_pg_listener_connects_total",
			Help: "Times the Postgres wake-up listener's connection (marconi-wake-listener) started listening; more than one means reconnects, each losing the wake-ups sent meanwhile (the pending sweep delivers them). Unlike marconi_wake_listener_connects_total, it never counts the NATS bus's events.",
		}),
		liveness: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_liveness_connects_total",
			Help: "Times the liveness connection (marconi-liveness) connected to Postgres; more than one means reconnects, each a window in which the wake-up listener's connection alone keeps this process alive to its peers.",
		}),
	}
}

// registerAll registers cs with reg; nil registers nowhere.
func registerAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// rerunReason names why Postgres refused a batch whole (err a server error).
func rerunReason(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case codeDeadlock:
			return rerunDeadlock
		case quotaSQLState:
			return rerunQuota
		}
	}
	return rerunRefused
}
