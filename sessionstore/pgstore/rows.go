package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/sessionstore"
)

// Session-row writes in the group commit. A touch (TouchSession), a queue
// placement (SetQueue), an attach (AttachQueue: both at once) and a detach
// (ClearQueue) ride the same batches as appends and acks: during a
// reconnect storm every detach, attach and heartbeat is one of these, and
// one commit per batch instead of one per write is what lets the stop and
// the reattach outrun the WAL flush rate.

// rowReq is a write to one session row: a proof of life, a queue placement,
// or both.
type rowReq struct {
	k     sessionstore.Key
	touch sessionstore.Touch
	// live, when set, is the time at which the session must be live for the
	// write to apply (a touch or an attach); zero, the row need only exist
	// (SetQueue).
	live time.Time
	// as, when set, is who must still hold the session for the write to
	// apply (TouchSessionAs).
	as    *sessionstore.Holder
	queue *queuePlacement // nil: the queue is left alone
	// clear, when set, makes this a ClearQueue (nothing else is set).
	clear *queueClear
}

// queueClear is ClearQueue's: the queue detached at at, while the
// attachment is still instance's of attachedAt.
type queueClear struct {
	instance       string
	attachedAt, at time.Time
}

// clearRowsSQL applies one layer of ClearQueues and returns the index of
// each one that cleared.
//
// $1 index, $2 tenant, $3 project, $4 session, $5 instance, $6 attached
// at, $7 detached at.
const clearRowsSQL = `UPDATE sessions AS s SET queue_instance = '', queue_attached_at = NULL, queue_detached_at = x.at
FROM unnest($1::int[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[], $7::timestamptz[])
	AS x(i, t, p, sid, inst, attached, at)
WHERE s.tenant_id = x.t AND s.project_id = x.p AND s.session_id = x.sid
  AND s.queue_instance = x.inst AND s.queue_instance <> '' AND s.queue_attached_at = x.attached
RETURNING x.i`

// queuePlacement is SetQueue's compare-and-set: instance holds the queue
// since at.
type queuePlacement struct {
	instance string
	at       time.Time
}

// queueCAS is SetQueue's compare against queue_latest_attach, the newest
// attach ever recorded (kept after a detach): an older attach is refused,
// and so is this attach again once it was cleared. Under READ COMMITTED a
// racing write is judged on the row the other wrote.
const queueCAS = `(x.inst IS NOT NULL AND (s.queue_latest_attach IS NULL OR s.queue_latest_attach < x.at
	OR (s.queue_latest_attach = x.at AND s.queue_instance <> '')))`

// sessionRowsSQL applies one layer of row writes (each session at most once)
// in one statement, and returns the index of each row it found, with its
// pending count (last_seq - acked_seq): a row not returned is ErrNotFound. Every row found is written, a refused
// compare-and-set as a no-op, so that found and written are one thing.
//
// $1 index, $2 tenant, $3 project, $4 session, $5 seen, $6 verb, $7 expires
// (NULL: leave alone), $8 live (NULL: the row need only exist), $9 queue
// instance (NULL: leave the queue alone), $10 queue attached at, $11 the
// registration that must hold the row (NULL: any) and $12 its token hash
// (as AckSignalsAs checks it: a row without one proves nothing).
const sessionRowsSQL = `UPDATE sessions AS s SET
	last_seen_at        = GREATEST(s.last_seen_at, x.seen),
	last_verb_at        = GREATEST(s.last_verb_at, x.verb),
	expires_at          = GREATEST(s.expires_at, x.exp),
	queue_instance      = CASE WHEN ` + queueCAS + ` THEN x.inst ELSE s.queue_instance END,
	queue_attached_at   = CASE WHEN ` + queueCAS + ` THEN x.at ELSE s.queue_attached_at END,
	queue_latest_attach = CASE WHEN ` + queueCAS + ` THEN x.at ELSE s.queue_latest_attach END
FROM unnest($1::int[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], $6::timestamptz[],
		$7::timestamptz[], $8::timestamptz[], $9::text[], $10::timestamptz[], $11::timestamptz[], $12::bytea[])
	AS x(i, t, p, sid, seen, verb, exp, live, inst, at, reg, tok)
WHERE s.tenant_id = x.t AND s.project_id = x.p AND s.session_id = x.sid
  AND (x.live IS NULL OR s.expires_at >= x.live)
  AND (x.reg IS NULL OR (s.registered_at = x.reg
       AND (s.token_hash IS NULL OR octet_length(s.token_hash) = 0 OR s.token_hash = x.tok)))
RETURNING x.i, s.last_seq - s.acked_seq`

// writeRow runs w in the next batch (group commit on) or in a transaction
// of its own, and returns ErrNotFound when its session was not there.
func (s *Store) writeRow(ctx context.Context, w *rowReq) error {
	return s.commit(ctx, &appendReq{row: w})
}

