package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/sessionstore"
)

const signalCols = `id, seq, tenant_id, project_id, to_session, from_session, kind, payload,
	created_at, idempotency_key, delivery, route_state`

func scanSignal(row pgx.Row) (sessionstore.Signal, error) {
	var (
		sig     sessionstore.Signal
		payload []byte
		idem    *string
	)
	err := row.Scan(&sig.ID, &sig.Seq, &sig.To.TenantID, &sig.To.ProjectID, &sig.To.SessionID,
		&sig.FromSession, &sig.Kind, &payload, &sig.CreatedAt, &idem, &sig.Delivery, &sig.RouteState)
	if err != nil {
		return sessionstore.Signal{}, err
	}
	if payload != nil {
		sig.Payload = json.RawMessage(payload)
	}
	if idem != nil {
		sig.IdempotencyKey = *idem
	}
	sig.CreatedAt = sig.CreatedAt.UTC()
	return sig, nil
}

// AppendSignal implements sessionstore.Store in one transaction. Bumping the
// recipient's last_seq takes its row lock, which serializes the senders of
// one recipient; a rollback gives the number back, so seq stays gap-free.
// A transaction-scoped advisory lock on (tenant, project, sender, key) makes
// the idempotency check and the insert atomic even for two duplicates sent
// to different recipients at once.
func (s *Store) AppendSignal(ctx context.Context, ns sessionstore.NewSignal, now time.Time) (sessionstore.Signal, bool, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return sessionstore.Signal{}, false, wrap("append signal", err)
	}
	var (
		out sessionstore.Signal
		dup bool
	)
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if ns.IdempotencyKey != "" {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`,
				idempotencyLockKey(ns)); err != nil {
				return err
			}
		}
		var seq int64
		if err := tx.QueryRow(ctx, `UPDATE sessions SET last_seq = last_seq + 1
			WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND expires_at >= $4
			RETURNING last_seq`, ns.To.TenantID, ns.To.ProjectID, ns.To.SessionID, now).Scan(&seq); err != nil {
			return err // pgx.ErrNoRows: no live recipient
		}
		if ns.IdempotencyKey != "" {
			first, err := scanSignal(tx.QueryRow(ctx, `SELECT `+signalCols+` FROM signals
				WHERE tenant_id = $1 AND project_id = $2 AND from_session = $3 AND idempotency_key = $4
				  AND ($5::timestamptz IS NULL OR created_at >= $5)
				ORDER BY created_at DESC, seq DESC LIMIT 1`,
				ns.To.TenantID, ns.To.ProjectID, ns.FromSession, ns.IdempotencyKey, toNull(ns.IdempotencySince)))
			switch {
			case err == nil:
				out, dup = first, true
				return errDuplicate // roll the seq back
			case !errors.Is(err, pgx.ErrNoRows):
				return err
			}
		}
		var idem *string
		if ns.IdempotencyKey != "" {
			idem = &ns.IdempotencyKey
		}
		// The payload column is json, not jsonb: it keeps the sender's
		// text byte for byte, so a replay carries exactly the bytes of the
		// live push (migration 0004 says why).
		var payload *string // NULL when there is none
		if len(ns.Payload) > 0 {
			p := string(ns.Payload)
			payload = &p
		}
		if _, err := tx.Exec(ctx, `INSERT INTO signals (tenant_id, project_id, to_session, seq, id,
				from_session, kind, payload, created_at, idempotency_key, delivery, route_state)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8::json, $9, $10, $11, $12)`,
			ns.To.TenantID, ns.To.ProjectID, ns.To.SessionID, seq, ns.ID,
			ns.FromSession, ns.Kind, payload, ns.CreatedAt, idem, ns.Delivery, ns.RouteState); err != nil {
			return err
		}
		out = sessionstore.Signal{
			ID: ns.ID, Seq: seq, To: ns.To, FromSession: ns.FromSession, Kind: ns.Kind,
			Payload: append(json.RawMessage(nil), ns.Payload...), CreatedAt: ns.CreatedAt.Truncate(time.Microsecond).UTC(),
			IdempotencyKey: ns.IdempotencyKey, Delivery: ns.Delivery, RouteState: ns.RouteState,
		}
		return nil
	})
	if dup {
		return out, true, nil
	}
	if err != nil {
		return sessionstore.Signal{}, false, wrap("append signal", err)
	}
	return out, false, nil
}

// errDuplicate rolls back an AppendSignal that found a duplicate.
var errDuplicate = errorString("duplicate")

type errorString string

func (e errorString) Error() string { return string(e) }

// idempotencyLockKey names the advisory lock of one sender's idempotency key.
func idempotencyLockKey(ns sessionstore.NewSignal) string {
	const sep = "\x1f"
	return "marconi.idem" + sep + ns.To.TenantID + sep + ns.To.ProjectID + sep + ns.FromSession + sep + ns.IdempotencyKey
}

// PendingSignals implements sessionstore.Store. A limit of 0 or less means
// no limit.
func (s *Store) PendingSignals(ctx context.Context, k sessionstore.Key, afterSeq int64, limit int) ([]sessionstore.Signal, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return nil, wrap("pending signals", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT `+signalCols+` FROM signals
		WHERE tenant_id = $1 AND project_id = $2 AND to_session = $3 AND acked_at IS NULL AND seq > $4
		ORDER BY seq LIMIT $5`, k.TenantID, k.ProjectID, k.SessionID, afterSeq, limitOrNil(limit))
	if err != nil {
		return nil, wrap("pending signals", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sessionstore.Signal, error) { return scanSignal(r) })
	if err != nil {
		return nil, wrap("pending signals", err)
	}
	return out, nil
}

