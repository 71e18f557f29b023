package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
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

// pendingSQL reads a session's unacknowledged signals after seq $4, at
// most $5, on the primary key. A session's pending signals are those above
// its acked_seq (ackSQL); the acknowledged ones stay in the primary key
// until Prune, so a scan from seq 0 would walk them all.
const pendingSQL = `SELECT ` + signalCols + ` FROM signals
	WHERE tenant_id = $1 AND project_id = $2 AND to_session = $3
	  AND seq > GREATEST($4::bigint, coalesce((SELECT acked_seq FROM sessions
		WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3), 0))
	ORDER BY seq LIMIT $5`

// PendingSignals implements sessionstore.Store. A limit of 0 or less means
// no limit.
func (s *Store) PendingSignals(ctx context.Context, k sessionstore.Key, afterSeq int64, limit int) ([]sessionstore.Signal, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return nil, wrap("pending signals", err)
	}
	rows, err := s.pool.Query(ctx, pendingSQL, k.TenantID, k.ProjectID, k.SessionID, afterSeq, limitOrNil(limit))
	if err != nil {
		return nil, wrap("pending signals", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sessionstore.Signal, error) { return scanSignal(r) })
	if err != nil {
		return nil, wrap("pending signals", err)
	}
	return out, nil
}

// AckSignals implements sessionstore.Store. Acknowledgements are
// cumulative: the recipient's acked_seq moves up to upToSeq (never past its
// last seq), and the bytes of the signals it passed are taken off the
// pending counters. With group commit on, an ack rides the next batch.
func (s *Store) AckSignals(ctx context.Context, k sessionstore.Key, upToSeq int64, at time.Time) (int, error) {
	n, err := s.ack(ctx, k, upToSeq, at)
	return n, wrap("ack signals", err)
}

// AckSignalsAs implements sessionstore.Store: AckSignals whose first
// statement (ackSeqAsSQL) checks h in the row it locks.
func (s *Store) AckSignalsAs(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, upToSeq int64, at time.Time) (int, error) {
	r := &appendReq{ack: &ackReq{k: k, upTo: upToSeq, at: at, as: &h}}
	if err := s.commit(ctx, r); err != nil {
		return 0, wrap("ack signals", err)
	}
	return r.out.acked, nil
}

// ackSeqAsSQL is ackSeqSQL that moves acked_seq only while the row is the
// live registration $5 (live at $6) holding the token hash $7 or none. It
// returns whether it moved it, and what the statement's snapshot said of
// the row (false, false when there is none), so a refusal is explained: a
// row that changed between the snapshot and the update (the update
// re-checks the newest version) reads as neither refused nor moved.
const ackSeqAsSQL = `WITH s AS (
	SELECT registered_at = $5::timestamptz AND expires_at >= $6::timestamptz AS ours,
	       coalesce(token_hash IS NULL OR octet_length(token_hash) = 0 OR token_hash = $7::bytea, false) AS holds
	FROM sessions WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3
), u AS (
	UPDATE sessions SET ack_floor = acked_seq, acked_seq = GREATEST(acked_seq, LEAST($4::bigint, last_seq))
	WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3
	  AND registered_at = $5::timestamptz AND expires_at >= $6::timestamptz
	  AND (token_hash IS NULL OR octet_length(token_hash) = 0 OR token_hash = $7::bytea)
	RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM u), coalesce((SELECT ours FROM s), false), coalesce((SELECT holds FROM s), false)`

// errAckRaced says the session changed between an AckSignalsAs check's
// snapshot and its update.
var errAckRaced = fmt.Errorf("the session changed while its ack was checked: %w", sessionstore.ErrConflict)

// ackVerdict turns ackSeqAsSQL's row into AckSignalsAs's error.
func ackVerdict(moved, ours, holds bool) error {
	switch {
	case moved:
		return nil
	case !ours:
		return sessionstore.ErrNotFound
	case !holds:
		return sessionstore.ErrTokenMismatch
	}
	return errAckRaced
}

