package pgstore

import (
	"encoding/json"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/sessionstore"
)

// The appends of a batch in one statement. Most of what Postgres spends on
// an append statement is its executor's start and end, the same for one
// row as for fifty: run as a statement per append (appendSQL), a batch
// paid them per send, about a third of the server's CPU per durable send
// (docs/benchmarks-history.md, "The appends of a batch in one statement").
// appendSetSQL stores the appends of a batch together, grouped by
// recipient; what it does not store (any refusal, a duplicate, a recipient
// changed or gone) is answered by appendSQL, in a transaction of its own
// once the batch committed.

// defaultSetFrom is the fewest appends of a batch that appendSetSQL stores
// (Store.setFrom); statementPerAppend is the setFrom of a store that runs
// every append by appendSQL (WithStatementPerAppend), and of the appends
// appendSetSQL left.
const (
	defaultSetFrom     = 2
	statementPerAppend = math.MaxInt
)

// appendSetSQL stores whole groups: the appends of a batch to one recipient
// are stored together or not at all. A group is stored when every one of
// its appends would be stored by appendSQL, one after another in the
// group's order: each sender holds its token ($14, NULL: not checked), no
// earlier signal has its idempotency key, its project leaves room for its
// bytes (roomSQL, the cheap first refusal: the settle checks the limit
// under the project's lock), and the recipient is live, is the one its
// senders saw, and stays under its pending limit with the group's signals
// in it (cap: the recipient's pending count before the group must be below
// it). The group's signals take the seqs after the recipient's last, in the
// group's order (k, from 1). It returns the stored groups, each with the
// seq before its first signal.
//
// The per-append checks read, as appendSQL's do, through correlated
// subqueries that OFFSET 0 keeps whole: without it, Postgres may turn an
// EXISTS into a hashed subplan that reads every session with a token, or
// every signal with an idempotency key, once per statement.
//
// The sessions rows are updated in the order of the UPDATE's own plan: a
// batch of more than one recipient locks them first, in the global order
// (lockSessionsSQL), so the UPDATE takes no lock it does not hold.
//
// The appends, one element each: $1 group, $2 k, $3 id, $4 from_session,
// $5 kind, $6 payload, $7 created_at, $8 idempotency key, $9 delivery,
// $10 route_state, $11 idempotency since, $12 payload bytes, $13 pending
// bytes limit (0: none), $14 the sender's token hash, $15 now (the
// append's); the groups, one element each: $16 group, $17 tenant,
// $18 project, $19 session, $20 appends, $21 payload bytes, $22 cap,
// $23 now (the latest of its appends'), $24 $25 $26 $27 the recipient's
// registered_at, queue_instance, queue_attached_at and token_hash as its
// senders saw them ($24 NULL: not checked).
var appendSetSQL = `WITH m AS (
	SELECT * FROM unnest($1::int[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::timestamptz[],
		$8::text[], $9::text[], $10::text[], $11::timestamptz[], $12::bigint[], $13::bigint[], $14::bytea[], $15::timestamptz[])
		AS m(g, k, id, from_session, kind, payload, created_at, idem, delivery, route, since, bytes, bytes_limit, token, now)
), g AS (
	SELECT * FROM unnest($16::int[], $17::text[], $18::text[], $19::text[], $20::bigint[], $21::bigint[], $22::bigint[],
		$23::timestamptz[], $24::timestamptz[], $25::text[], $26::timestamptz[], $27::bytea[])
		AS g(g, tenant_id, project_id, session_id, n, bytes, cap, now, seen_at, seen_queue, seen_queue_at, seen_token)
), refused AS (
	SELECT m.g FROM m JOIN g ON g.g = m.g
	WHERE (m.token IS NOT NULL AND NOT EXISTS (SELECT 1 FROM sessions a
	        WHERE a.tenant_id = g.tenant_id AND a.project_id = g.project_id AND a.session_id = m.from_session
	          AND a.token_hash = m.token AND a.expires_at >= m.now OFFSET 0))
	   OR (m.idem IS NOT NULL AND EXISTS (SELECT 1 FROM (
	        SELECT d.tenant_id, d.project_id FROM signals d
	        WHERE d.from_session = m.from_session AND d.idempotency_key = m.idem
	          AND (m.since IS NULL OR d.created_at >= m.since)
	        OFFSET 0) d
	        WHERE d.tenant_id = g.tenant_id AND d.project_id = g.project_id))
	   OR (m.bytes_limit > 0 AND (SELECT r.project_bytes FROM (
	        ` + roomSQL("g.tenant_id", "g.project_id", "m.bytes", "m.bytes_limit") + `) r) + m.bytes > m.bytes_limit)
), bump AS (
	UPDATE sessions s SET last_seq = s.last_seq + g.n, pending_bytes = s.pending_bytes + g.bytes
	FROM g
	WHERE s.tenant_id = g.tenant_id AND s.project_id = g.project_id AND s.session_id = g.session_id
	  AND s.expires_at >= g.now AND s.last_seq - s.acked_seq < g.cap
	  AND (g.seen_at IS NULL OR (s.registered_at = g.seen_at AND s.queue_instance = g.seen_queue
	       AND s.queue_attached_at IS NOT DISTINCT FROM g.seen_queue_at AND s.token_hash = g.seen_token))
	  AND g.g NOT IN (SELECT refused.g FROM refused)
	RETURNING g.g, s.last_seq - g.n AS base
), ins AS (
	INSERT INTO signals (tenant_id, project_id, to_session, seq, id, from_session, kind, payload,
		created_at, idempotency_key, delivery, route_state)
	SELECT g.tenant_id, g.project_id, g.session_id, bump.base + m.k, m.id, m.from_session, m.kind, m.payload::json,
		m.created_at, m.idem, m.delivery, m.route
	FROM bump JOIN g ON g.g = bump.g JOIN m ON m.g = bump.g
)
SELECT g, base FROM bump`