// rowLayers splits the row writes of batch (sorted by key, stably) into
// layers in which each session appears at most once: an UPDATE ... FROM
// writes a row once whatever the number of its matches, so the second
// write of a session in a batch goes in the next statement, after the
// first, in arrival order. Each layer lists indexes into batch.
func rowLayers(batch []*appendReq) [][]int {
	var layers [][]int
	seen := map[sessionstore.Key]int{}
	for i, r := range batch {
		if r.row == nil {
			continue
		}
		n := seen[r.row.k]
		seen[r.row.k] = n + 1
		if n == len(layers) {
			layers = append(layers, nil)
		}
		layers[n] = append(layers[n], i)
	}
	return layers
}

// splitLayer splits a layer into its writes (sessionRowsSQL) and its
// clears (clearRowsSQL): each session is in one of them at most, so their
// order within the layer does not matter.
func splitLayer(batch []*appendReq, layer []int) (writes, clears []int) {
	for _, i := range layer {
		if batch[i].row.clear != nil {
			clears = append(clears, i)
		} else {
			writes = append(writes, i)
		}
	}
	return writes, clears
}

// queueRows queues each layer's statements on b: a sessionRowsSQL for its
// writes and a clearRowsSQL for its clears, each only when it has any.
func queueRows(b *pgx.Batch, batch []*appendReq, layers [][]int) {
	for _, layer := range layers {
		writes, clears := splitLayer(batch, layer)
		if len(writes) > 0 {
			queueWrites(b, batch, writes)
		}
		if len(clears) > 0 {
			queueClears(b, batch, clears)
		}
	}
}

func queueWrites(b *pgx.Batch, batch []*appendReq, writes []int) {
	n := len(writes)
	var (
		idx                    = make([]int32, n)
		tenants, projects, ids = make([]string, n), make([]string, n), make([]string, n)
		seen, verb, exp, live  = make([]*time.Time, n), make([]*time.Time, n), make([]*time.Time, n), make([]*time.Time, n)
		inst                   = make([]*string, n)
		at, reg                = make([]*time.Time, n), make([]*time.Time, n)
		tok                    = make([][]byte, n)
	)
	for j, i := range writes {
		w := batch[i].row
		idx[j] = int32(i)
		tenants[j], projects[j], ids[j] = w.k.TenantID, w.k.ProjectID, w.k.SessionID
		seen[j], verb[j], exp[j], live[j] = toNull(w.touch.SeenAt), toNull(w.touch.VerbAt), toNull(w.touch.ExpiresAt), toNull(w.live)
		if q := w.queue; q != nil {
			inst[j], at[j] = &q.instance, toNull(q.at.Truncate(time.Microsecond))
		}
		if h := w.as; h != nil {
			reg[j], tok[j] = &h.RegisteredAt, h.TokenHash
		}
	}
	b.Queue(sessionRowsSQL, idx, tenants, projects, ids, seen, verb, exp, live, inst, at, reg, tok)
}

func queueClears(b *pgx.Batch, batch []*appendReq, clears []int) {
	n := len(clears)
	var (
		idx                    = make([]int32, n)
		tenants, projects, ids = make([]string, n), make([]string, n), make([]string, n)
		inst                   = make([]string, n)
		attached, at           = make([]time.Time, n), make([]time.Time, n)
	)
	for j, i := range clears {
		w := batch[i].row
		idx[j] = int32(i)
		tenants[j], projects[j], ids[j] = w.k.TenantID, w.k.ProjectID, w.k.SessionID
		inst[j], attached[j], at[j] = w.clear.instance, w.clear.attachedAt.Truncate(time.Microsecond), w.clear.at
	}
	b.Queue(clearRowsSQL, idx, tenants, projects, ids, inst, attached, at)
}

// readRows reads the outcome of each layer into outs: for a write, the
// pending count of its session, or ErrNotFound when it was not found; for a
// clear, whether it cleared.
func readRows(br pgx.BatchResults, batch []*appendReq, layers [][]int, outs []appendOutcome) error {
	for _, layer := range layers {
		writes, clears := splitLayer(batch, layer)
		if len(writes) > 0 {
			for _, i := range writes {
				outs[i] = appendOutcome{err: sessionstore.ErrNotFound}
			}
			var i int32
			var pending int64
			if err := forEachRow(br, []any{&i, &pending}, func() { outs[i] = appendOutcome{pending: int(pending)} }); err != nil {
				return err
			}
		}
		if len(clears) > 0 {
			var i int32
			if err := forEachRow(br, []any{&i}, func() { outs[i] = appendOutcome{cleared: true} }); err != nil {
				return err
			}
		}
	}
	return nil
}

// forEachRow scans each row of the batch's next result into dest and
// calls fn.
func forEachRow(br pgx.BatchResults, dest []any, fn func()) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	_, err = pgx.ForEachRow(rows, dest, func() error { fn(); return nil })
	return err
}
