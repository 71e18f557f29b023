package pgstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// The durable append. Concurrent AppendSignal calls are gathered into one
// batch (group commit): the statements of a batch go to Postgres in one
// pipelined round trip and run as one implicit transaction, so the whole
// batch costs one commit and one WAL flush. Each caller is answered only
// after the batch committed. docs/delivery.md tells the whole story.

// lockIdempotencySQL takes the transaction-scoped advisory lock of every
// idempotency key of the batch, in one global order (by hash), so that a
// duplicate sent at once through another batch or instance waits for this
// one to commit and then finds it. Taking them before any row lock, always
// in the same order, keeps batches from deadlocking on them.
const lockIdempotencySQL = `SELECT count(pg_advisory_xact_lock(h)) FROM (
	SELECT DISTINCT hashtextextended(k, 0) AS h FROM unnest($1::text[]) AS k ORDER BY h OFFSET 0) AS locks`

// lockSessionsSQL locks the sessions rows of a batch that writes rows
// (rows.go), in the global order of sendBatch's comment: byte order of
// (tenant, project, session), the order in which sendBatch sorts the batch.
// The locks are taken as the sorted rows leave the sort.
const lockSessionsSQL = `SELECT 1 FROM sessions s
	JOIN unnest($1::text[], $2::text[], $3::text[]) AS x(t, p, sid)
	  ON s.tenant_id = x.t AND s.project_id = x.p AND s.session_id = x.sid
	ORDER BY s.tenant_id COLLATE "C", s.project_id COLLATE "C", s.session_id COLLATE "C"
	FOR NO KEY UPDATE OF s`

// settleUsageSQL is the last statement of a batch that appends, with quota
// leases off: it locks the batch's projects' project_usage rows, in order,
// folds into them the freed bytes (project_usage_deltas) and the bytes of
// the batch's stored appends, and raises quotaSQLState when a project would
// pass its pending-bytes limit (migration 0011).
//
// $1 ids, $2 tenants, $3 projects, $4 payload bytes, $5 pending-bytes
// limits, one element per append of the batch.
const settleUsageSQL = `SELECT marconi_settle_usage($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[])`

// settleLeasedSQL is settleUsageSQL with quota leases (the default): the
// batch's appends are taken from its lane's lease of each project, and
// only a project whose lease runs short has its project_usage row locked,
// its freed bytes folded in and a new lease taken (migration 0015). So the
// batches of one project, from the lanes of one instance or of several,
// commit side by side instead of one after another behind that row.
//
// $1 the lane's lease holder, $2 the lease size, then settleUsageSQL's.
const settleLeasedSQL = `SELECT marconi_settle_leased($1::text, $2::bigint, $3::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[])`

// quotaSQLState is what marconi_settle_usage and marconi_settle_leased
// raise when a batch would take a project past its pending-bytes limit; its
// DETAIL is the project's bytes before the batch's appends.
const quotaSQLState = "MQ001"

