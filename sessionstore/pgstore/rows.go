package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/sessionstore"
)

// Session-row writes in the group commit. A touch (TouchSession), a queue
// placement (SetQueue) and an attach (AttachQueue: both at once) ride the
// same batches as appends and acks: during a reconnect storm every attach
// and every heartbeat is one of these, and one commit per batch instead of
// one per write is what lets the reattach outrun the WAL flush rate.

// rowReq is a write to one session row: a proof of life, a queue placement,
// or both.
type rowReq struct {
	k     sessionstore.Key
	touch sessionstore.Touch
	// live, when set, is the time at which the session must be live for the
	// write to apply (a touch or an attach); zero, the row need only exist
	// (SetQueue).
	live  time.Time
	queue *queuePlacement // nil: the queue is left alone
}

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
// instance (NULL: leave the queue alone), $10 queue attached at.
const sessionRowsSQL = `UPDATE sessions AS s SET
	last_seen_at        = GREATEST(s.last_seen_at, x.seen),
	last_verb_at        = GREATEST(s.last_verb_at, x.verb),
	expires_at          = GREATEST(s.expires_at, x.exp),
	queue_instance      = CASE WHEN ` + queueCAS + ` THEN x.inst ELSE s.queue_instance END,
	queue_attached_at   = CASE WHEN ` + queueCAS + ` THEN x.at ELSE s.queue_attached_at END,
	queue_latest_attach = CASE WHEN ` + queueCAS + ` THEN x.at ELSE s.queue_latest_attach END
FROM unnest($1::int[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], $6::timestamptz[],
		$7::timestamptz[], $8::timestamptz[], $9::text[], $10::timestamptz[])
	AS x(i, t, p, sid, seen, verb, exp, live, inst, at)
WHERE s.tenant_id = x.t AND s.project_id = x.p AND s.session_id = x.sid
  AND (x.live IS NULL OR s.expires_at >= x.live)
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

// queueRows queues one sessionRowsSQL per layer on b.
func queueRows(b *pgx.Batch, batch []*appendReq, layers [][]int) {
	for _, layer := range layers {
		n := len(layer)
		var (
			idx                    = make([]int32, n)
			tenants, projects, ids = make([]string, n), make([]string, n), make([]string, n)
			seen, verb, exp, live  = make([]*time.Time, n), make([]*time.Time, n), make([]*time.Time, n), make([]*time.Time, n)
			inst                   = make([]*string, n)
			at                     = make([]*time.Time, n)
		)
		for j, i := range layer {
			w := batch[i].row
			idx[j] = int32(i)
			tenants[j], projects[j], ids[j] = w.k.TenantID, w.k.ProjectID, w.k.SessionID
			seen[j], verb[j], exp[j], live[j] = toNull(w.touch.SeenAt), toNull(w.touch.VerbAt), toNull(w.touch.ExpiresAt), toNull(w.live)
			if q := w.queue; q != nil {
				inst[j], at[j] = &q.instance, toNull(q.at.Truncate(time.Microsecond))
			}
		}
		b.Queue(sessionRowsSQL, idx, tenants, projects, ids, seen, verb, exp, live, inst, at)
	}
}

// readRows reads the outcome of each layer into outs: the pending count of
// every row write whose session was found, ErrNotFound for the others.
func readRows(br pgx.BatchResults, layers [][]int, outs []appendOutcome) error {
	for _, layer := range layers {
		for _, i := range layer {
			outs[i] = appendOutcome{err: sessionstore.ErrNotFound}
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		var (
			i       int32
			pending int64
		)
		_, err = pgx.ForEachRow(rows, []any{&i, &pending}, func() error {
			outs[i] = appendOutcome{pending: int(pending)}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