// genericPlanSQL and autoPlanSQL run just before and just after
// appendSetSQL: it runs on its generic plan, and the batch's other
// statements as Postgres chooses (plan_cache_mode for the rest of the
// transaction). Postgres plans a prepared statement for its arguments at
// its first five runs and keeps the generic plan only once it looks no
// dearer than those; appendSetSQL planned for arrays of two or three
// appends (a light load's batches) looks cheaper than its generic plan,
// made for arrays of any length, so a connection whose first batches were
// small planned it again at every batch (seen: 10 custom plans in 30
// batches, the first five of two appends). Its generic plan finds every
// row through an index whatever the statistics (TestGenericPlanOfAppendSet).
// The other statements keep Postgres's choice: forced generic at a fresh
// database's first batch, the settle's (marconi_settle_leased) read of the
// batch's signals by id became a walk of every signal, at every batch (seen:
// a fleet run stalled at 0.6x its sends/s, 16 % of the machine in
// heap_hot_search_buffer under plpgsql_exec_function).
const (
	genericPlanSQL = `SET LOCAL plan_cache_mode = force_generic_plan`
	autoPlanSQL    = `SET LOCAL plan_cache_mode TO DEFAULT`
)

// appendSet is the appends of a batch (sorted by recipient) as
// appendSetSQL stores them: groups of one recipient each, in the batch's
// order, each listing its members' positions in the batch in arrival order.
type appendSet struct {
	groups [][]int
	// alone are the positions of the appends no group takes: their
	// recipient's senders saw it differently, so at most some of them
	// can be stored, and appendSQL decides which, in the same batch.
	alone []int
}

// size is how many appends the groups of set hold.
func (set *appendSet) size() int {
	n := 0
	for _, g := range set.groups {
		n += len(g)
	}
	return n
}

// newAppendSet groups the appends of batch, sorted by recipient.
func newAppendSet(batch []*appendReq) *appendSet {
	set := &appendSet{}
	for i := 0; i < len(batch); {
		j := i + 1
		for j < len(batch) && batch[j].recipient() == batch[i].recipient() {
			j++
		}
		var group []int
		for p := i; p < j; p++ {
			if batch[p].isAppend() {
				group = append(group, p)
			}
		}
		switch {
		case len(group) == 0:
		case seenAlike(batch, group):
			set.groups = append(set.groups, group)
		default:
			set.alone = append(set.alone, group...)
		}
		i = j
	}
	return set
}

// seenAlike reports whether the appends of group that say what they saw of
// their recipient all saw the same.
func seenAlike(batch []*appendReq, group []int) bool {
	var first *sessionstore.RecipientSeen
	for _, p := range group {
		seen := batch[p].ns.Seen
		switch {
		case seen == nil:
		case first == nil:
			first = seen
		case !seen.RegisteredAt.Equal(first.RegisteredAt) || seen.QueueInstance != first.QueueInstance ||
			!seen.QueueAttachedAt.Equal(first.QueueAttachedAt) || string(seen.TokenHash) != string(first.TokenHash):
			return false
		}
	}
	return true
}