// appendSQL is one append in one statement: the idempotency lookup, the
// recipient and quota checks, the seq bump, the recipient's byte counter and
// the insert. Its project's bytes are read as roomSQL says, a cheap first
// refusal; the batch's last statement (settleLeasedSQL) adds the bytes and
// checks the limit again under the project's lock.
// It always returns one row: the new seq and queue instance when it stored
// the signal; otherwise what decided (the earlier signal, or the recipient's
// pending count and its project's bytes, NULL when it is not live). What
// explains a refusal (rcpt) is read only when the update stored nothing: a
// stored append reads the recipient's row once, in its UPDATE.
//
// The insert is checked by no foreign key (migration 0012): it stores a
// signal only with the seq its UPDATE of the recipient's row returned, so
// the row exists, is live and is locked until the commit.
//
// $1 tenant, $2 project, $3 to_session, $4 id, $5 from_session, $6 kind,
// $7 payload, $8 created_at, $9 idempotency key, $10 delivery,
// $11 route_state, $12 idempotency since, $13 now, $14 payload bytes,
// $15 pending limit, $16 pending bytes limit (0: none), $17 the sender's
// token hash (NULL: not checked), $18 $19 $20 $21 the recipient's
// registered_at, queue_instance, queue_attached_at and token_hash as the
// sender saw them ($18 NULL: not checked; see sessionstore.NewSignal.Seen).
//
// The idempotency lookup (dup) finds the sender's key through
// signals_sender_key_idx, which leads with (from_session, idempotency_key),
// and checks the tenant and project outside a subquery that OFFSET 0 keeps
// whole: were they beside the key, the primary key (tenant_id, project_id,
// ...) would serve them too, and a generic plan made before any ANALYZE
// (every estimate then alike) chose it about as often as the right index,
// and walked every signal of the project at every append (seen in durable
// runs: a third of the sends/s, for the life of the connection).
var appendSQL = `WITH auth AS (
	SELECT $17::bytea IS NULL OR EXISTS (SELECT 1 FROM sessions
		WHERE tenant_id = $1 AND project_id = $2 AND session_id = $5 AND token_hash = $17 AND expires_at >= $13) AS ok
), dup AS (
	SELECT ` + dupCols + ` FROM (
		SELECT ` + signalCols + ` FROM signals
		WHERE $9::text IS NOT NULL AND from_session = $5 AND idempotency_key = $9
		  AND ($12::timestamptz IS NULL OR created_at >= $12)
		OFFSET 0) d
	WHERE tenant_id = $1 AND project_id = $2
	ORDER BY created_at DESC, seq DESC LIMIT 1
), room AS (
	` + roomSQL("$1", "$2", "$14::bigint", "$16::bigint") + `
), bump AS (
	UPDATE sessions SET last_seq = last_seq + 1, pending_bytes = pending_bytes + $14::bigint
	WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND expires_at >= $13
	  AND (SELECT ok FROM auth) AND NOT EXISTS (SELECT 1 FROM dup) AND ` + seenSQL + `
	  AND ($15::bigint <= 0 OR last_seq - acked_seq < $15::bigint)
	  AND ($16::bigint <= 0 OR (SELECT project_bytes FROM room) + $14::bigint <= $16::bigint)
	RETURNING last_seq, queue_instance
), ins AS (
	INSERT INTO signals (tenant_id, project_id, to_session, seq, id, from_session, kind, payload,
		created_at, idempotency_key, delivery, route_state)
	SELECT $1, $2, $3, bump.last_seq, $4, $5, $6, $7::json, $8, $9, $10, $11 FROM bump
), rcpt AS (
	SELECT last_seq - acked_seq AS pending, ` + seenSQL + ` AS seen
	FROM sessions WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND expires_at >= $13
)
SELECT auth.ok, bump.last_seq, bump.queue_instance,
	CASE WHEN bump.last_seq IS NULL THEN (SELECT pending FROM rcpt) END,
	CASE WHEN bump.last_seq IS NULL THEN (SELECT project_bytes FROM room) END,
	CASE WHEN bump.last_seq IS NULL THEN (SELECT seen FROM rcpt) END,
	dup.id, dup.seq, dup.tenant_id, dup.project_id, dup.to_session, dup.from_session, dup.kind,
	dup.payload, dup.created_at, dup.idempotency_key, dup.delivery, dup.route_state
FROM auth LEFT JOIN bump ON true LEFT JOIN dup ON true`

// roomSQL is a query of one row, project_bytes: the pending bytes of the
// project (tenant, project) an append of bytes, under a pending-bytes limit
// of limit (0 or less: none), is checked against. Its counter is read,
// unlocked, as a cheap first refusal; it counts the bytes the lanes leased
// as used, so the bytes freed since the last batch folded them
// (project_usage_deltas) and the leases are read only when the counter
// alone would refuse: near the limit, where they decide. Each argument is
// an SQL expression.
func roomSQL(tenant, project, bytes, limit string) string {
	inProject := `WHERE tenant_id = ` + tenant + ` AND project_id = ` + project
	return `SELECT CASE WHEN ` + limit + ` <= 0 OR coalesce(u.b, 0) + ` + bytes + ` <= ` + limit + `
	            THEN coalesce(u.b, 0)
	            ELSE coalesce(u.b, 0) + coalesce((SELECT sum(delta) FROM project_usage_deltas ` + inProject + `), 0)
	               - coalesce((SELECT sum(bytes) FROM project_leases ` + inProject + `), 0) END AS project_bytes
	FROM (SELECT (SELECT pending_bytes FROM project_usage ` + inProject + `) AS b OFFSET 0) u`
}