// AckSignals implements sessionstore.Store.
func (s *Store) AckSignals(ctx context.Context, k sessionstore.Key, upToSeq int64, at time.Time) (int, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return 0, wrap("ack signals", err)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE signals SET acked_at = $5
		WHERE tenant_id = $1 AND project_id = $2 AND to_session = $3 AND seq <= $4 AND acked_at IS NULL`,
		k.TenantID, k.ProjectID, k.SessionID, upToSeq, at)
	if err != nil {
		return 0, wrap("ack signals", err)
	}
	return int(tag.RowsAffected()), nil
}

// CountPending implements sessionstore.Store.
func (s *Store) CountPending(ctx context.Context, k sessionstore.Key) (int, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return 0, wrap("count pending", err)
	}
	var n int
	err = s.pool.QueryRow(ctx, `SELECT count(*) FROM signals
		WHERE tenant_id = $1 AND project_id = $2 AND to_session = $3 AND acked_at IS NULL`,
		k.TenantID, k.ProjectID, k.SessionID).Scan(&n)
	if err != nil {
		return 0, wrap("count pending", err)
	}
	return n, nil
}

// PendingTotal implements sessionstore.Store.
func (s *Store) PendingTotal(ctx context.Context, now time.Time) (int, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return 0, wrap("pending total", err)
	}
	var n int
	err = s.pool.QueryRow(ctx, `SELECT count(*) FROM signals g
		JOIN sessions s ON s.tenant_id = g.tenant_id AND s.project_id = g.project_id AND s.session_id = g.to_session
		WHERE g.acked_at IS NULL AND s.expires_at >= $1`, now).Scan(&n)
	if err != nil {
		return 0, wrap("pending total", err)
	}
	return n, nil
}

// DropPending implements sessionstore.Store.
func (s *Store) DropPending(ctx context.Context, k sessionstore.Key, at time.Time) (int, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return 0, wrap("drop pending", err)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE signals SET acked_at = $4
		WHERE tenant_id = $1 AND project_id = $2 AND to_session = $3 AND acked_at IS NULL`,
		k.TenantID, k.ProjectID, k.SessionID, at)
	if err != nil {
		return 0, wrap("drop pending", err)
	}
	return int(tag.RowsAffected()), nil
}

