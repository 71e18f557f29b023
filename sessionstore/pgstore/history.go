package pgstore

import (
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// The store's history (sessionstore.Historian). Postgres numbers the
// histories of a cluster: each promotion of a standby, and each recovery to
// a point in time, starts a new timeline. A standby replicated
// asynchronously, once promoted, may lack the last commits of the primary it
// replaces: signals answered 200 are gone with the seqs they took, and the
// recipients' next signals take those seqs again. A connection that wrote
// the lost ones would skip the new ones as written, and an ack of the lost
// ones would acknowledge the new ones unseen. Every new pooled connection
// therefore reads its server's system identifier and timeline, in the
// statement that applies its planner settings (no round trip more), and
// the store counts the distinct ones: the hub's connections catch up from
// their sessions' acknowledged seq when the count moves, and acks read
// under an earlier count are refused (sendBatch). A server still in
// recovery (a standby the URL named alone) tells nothing: it takes no
// writes, and its history is read once it is promoted and connected to
// again.
//
// What it cannot see: a pooler in front (PgBouncer) that moves its server
// connections to another server while the store's connections to it stay
// open; then the history is that of the server the pooler first reached.

// historySQL is the server's history, NULL during recovery: its system
// identifier and its timeline (the first 8 hex digits of the WAL file name
// at the current WAL position).
const historySQL = `CASE WHEN pg_is_in_recovery() THEN NULL
	ELSE (SELECT system_identifier::text FROM pg_control_system()) || '/' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END`

// history counts the server histories the store's connections found.
type history struct {
	cur     atomic.Pointer[historyMark] // nil before the first
	mu      sync.Mutex
	last    string // the latest history seen; "" before the first
	changes prometheus.Counter
}

// historyMark is one history the store's connections found: its number
// (History) and its token (HistoryToken), read together.
type historyMark struct {
	n     uint64
	token string
}

func newHistory() *history {
	return &history{changes: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "marconi_store_history_changes_total",
		Help: "Times this instance's store connections found Postgres on another history than before (a standby promoted, a restore to a point in time, another cluster): each makes its WebSockets catch up again from their sessions' acknowledged seq, since an asynchronous standby may lack the signals they wrote last.",
	})}
}

// saw records the history a new connection found; nil (recovery) tells
// nothing.
func (h *history) saw(id *string) {
	if id == nil || *id == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if *id == h.last {
		return
	}
	if h.last != "" {
		h.changes.Inc()
	}
	h.last = *id
	h.cur.Store(&historyMark{n: h.load().n + 1, token: historyToken(*id)})
}

// load is the current history; zero before the first.
func (h *history) load() historyMark {
	if m := h.cur.Load(); m != nil {
		return *m
	}
	return historyMark{}
}

// historyToken is the token clients are told for the server history id:
// a digest, so that it names the history without telling the server's
// system identifier, the same on every instance that reads the same id.
func historyToken(id string) string {
	sum := sha256.Sum256([]byte("marconi history " + id))
	return hex.EncodeToString(sum[:8])
}

// History is HistoryToken's number: 1 from the first connection, one more
// for each change of the server's history since; 0 before any connection.
func (s *Store) History() uint64 { return s.hist.load().n }

// HistoryToken implements sessionstore.Historian.
func (s *Store) HistoryToken() (uint64, string) {
	m := s.hist.load()
	return m.n, m.token
}