// dupCols is signalCols of the earlier signal d a duplicate send is
// answered with, but its payload when it is acknowledged (at or below its
// recipient's acked_seq): the store keeps it until Prune (ackSQL), but an
// acknowledged signal is never delivered again, and the store's contract
// answers its duplicate without it (sessionstore.Store.AckSignals).
const dupCols = `id, seq, tenant_id, project_id, to_session, from_session, kind,
	CASE WHEN seq <= (SELECT e.acked_seq FROM sessions e
	                  WHERE e.tenant_id = d.tenant_id AND e.project_id = d.project_id AND e.session_id = d.to_session)
	     THEN NULL ELSE payload END AS payload,
	created_at, idempotency_key, delivery, route_state`

// seenSQL is true when the sessions row in scope is the recipient the
// sender saw ($18 to $21), or when that is not checked.
const seenSQL = `($18::timestamptz IS NULL OR (registered_at = $18::timestamptz AND queue_instance = $19::text
	AND queue_attached_at IS NOT DISTINCT FROM $20::timestamptz AND token_hash = $21::bytea))`

// appendReq is one AppendSignal, or one acknowledgement, wake-up or
// session-row write, waiting for its batch.
type appendReq struct {
	ns   sessionstore.NewSignal
	now  time.Time
	ack  *ackReq  // set for an acknowledgement instead of an append
	wake *wakeReq // set for a wake-up instead of an append
	row  *rowReq  // set for a session-row write instead of an append (rows.go)
	out  appendOutcome
	// turn receives an empty turn when out is set, or the batch this
	// request is to run (itself first) and its lane.
	turn chan turn
}

// ackReq is an acknowledgement of k's signals up to upTo.
type ackReq struct {
	k    sessionstore.Key
	upTo int64
	at   time.Time
	// as, when set, is who must still speak for k (AckSignalsAs).
	as *sessionstore.Holder
}

// wakeReq is a wake-up of instance (Bus.Publish); it never rides an
// append's batch.
type wakeReq struct {
	instance string
	w        sessionstore.Wake
}

// appendOutcome is what one member of a batch came to.
type appendOutcome struct {
	sig   sessionstore.Signal
	dup   bool
	acked int // for an acknowledgement
	// pending is the session's unacknowledged signals after a row write.
	pending int
	cleared bool // for a ClearQueue
	err     error
}

// AppendSignal implements sessionstore.Store. With group commit on (the
// default) it joins the next batch and returns once that batch committed;
// off, it runs as a batch of its own.
func (s *Store) AppendSignal(ctx context.Context, ns sessionstore.NewSignal, now time.Time) (sessionstore.Signal, bool, error) {
	r := &appendReq{ns: ns, now: now}
	if err := s.commit(ctx, r); err != nil {
		return sessionstore.Signal{}, false, wrap("append signal", err)
	}
	return r.out.sig, r.out.dup, nil
}

// ack acknowledges k's signals up to upTo, in the next batch with group
// commit on (an agent's steady traffic then costs one commit per batch, not
// one per ack), else in a transaction of its own.
func (s *Store) ack(ctx context.Context, k sessionstore.Key, upTo int64, at time.Time) (int, error) {
	r := &appendReq{ack: &ackReq{k: k, upTo: upTo, at: at}}
	if err := s.commit(ctx, r); err != nil {
		return 0, err
	}
	return r.out.acked, nil
}

// commit runs r in a batch and returns its error.
func (s *Store) commit(ctx context.Context, r *appendReq) error {
	if s.closed.Load() {
		return fmt.Errorf("store closed: %w", sessionstore.ErrUnavailable)
	}
	if s.group == nil {
		s.runBatch(0, []*appendReq{r})
	} else if err := s.group.do(ctx, r); err != nil {
		return fmt.Errorf("%w: %w", sessionstore.ErrUnavailable, err)
	}
	return r.out.err
}