// queue queues appendSetSQL for the groups of set, between genericPlanSQL
// and autoPlanSQL, each of the three a result to read.
func (set *appendSet) queue(b *pgx.Batch, batch []*appendReq) {
	n, gs := set.size(), len(set.groups)
	var (
		mGroup                               = make([]int32, n)
		mK, mBytes, mBytesLimit              = make([]int64, n), make([]int64, n), make([]int64, n)
		mID, mFrom, mKind, mDelivery, mRoute = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		mPayload, mIdem                      = make([]*string, n), make([]*string, n)
		mCreated                             = make([]time.Time, n)
		mSince                               = make([]*time.Time, n)
		mNow                                 = make([]time.Time, n)
		mToken                               = make([][]byte, n)
		gGroup                               = make([]int32, gs)
		gTenant, gProject, gSession          = make([]string, gs), make([]string, gs), make([]string, gs)
		gN, gBytes, gCap                     = make([]int64, gs), make([]int64, gs), make([]int64, gs)
		gNow                                 = make([]time.Time, gs)
		gSeenAt, gSeenQueueAt                = make([]*time.Time, gs), make([]*time.Time, gs)
		gSeenQueue                           = make([]*string, gs)
		gSeenToken                           = make([][]byte, gs)
	)
	j := 0 // the member
	for gi, group := range set.groups {
		gCap[gi] = math.MaxInt64
		for k, p := range group {
			ns := batch[p].ns
			if ns.IdempotencyKey != "" {
				mIdem[j] = &ns.IdempotencyKey
			}
			if len(ns.Payload) > 0 {
				s := string(ns.Payload)
				mPayload[j] = &s
			}
			mGroup[j], mK[j] = int32(gi), int64(k+1)
			mID[j], mFrom[j], mKind[j] = ns.ID, ns.FromSession, ns.Kind
			mCreated[j], mDelivery[j], mRoute[j] = ns.CreatedAt, string(ns.Delivery), string(ns.RouteState)
			mSince[j], mToken[j], mNow[j] = toNull(ns.IdempotencySince), ns.SenderTokenHash, batch[p].now
			if batch[p].now.After(gNow[gi]) {
				gNow[gi] = batch[p].now
			}
			mBytes[j], mBytesLimit[j] = int64(len(ns.Payload)), ns.Limits.PendingBytesPerProject
			gBytes[gi] += int64(len(ns.Payload))
			// The k-th append (from 0) is stored when the recipient's
			// pending count before the group is below its limit less k.
			if lim := ns.Limits.PendingPerRecipient; lim > 0 {
				gCap[gi] = min(gCap[gi], lim-int64(k))
			}
			if seen := ns.Seen; seen != nil {
				q := seen.QueueInstance
				gSeenAt[gi], gSeenQueue[gi], gSeenQueueAt[gi], gSeenToken[gi] = &seen.RegisteredAt, &q, toNull(seen.QueueAttachedAt), seen.TokenHash
			}
			j++
		}
		k := batch[group[0]].ns.To
		gGroup[gi], gN[gi] = int32(gi), int64(len(group))
		gTenant[gi], gProject[gi], gSession[gi] = k.TenantID, k.ProjectID, k.SessionID
	}
	b.Queue(genericPlanSQL)
	b.Queue(appendSetSQL,
		mGroup, mK, mID, mFrom, mKind, mPayload, mCreated, mIdem, mDelivery, mRoute, mSince, mBytes, mBytesLimit, mToken, mNow,
		gGroup, gTenant, gProject, gSession, gN, gBytes, gCap, gNow, gSeenAt, gSeenQueue, gSeenQueueAt, gSeenToken)
	b.Queue(autoPlanSQL)
}

// read reads what queue queued: appendSetSQL's rows into outs, the
// outcomes of batch; it returns the positions of the appends of its groups
// it did not store.
func (set *appendSet) read(br pgx.BatchResults, batch []*appendReq, outs []appendOutcome) ([]int, error) {
	stored := make([]bool, len(set.groups))
	if _, err := br.Exec(); err != nil { // genericPlanSQL
		return nil, err
	}
	var g int32
	var base int64
	err := forEachRow(br, []any{&g, &base}, func() {
		stored[g] = true
		for k, p := range set.groups[g] {
			outs[p] = appendOutcome{sig: storedSignal(batch[p].ns, base+int64(k)+1)}
		}
	})
	if err != nil {
		return nil, err
	}
	if _, err := br.Exec(); err != nil { // autoPlanSQL
		return nil, err
	}
	var left []int
	for gi, group := range set.groups {
		if !stored[gi] {
			left = append(left, group...)
		}
	}
	return left, nil
}

// storedSignal is ns stored as seq.
func storedSignal(ns sessionstore.NewSignal, seq int64) sessionstore.Signal {
	return sessionstore.Signal{
		ID: ns.ID, Seq: seq, To: ns.To, FromSession: ns.FromSession, Kind: ns.Kind,
		Payload: append(json.RawMessage(nil), ns.Payload...), CreatedAt: ns.CreatedAt.Truncate(time.Microsecond).UTC(),
		IdempotencyKey: ns.IdempotencyKey, Delivery: ns.Delivery, RouteState: ns.RouteState,
	}
}