// ackSeqSQL moves k's acked_seq up to $4, never past its last seq, and
// keeps the value it had in ack_floor (the right-hand sides read the row as
// it was), so that ackSQL counts only what this ack acknowledges. It locks
// the session's row first, as an append to it does.
const ackSeqSQL = `UPDATE sessions SET ack_floor = acked_seq, acked_seq = GREATEST(acked_seq, LEAST($4::bigint, last_seq))
	WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3`

// ackSQL counts the signals of k in (ack_floor, acked_seq], the ones the
// ack that moved acked_seq passed, takes their bytes off the session's
// pending counter, and off its project's by a delta (see migration 0005),
// and drops the payloads among them larger than $4 bytes; it returns how
// many they are. The session's row, locked by ackSeqSQL, keeps another ack
// out meanwhile. It is a statement of its own, after ackSeqSQL: its
// snapshot, taken once the row lock was granted, sees the appends committed
// meanwhile (and its CTEs all read that snapshot: the bytes are counted
// before the drop).
//
// A signal is acknowledged by its session's acked_seq alone (migration
// 0016): every reader of pending signals is bounded by it, and Prune
// deletes the signals at or below it. So an ack writes a signal only to
// drop a payload above $4 (WithAckedPayloadBytes, the bound on what a
// day of acknowledged signals keeps: docs/security.md); one of small
// payloads is written once, by its append, and deleted once, by Prune.
// Marking every acknowledged row (acked_at set, payload dropped: a HOT
// update per signal, until 0016) wrote about a tenth of a durable send's
// WAL and more than doubled the ack's time in Postgres; the sends/s it
// cost were within the noise of a two-core machine
// (docs/benchmarks-history.md, "Acknowledged by acked_seq alone"). A
// binary from before 0016 marks the signals its own acks pass, and counts
// only its own range too, so the two count the same bytes during a
// rolling deploy.
//
// The range is read on the primary key, bounded at both ends, so that no
// plan walks the session's acknowledged signals (migration 0009); it is read
// a second time, to drop payloads, only when the first read found one too
// large ((SELECT m FROM t), evaluated once, gates the update's scan).
const ackSQL = `WITH r AS (
	SELECT ack_floor, acked_seq FROM sessions WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3
), n AS (
	SELECT coalesce(octet_length(payload::text), 0) AS n FROM signals
	WHERE tenant_id = $1 AND project_id = $2 AND to_session = $3
	  AND seq > (SELECT ack_floor FROM r) AND seq <= (SELECT acked_seq FROM r)
), t AS (
	SELECT count(*) AS c, coalesce(sum(n), 0)::bigint AS b, coalesce(max(n), 0) AS m FROM n
), d AS (
	UPDATE signals SET payload = NULL
	WHERE tenant_id = $1 AND project_id = $2 AND to_session = $3
	  AND seq > (SELECT ack_floor FROM r) AND seq <= (SELECT acked_seq FROM r)
	  AND (SELECT m FROM t) > $4::bigint AND octet_length(payload::text) > $4::bigint
), s AS (
	UPDATE sessions SET pending_bytes = pending_bytes - t.b FROM t
	WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND t.b <> 0
), p AS (
	INSERT INTO project_usage_deltas (tenant_id, project_id, delta) SELECT $1, $2, -t.b FROM t WHERE t.b <> 0
)
SELECT c FROM t`

// CountPending implements sessionstore.Store. Acknowledgements are
// cumulative and a recipient's seqs gap-free, so its pending signals are
// exactly those with seq in (acked_seq, last_seq]: their count is read from
// its sessions row (as the append's quota and AttachQueue read it), not
// counted in signals. Nothing deletes a signal above acked_seq but the
// deletion of its session (DeleteSession, a registration again, Prune of
// an expired session, which removes the row once its signals are gone).
func (s *Store) CountPending(ctx context.Context, k sessionstore.Key) (int, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return 0, wrap("count pending", err)
	}
	var n int
	err = s.pool.QueryRow(ctx, countPendingSQL, k.TenantID, k.ProjectID, k.SessionID).Scan(&n)
	if err != nil {
		return 0, wrap("count pending", err)
	}
	return n, nil
}