// runBatch stores the appends of batch in one transaction and sets each
// one's outcome: by one statement (appendSetSQL) unless the store runs a
// statement per append (WithStatementPerAppend), and what that statement
// did not store then by a statement each (appendSQL), in a transaction
// after the batch's. When Postgres refuses the batch as a whole (one
// member's bad value aborts the transaction, a deadlock, or the batch would
// take a project past its pending-bytes limit), nothing of it was stored:
// each member then runs again alone, so only the one at fault fails. When
// the store cannot be reached, every member fails closed. lane is the
// committer's lane the batch runs in (0 with group commit off, when
// concurrent batches share it: they then settle one after another).
func (s *Store) runBatch(lane int, batch []*appendReq) {
	s.runBatchFrom(lane, batch, s.setFrom)
}

// runBatchFrom is runBatch with appendSetSQL for batches of setFrom appends
// or more (statementPerAppend: none).
func (s *Store) runBatchFrom(lane int, batch []*appendReq, setFrom int) {
	ctx, cancel, err := s.call(context.Background())
	defer cancel()
	var left []*appendReq
	if err == nil {
		left, err = s.sendBatch(ctx, lane, batch, setFrom)
	}
	if err == nil {
		// The appends it left count in the transaction that answers them.
		s.metrics.size.Observe(float64(len(batch) - len(left)))
		if len(left) > 0 {
			s.metrics.alone.Add(float64(len(left)))
			s.runBatchFrom(lane, left, statementPerAppend)
		}
		return
	}
	var pgErr *pgconn.PgError
	if len(batch) > 1 && errors.As(err, &pgErr) && !isUnavailable(err) {
		// A server-side error aborted the implicit transaction: nothing
		// of the batch is stored, so each member may run again.
		s.metrics.reruns.WithLabelValues(rerunReason(err)).Inc()
		for _, r := range batch {
			s.runBatchFrom(lane, []*appendReq{r}, setFrom)
		}
		return
	}
	if len(batch) == 1 && batch[0].isAppend() {
		if q := projectQuotaError(err, batch[0].ns.Limits.PendingBytesPerProject); q != nil {
			err = q
		}
	}
	for _, r := range batch {
		r.out = appendOutcome{err: err}
	}
}

// projectQuotaError is the *sessionstore.QuotaError of a batch of one
// append, of pending-bytes limit limit, that settleUsageSQL refused; nil
// when err is something else.
func projectQuotaError(err error, limit int64) *sessionstore.QuotaError {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != quotaSQLState {
		return nil
	}
	current, perr := strconv.ParseInt(pgErr.Detail, 10, 64)
	if perr != nil {
		current = limit // the function always sets it; never mind if not
	}
	return &sessionstore.QuotaError{Quota: marconi.QuotaPendingBytesPerProject, Limit: limit, Current: current}
}

