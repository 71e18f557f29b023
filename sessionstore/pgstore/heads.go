package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/sessionstore"
)

// headsSQL reads the live sessions among the keys $1, $2, $3 with their
// last and acknowledged seqs, in one statement through the primary key.
const headsSQL = `SELECT ` + sessionCols + `, last_seq, acked_seq FROM sessions
JOIN unnest($1::text[], $2::text[], $3::text[]) AS x(t, p, sid)
	ON tenant_id = x.t AND project_id = x.p AND session_id = x.sid
WHERE expires_at >= $4`

// SessionHeads implements sessionstore.Store.
func (s *Store) SessionHeads(ctx context.Context, keys []sessionstore.Key, now time.Time) (map[sessionstore.Key]sessionstore.SessionHead, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return nil, wrap("session heads", err)
	}
	ts, ps, ss := make([]string, len(keys)), make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		ts[i], ps[i], ss[i] = k.TenantID, k.ProjectID, k.SessionID
	}
	rows, err := s.pool.Query(ctx, headsSQL, ts, ps, ss, now)
	if err != nil {
		return nil, wrap("session heads", err)
	}
	defer rows.Close()
	out := make(map[sessionstore.Key]sessionstore.SessionHead, len(keys))
	for rows.Next() {
		var h sessionstore.SessionHead
		if h.Session, err = scanSession(scanAlso{rows, []any{&h.LastSeq, &h.AckedSeq}}); err != nil {
			return nil, wrap("session heads", err)
		}
		out[h.Key] = h
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("session heads", err)
	}
	return out, nil
}

// scanAlso scans a row's columns after scanSession's into extra.
type scanAlso struct {
	row   pgx.Row
	extra []any
}

func (r scanAlso) Scan(dest ...any) error { return r.row.Scan(append(dest, r.extra...)...) }