// countPendingSQL is CountPending's count: 0 for no such session.
const countPendingSQL = `SELECT coalesce((SELECT last_seq - acked_seq FROM sessions
	WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3), 0)`

// PendingTotal implements sessionstore.Store: CountPending's count summed
// over the sessions live at now.
func (s *Store) PendingTotal(ctx context.Context, now time.Time) (int, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return 0, wrap("pending total", err)
	}
	var n int
	err = s.pool.QueryRow(ctx, pendingTotalSQL, now).Scan(&n)
	if err != nil {
		return 0, wrap("pending total", err)
	}
	return n, nil
}

// pendingTotalSQL is PendingTotal's sum, one row per live session.
const pendingTotalSQL = `SELECT coalesce(sum(last_seq - acked_seq), 0) FROM sessions WHERE expires_at >= $1`

// DropPending implements sessionstore.Store: an acknowledgement of
// everything stored.
func (s *Store) DropPending(ctx context.Context, k sessionstore.Key, at time.Time) (int, error) {
	n, err := s.ack(ctx, k, math.MaxInt64, at)
	return n, wrap("drop pending", err)
}

// The prune statements. Each deletes at most $2 rows, those whose ctid its
// subselect picks (ctid = ANY(ARRAY(...)) plans as a TID scan); where it is
// cheap, the outer WHERE repeats the condition, so that a row changed since
// the subselect read it is judged again.
const (
	// Acknowledged signals (at or below their session's acked_seq: ackSQL)
	// made before $1, found through signals_created_at_idx, their session's
	// acked_seq read by its primary key. A signal is kept for the retention
	// from when it was made, as the idempotency window counts, not from its
	// ack: no row says when it was acknowledged. acked_seq only ever grows
	// on a session's row, and a session registered again starts from a new
	// row with none of the old signals, so a row the subselect picked is
	// still acknowledged when the DELETE reaches it.
	pruneAckedSQL = `DELETE FROM signals WHERE created_at < $1 AND ctid = ANY (ARRAY(
		SELECT g.ctid FROM signals g WHERE g.created_at < $1
		  AND g.seq <= (SELECT e.acked_seq FROM sessions e
		    WHERE e.tenant_id = g.tenant_id AND e.project_id = g.project_id AND e.session_id = g.to_session)
		LIMIT $2))`
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
	// Only sessions whose signals are gone, so that the delete trigger's
	// cascade (migration 0012) of one statement stays bounded. The scalar subquery is one index probe
	// per session (an anti join could scan all of signals).
	// The pending bytes they still held come off their projects' counters.
	pruneExpiredSessionsSQL = `WITH d AS (
		DELETE FROM sessions WHERE expires_at < $1 AND ctid = ANY (ARRAY(
			SELECT ctid FROM sessions e WHERE e.expires_at < $1
			  AND (SELECT 1 FROM signals g WHERE g.tenant_id = e.tenant_id
			         AND g.project_id = e.project_id AND g.to_session = e.session_id LIMIT 1) IS NULL
			LIMIT $2))
		RETURNING tenant_id, project_id, pending_bytes
	), g AS (SELECT tenant_id, project_id, sum(pending_bytes)::bigint AS b FROM d GROUP BY 1, 2
	), u AS (
		INSERT INTO project_usage_deltas (tenant_id, project_id, delta)
		SELECT tenant_id, project_id, -b FROM g WHERE b <> 0
	)
	SELECT count(*) FROM d`
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
func (s *Store) Prune(ctx context.Context, ackedMadeBefore, expiredBefore time.Time) (signals, sessions int, err error) {
	signals, err = s.deleteInBatches(ctx, pruneAckedSQL, ackedMadeBefore)
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
	if strings.HasPrefix(query, "WITH") { // it counts what it deleted itself
		var n int
		err := s.pool.QueryRow(ctx, query, arg, s.pruneBatch).Scan(&n)
		return n, err
	}
	tag, err := s.pool.Exec(ctx, query, arg, s.pruneBatch)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}