// sendBatch sends batch as one pipelined implicit transaction and reads its
// outcomes. It returns an error when the transaction did not commit (or may
// not have: a lost connection leaves that unknown, and the members fail
// closed); outcomes are set only when it returns nil, and then for every
// member but the appends it returns: those appendSetSQL did not store,
// for runBatch to run again each by appendSQL.
//
// Every lock a batch takes comes in one global order, so that batches (of
// this instance, with several in flight, and of others) cannot deadlock on
// one another: first the idempotency keys' advisory locks (by hash), then
// the sessions rows (by tenant, project and session, in byte order), then
// the project_usage rows (by tenant and project), in the last statement;
// the project_usage_deltas rows a batch folds are deleted only under their
// project's lock. Two batches that both take locks in one order cannot each
// wait for a lock the other holds. The sessions rows: the batch is sorted
// by recipient (stably, so each recipient's appends and acks keep their
// arrival order), and, with a statement per append, an append or an ack
// locks its recipient's row first (the signals rows an ack passes are
// counted, and their large payloads dropped, only under that row's lock).
// The statement of a batch's appends (appendSetSQL) updates its recipients'
// rows in an order of its own plan, and the row writes (touches, queue
// placements and detaches) run after the appends, in statements of their
// own, each in key order, which would break the order (a touch of A after
// an append to B): a batch with either, and more than one session,
// therefore locks all of its sessions rows first, in order
// (lockSessionsSQL), and its later statements take none that it does not
// hold. What stays outside the order: writes that are not batched (a
// registration, a deleted session, a prune deleting many rows in one
// statement) and an UPDATE that finds its rows in an order of its own
// plan; should one of them deadlock with a batch, Postgres aborts one, and
// runBatch runs an aborted batch's members again one by one.
//
// With appendSetSQL, the acks that arrived before any append to their
// session run before it, the others after it, so an ack never passes a
// signal that arrived after it; they all run before the appends it leaves
// (in the next transaction), as if they had arrived first, which they
// might have: an ack covers only seqs its client was given.
//
// The connection is taken before the batch is made: a connection new to a
// server of another history (history.go) has counted it by then, and an
// ack made under an earlier history is answered ErrHistoryChanged rather
// than run.
func (s *Store) sendBatch(ctx context.Context, lane int, batch []*appendReq, setFrom int) ([]*appendReq, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	batch = s.refuseStaleAcks(batch)
	if len(batch) == 0 {
		return nil, nil
	}
	slices.SortStableFunc(batch, func(a, b *appendReq) int { return compareKeys(a.recipient(), b.recipient()) })
	keys := idempotencyLockKeys(batch)
	var set *appendSet
	// A key twice: the later append is a duplicate of the earlier, which
	// only appendSQL, run after it, can see.
	if setFrom <= len(batch) && len(slices.Compact(slices.Sorted(slices.Values(keys)))) == len(keys) {
		if set = newAppendSet(batch); set.size() < setFrom {
			set = nil // too few to gain: a statement each
		}
	}
	q := &batchQueue{b: &pgx.Batch{}, outs: make([]appendOutcome, len(batch))}
	if len(keys) > 0 {
		q.exec(lockIdempotencySQL, keys)
	}
	layers := rowLayers(batch)
	if len(layers) > 0 || set != nil {
		if tenants, projects, ids := batchSessions(batch); len(ids) > 1 {
			q.exec(lockSessionsSQL, tenants, projects, ids)
		}
	}
	var left []int
	if set == nil {
		for i := range batch {
			q.member(batch, i, s.ackedPayload)
		}
	} else {
		early := earlyAcks(batch)
		for i := range batch {
			if early[i] {
				q.member(batch, i, s.ackedPayload)
			}
		}
		set.queue(q.b, batch)
		q.reads = append(q.reads, func(br pgx.BatchResults) (err error) {
			left, err = set.read(br, batch, q.outs)
			return err
		})
		for i, r := range batch {
			if r.ack != nil && !early[i] {
				q.member(batch, i, s.ackedPayload)
			}
		}
		for _, i := range set.alone {
			q.member(batch, i, s.ackedPayload)
		}
	}
	if len(layers) > 0 {
		queueRows(q.b, batch, layers)
		q.reads = append(q.reads, func(br pgx.BatchResults) error { return readRows(br, batch, layers, q.outs) })
	}
	if s.queueSettle(q.b, lane, batch) {
		q.reads = append(q.reads, execResult)
	}
	br := conn.SendBatch(ctx, q.b)
	for _, read := range q.reads {
		if err = read(br); err != nil {
			break
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	again := make([]bool, len(batch))
	retry := make([]*appendReq, 0, len(left))
	for _, i := range left {
		again[i] = true
		retry = append(retry, batch[i])
	}
	for i, r := range batch {
		if !again[i] {
			r.out = q.outs[i]
		}
	}
	return retry, nil
}

// batchQueue is a batch's statements, each with how its result is read
// (in queue order) into outs, the outcomes of the batch's members.
type batchQueue struct {
	b     *pgx.Batch
	reads []func(pgx.BatchResults) error
	outs  []appendOutcome
}

// exec queues a statement whose result says nothing but its error.
func (q *batchQueue) exec(sql string, args ...any) {
	q.b.Queue(sql, args...)
	q.reads = append(q.reads, execResult)
}

func execResult(br pgx.BatchResults) error {
	_, err := br.Exec()
	return err
}

// member queues the statements of batch[i], an ack or an append by
// appendSQL, ackedPayload being the largest payload an ack leaves.
func (q *batchQueue) member(batch []*appendReq, i int, ackedPayload int64) {
	r, out := batch[i], &q.outs[i]
	switch {
	case r.ack != nil:
		a := r.ack
		if a.as != nil {
			q.b.Queue(ackSeqAsSQL, a.k.TenantID, a.k.ProjectID, a.k.SessionID, a.upTo, a.as.RegisteredAt, a.at, a.as.TokenHash)
		} else {
			q.b.Queue(ackSeqSQL, a.k.TenantID, a.k.ProjectID, a.k.SessionID, a.upTo)
		}
		q.b.Queue(ackSQL, a.k.TenantID, a.k.ProjectID, a.k.SessionID, ackedPayload)
		q.reads = append(q.reads, func(br pgx.BatchResults) error {
			if err := readAckSeq(br, a, out); err != nil {
				return err
			}
			// ackSQL counts up to the row's acked_seq, moved or not: what
			// it counts is acknowledged by the row, whoever asked.
			var n int
			if err := br.QueryRow().Scan(&n); err != nil {
				return err
			}
			if out.err == nil {
				out.acked = n
			}
			return nil
		})
	case r.isAppend():
		q.b.Queue(appendSQL, appendArgs(r.ns, r.now)...)
		q.reads = append(q.reads, func(br pgx.BatchResults) (err error) {
			*out, err = scanAppend(br.QueryRow(), r.ns)
			return err
		})
	}
}

// earlyAcks marks the acks of batch (sorted by recipient) that arrived
// before any append to their session in it.
func earlyAcks(batch []*appendReq) []bool {
	early := make([]bool, len(batch))
	appended := false
	for i, r := range batch {
		if i == 0 || r.recipient() != batch[i-1].recipient() {
			appended = false
		}
		appended = appended || r.isAppend()
		early[i] = r.ack != nil && !appended
	}
	return early
}

// refuseStaleAcks answers ErrHistoryChanged to the acks of batch made
// under an earlier history than the store's, and returns the others, in
// a new slice.
func (s *Store) refuseStaleAcks(batch []*appendReq) []*appendReq {
	now := s.History()
	kept := make([]*appendReq, 0, len(batch))
	for _, r := range batch {
		if a := r.ack; a != nil && a.as != nil && a.as.History != 0 && a.as.History != now {
			r.out = appendOutcome{err: sessionstore.ErrHistoryChanged}
			continue
		}
		kept = append(kept, r)
	}
	return kept
}

// queueSettle queues the settle of the appends of batch, run in lane, when
// it has any (settleLeasedSQL, or settleUsageSQL with leases off), and
// reports whether it did.
func (s *Store) queueSettle(b *pgx.Batch, lane int, batch []*appendReq) bool {
	var (
		ids, tenants, projects []string
		bytes, limits          []int64
	)
	for _, r := range batch {
		if !r.isAppend() {
			continue
		}
		ns := r.ns
		ids, tenants, projects = append(ids, ns.ID), append(tenants, ns.To.TenantID), append(projects, ns.To.ProjectID)
		bytes, limits = append(bytes, int64(len(ns.Payload))), append(limits, ns.Limits.PendingBytesPerProject)
	}
	if len(ids) == 0 {
		return false
	}
	if s.lease.bytes <= 0 {
		b.Queue(settleUsageSQL, ids, tenants, projects, bytes, limits)
	} else {
		b.Queue(settleLeasedSQL, s.lease.holder(lane), s.lease.bytes, ids, tenants, projects, bytes, limits)
	}
	return true
}

// batchSessions lists the distinct sessions whose rows batch (sorted by
// recipient) locks, in its order.
func batchSessions(batch []*appendReq) (tenants, projects, ids []string) {
	var last *sessionstore.Key
	for _, r := range batch {
		if k := r.recipient(); last == nil || k != *last {
			last = &k
			tenants, projects, ids = append(tenants, k.TenantID), append(projects, k.ProjectID), append(ids, k.SessionID)
		}
	}
	return tenants, projects, ids
}

// readAckSeq reads the result of a's first statement; a refused
// AckSignalsAs sets out.err.
func readAckSeq(br pgx.BatchResults, a *ackReq, out *appendOutcome) error {
	if a.as == nil {
		_, err := br.Exec()
		return err
	}
	var moved, ours, holds bool
	if err := br.QueryRow().Scan(&moved, &ours, &holds); err != nil {
		return err
	}
	out.err = ackVerdict(moved, ours, holds)
	return nil
}

// batchWakes lists the wake-ups of batch as notifySQL's arguments, each
// instance's packed into as few payloads as fit (wakeCodec.encode), so an
// instance usually gets one NOTIFY. Bare wake-ups of one session fold into
// the one with the highest seq; those that carry a signal stay, in seq order
// per session, each pushing its own signal.
func batchWakes(batch []*appendReq, codec wakeCodec) (instances, payloads []string) {
	type target struct {
		instance string
		k        sessionstore.Key
	}
	var order []string // instances, as first woken
	wakes := map[string][]Wake{}
	bare := map[target]int{} // index of a bare wake-up in wakes[instance]
	for _, r := range batch {
		if r.wake == nil {
			continue
		}
		in, w := r.wake.instance, r.wake.w
		if _, ok := wakes[in]; !ok {
			order = append(order, in)
		}
		t := target{in, w.Key}
		if w.Signal == nil || codec.key == nil {
			w.Signal = nil
			if i, ok := bare[t]; ok {
				wakes[in][i].Seq = max(wakes[in][i].Seq, w.Seq)
				continue
			}
			bare[t] = len(wakes[in])
		}
		wakes[in] = append(wakes[in], w)
	}
	for _, in := range order {
		ws := wakes[in]
		slices.SortStableFunc(ws, func(a, b Wake) int {
			if c := compareKeys(a.Key, b.Key); c != 0 {
				return c
			}
			return cmp.Compare(a.Seq, b.Seq)
		})
		ps, err := codec.encode(ws)
		if err != nil {
			continue // Publish validated each; cannot happen
		}
		for _, p := range ps {
			instances, payloads = append(instances, in), append(payloads, p)
		}
	}
	return instances, payloads
}

// isAppend reports whether r is an AppendSignal (not an ack, a wake-up or
// a row write).
func (r *appendReq) isAppend() bool { return r.ack == nil && r.wake == nil && r.row == nil }

// recipient is the session whose row r locks.
func (r *appendReq) recipient() sessionstore.Key {
	switch {
	case r.ack != nil:
		return r.ack.k
	case r.wake != nil:
		return r.wake.w.Key
	case r.row != nil:
		return r.row.k
	}
	return r.ns.To
}

func compareKeys(a, b sessionstore.Key) int {
	if c := strings.Compare(a.TenantID, b.TenantID); c != 0 {
		return c
	}
	if c := strings.Compare(a.ProjectID, b.ProjectID); c != 0 {
		return c
	}
	return strings.Compare(a.SessionID, b.SessionID)
}

// appendArgs are appendSQL's arguments for ns.
func appendArgs(ns sessionstore.NewSignal, now time.Time) []any {
	var idem, payload *string // NULL when there is none
	if ns.IdempotencyKey != "" {
		idem = &ns.IdempotencyKey
	}
	// The payload column is json, not jsonb: it keeps the sender's text
	// byte for byte, so a replay carries exactly the bytes of the live push
	// (migration 0004 says why).
	if len(ns.Payload) > 0 {
		p := string(ns.Payload)
		payload = &p
	}
	var seenAt, seenQueueAt *time.Time
	var seenQueue string
	var seenToken []byte
	if ns.Seen != nil {
		seenAt, seenQueue, seenQueueAt, seenToken = &ns.Seen.RegisteredAt, ns.Seen.QueueInstance, toNull(ns.Seen.QueueAttachedAt), ns.Seen.TokenHash
	}
	return []any{ns.To.TenantID, ns.To.ProjectID, ns.To.SessionID, ns.ID, ns.FromSession, ns.Kind,
		payload, ns.CreatedAt, idem, ns.Delivery, ns.RouteState, toNull(ns.IdempotencySince), now,
		int64(len(ns.Payload)), ns.Limits.PendingPerRecipient, ns.Limits.PendingBytesPerProject, ns.SenderTokenHash,
		seenAt, seenQueue, seenQueueAt, seenToken}
}

// scanAppend reads appendSQL's row into the outcome of ns.
func scanAppend(row pgx.Row, ns sessionstore.NewSignal) (appendOutcome, error) {
	var (
		authorized                 bool
		seen                       *bool
		seq, pending, projectBytes *int64
		queue                      *string
		d                          struct {
			id, tenant, project, to, from, kind, delivery, route *string
			seq                                                  *int64
			payload                                              []byte
			createdAt                                            *time.Time
			idem                                                 *string
		}
	)
	if err := row.Scan(&authorized, &seq, &queue, &pending, &projectBytes, &seen,
		&d.id, &d.seq, &d.tenant, &d.project, &d.to, &d.from, &d.kind,
		&d.payload, &d.createdAt, &d.idem, &d.delivery, &d.route); err != nil {
		return appendOutcome{}, err
	}
	switch {
	case !authorized:
		return appendOutcome{err: sessionstore.ErrTokenMismatch}, nil
	case seq != nil:
		return appendOutcome{sig: storedSignal(ns, *seq)}, nil
	case d.id != nil:
		sig := sessionstore.Signal{
			ID: *d.id, Seq: *d.seq, To: sessionstore.Key{TenantID: *d.tenant, ProjectID: *d.project, SessionID: *d.to},
			FromSession: *d.from, Kind: *d.kind, CreatedAt: d.createdAt.UTC(), IdempotencyKey: deref(d.idem),
			Delivery: marconi.Delivery(*d.delivery), RouteState: marconi.RouteState(*d.route),
		}
		if d.payload != nil {
			sig.Payload = json.RawMessage(d.payload)
		}
		return appendOutcome{sig: sig, dup: true}, nil
	case pending == nil:
		return appendOutcome{err: sessionstore.ErrNotFound}, nil
	case seen != nil && !*seen:
		return appendOutcome{err: sessionstore.ErrRecipientChanged}, nil
	case ns.Limits.PendingPerRecipient > 0 && *pending >= ns.Limits.PendingPerRecipient:
		return appendOutcome{err: &sessionstore.QuotaError{Quota: marconi.QuotaPendingPerRecipient,
			Limit: ns.Limits.PendingPerRecipient, Current: *pending}}, nil
	case ns.Limits.PendingBytesPerProject > 0 && projectBytes != nil &&
		*projectBytes+int64(len(ns.Payload)) > ns.Limits.PendingBytesPerProject:
		return appendOutcome{err: &sessionstore.QuotaError{Quota: marconi.QuotaPendingBytesPerProject,
			Limit: ns.Limits.PendingBytesPerProject, Current: *projectBytes}}, nil
	}
	// The recipient's row changed between the statement's snapshot and its
	// update: it expired or went away meanwhile, or (when the sender said
	// what it saw) it may have changed otherwise: the sender reads it again.
	if ns.Seen != nil {
		return appendOutcome{err: sessionstore.ErrRecipientChanged}, nil
	}
	return appendOutcome{err: sessionstore.ErrNotFound}, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// idempotencyLockKeys names the advisory lock of each idempotency key in
// batch (a sender's key within its tenant and project).
func idempotencyLockKeys(batch []*appendReq) []string {
	var keys []string
	for _, r := range batch {
		if ns := r.ns; r.isAppend() && ns.IdempotencyKey != "" {
			keys = append(keys, strings.Join([]string{"marconi.idem", ns.To.TenantID, ns.To.ProjectID, ns.FromSession, ns.IdempotencyKey}, "\x1f"))
		}
	}
	return keys
}
