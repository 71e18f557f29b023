package pgstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// witness keeps what the store's statements and connections saw, for
// Witness: failures that found Postgres unavailable (isUnavailable), and
// the last write it accepted. It is the tracer of every connection the
// store opens (the pool's, Reachable's, the bus listener's), so no call
// escapes it. It is safe for concurrent use.
type witness struct {
	failures atomic.Uint64

	mu           sync.Mutex
	wrote        bool
	lastWrite    time.Time // read with its monotonic clock
	failuresThen uint64    // failures when the last write was accepted
}

var (
	_ pgx.QueryTracer       = (*witness)(nil)
	_ pgx.BatchTracer       = (*witness)(nil)
	_ pgx.ConnectTracer     = (*witness)(nil)
	_ pgxpool.AcquireTracer = (*witness)(nil)
)

// Witness says what the store's own statements have seen, for /readyz,
// at the cost of no statement: sinceWrite, how long ago Postgres last
// accepted an INSERT, UPDATE or DELETE with no failure counted since
// (negative when there is none; a standby or a read-only primary refuses
// a write before touching a row, so an accepted one proves the store
// reachable and writable as SHOW transaction_read_only would); and
// failures, how many statements, connections or waits for a pooled
// connection found the store unavailable since Open (what the store's
// calls return as ErrUnavailable), a count that only grows. A write counts
// whether or not its transaction then committed: it is the server's
// answer that matters.
func (s *Store) Witness() (sinceWrite time.Duration, failures uint64) {
	w := s.witness
	w.mu.Lock()
	defer w.mu.Unlock()
	failures = w.failures.Load()
	if !w.wrote || w.failuresThen != failures {
		return -1, failures
	}
	return time.Since(w.lastWrite), failures
}

// saw keeps one statement's outcome: a failure when err says the store is
// unavailable, a write when it succeeded as one. Other errors (a conflict,
// a bad value, a caller that gave up) say nothing of the store.
func (w *witness) saw(tag pgconn.CommandTag, err error) {
	switch {
	case err != nil:
		if isUnavailable(err) && !errors.Is(err, context.Canceled) {
			w.failures.Add(1)
		}
	case tag.Insert() || tag.Update() || tag.Delete():
		w.mu.Lock()
		w.wrote, w.lastWrite, w.failuresThen = true, time.Now(), w.failures.Load()
		w.mu.Unlock()
	}
}

// TraceQueryStart implements pgx.QueryTracer.
func (w *witness) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (w *witness) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	w.saw(d.CommandTag, d.Err)
}

// TraceBatchStart implements pgx.BatchTracer.
func (w *witness) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (w *witness) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	w.saw(d.CommandTag, d.Err)
}

// TraceBatchEnd implements pgx.BatchTracer.
func (w *witness) TraceBatchEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchEndData) {
	w.saw(pgconn.CommandTag{}, d.Err)
}

// TraceConnectStart implements pgx.ConnectTracer.
func (w *witness) TraceConnectStart(ctx context.Context, _ pgx.TraceConnectStartData) context.Context {
	return ctx
}

// TraceConnectEnd implements pgx.ConnectTracer.
func (w *witness) TraceConnectEnd(_ context.Context, d pgx.TraceConnectEndData) {
	w.saw(pgconn.CommandTag{}, d.Err)
}

// TraceAcquireStart implements pgxpool.AcquireTracer.
func (w *witness) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	return ctx
}

// TraceAcquireEnd implements pgxpool.AcquireTracer.
func (w *witness) TraceAcquireEnd(_ context.Context, _ *pgxpool.Pool, d pgxpool.TraceAcquireEndData) {
	w.saw(pgconn.CommandTag{}, d.Err)
}