// The prune statements. Each deletes at most $2 rows, those whose ctid its
// subselect picks (ctid = ANY(ARRAY(...)) plans as a TID scan); where it is
// cheap, the outer WHERE repeats the condition, so that a row changed since
// the subselect read it is judged again.
const (
	pruneAckedSQL = `DELETE FROM signals WHERE acked_at < $1 AND ctid = ANY (ARRAY(
		SELECT ctid FROM signals WHERE acked_at < $1 LIMIT $2))`
	// The LIMIT inside LATERAL keeps it a per-session index lookup: a join
	// the planner may flatten could scan all of signals to find a few rows.
	// A session expired before the cutoff cannot come back to life, so the
	// outer WHERE does not join sessions again.
	pruneExpiredSignalsSQL = `DELETE FROM signals WHERE ctid = ANY (ARRAY(
		SELECT g.ctid FROM sessions e CROSS JOIN LATERAL (
			SELECT ctid FROM signals
			WHERE tenant_id = e.tenant_id AND project_id = e.project_id AND to_session = e.session_id
			LIMIT $2) g
		WHERE e.expires_at < $1 LIMIT $2))`
	// Only sessions whose signals are gone, so that the ON DELETE CASCADE of
	// one statement stays bounded. The scalar subquery is one index probe
	// per session (an anti join could scan all of signals).
	pruneExpiredSessionsSQL = `DELETE FROM sessions WHERE expires_at < $1 AND ctid = ANY (ARRAY(
		SELECT ctid FROM sessions e WHERE e.expires_at < $1
		  AND (SELECT 1 FROM signals g WHERE g.tenant_id = e.tenant_id
		         AND g.project_id = e.project_id AND g.to_session = e.session_id LIMIT 1) IS NULL
		LIMIT $2))`
	// Instances are few, but one per pod ever started: no index needed.
	pruneInstancesSQL = `DELETE FROM instances WHERE last_heartbeat_at < $1 AND id = ANY (ARRAY(
		SELECT id FROM instances WHERE last_heartbeat_at < $1 LIMIT $2))`
	// $1 is the offset of the oldest event kept, KeepFallbackEvents-1.
	pruneFallbacksSQL = `DELETE FROM fallback_events WHERE id = ANY (ARRAY(
		SELECT id FROM fallback_events WHERE id < (
			SELECT id FROM fallback_events ORDER BY id DESC OFFSET $1 LIMIT 1)
		ORDER BY id LIMIT $2))`
)

// Prune implements sessionstore.Store in batches: each statement deletes at
// most the prune batch size (WithPruneBatch) of rows, in its own transaction
// under the query timeout, and a kind of row is done once a batch deletes
// fewer. A backlog of any size thus shrinks a batch at a time instead of
// timing out whole, every time, and growing forever. When ctx ends first,
// what was deleted stays deleted and is counted; the next Prune goes on.
//
// The signals count includes the signals of the sessions it removes: they
// are deleted before their sessions, so that no statement's cascade is
// unbounded.
func (s *Store) Prune(ctx context.Context, ackedBefore, expiredBefore time.Time) (signals, sessions int, err error) {
	signals, err = s.deleteInBatches(ctx, pruneAckedSQL, ackedBefore)
	if err != nil {
		return signals, sessions, wrap("prune acknowledged signals", err)
	}
	// Signals of expired sessions and the sessions they leave empty, in
	// turns, so that each signals batch finds the sessions it already
	// emptied gone instead of probing them again.
	for {
		nsig, err := s.deleteBatch(ctx, pruneExpiredSignalsSQL, expiredBefore)
		signals += nsig
		if err != nil {
			return signals, sessions, wrap("prune signals of expired sessions", err)
		}
		nsess, err := s.deleteBatch(ctx, pruneExpiredSessionsSQL, expiredBefore)
		sessions += nsess
		if err != nil {
			return signals, sessions, wrap("prune expired sessions", err)
		}
		if nsig < s.pruneBatch && nsess < s.pruneBatch {
			break
		}
	}
	if _, err := s.deleteInBatches(ctx, pruneInstancesSQL, expiredBefore); err != nil {
		return signals, sessions, wrap("prune instances", err)
	}
	if _, err := s.deleteInBatches(ctx, pruneFallbacksSQL, sessionstore.KeepFallbackEvents-1); err != nil {
		return signals, sessions, wrap("prune fallback events", err)
	}
	return signals, sessions, nil
}

// deleteInBatches runs query, a DELETE of at most $2 rows given $1 = arg,
// until a run deletes fewer than the batch size or ctx ends. Each run is its
// own statement and transaction under the query timeout. It returns how many
// rows the runs deleted, also on an error.
func (s *Store) deleteInBatches(ctx context.Context, query string, arg any) (int, error) {
	total := 0
	for {
		n, err := s.deleteBatch(ctx, query, arg)
		total += n
		if err != nil || n < s.pruneBatch {
			return total, err
		}
	}
}

// deleteBatch runs query once, as its own call.
func (s *Store) deleteBatch(ctx context.Context, query string, arg any) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return 0, err
	}
	tag, err := s.pool.Exec(ctx, query, arg, s.pruneBatch)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}
