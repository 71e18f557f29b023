package pgstore

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
)

// benchPayload is the payload of the ack and append benchmarks, 60 bytes of
// JSON: a small signal, whose acknowledged version is nearly as large as the
// row it replaces.
var benchPayload = json.RawMessage(`"` + "012345678901234567890123456789012345678901234567890123456" + `"`)

// appendSignals appends n signals of payload to k, each in its own commit.
func appendSignals(ctx context.Context, t *testing.T, s *Store, k sessionstore.Key, now time.Time, n int, payload json.RawMessage) {
	t.Helper()
	for range n {
		if _, _, err := s.AppendSignal(ctx, sessionstore.NewSignal{ID: uuid.NewString(), To: k, FromSession: "alice",
			Kind: "k", Payload: payload, CreatedAt: now}, now); err != nil {
			t.Fatal(err)
		}
	}
}

// xactUpdates is how many rows of table the transaction updated so far, and
// how many of those updates were HOT (heap-only: the new version in the old
// one's page, no index entry written). The pg_stat_get_xact_* counters are
// the transaction's own, current at once.
func xactUpdates(t *testing.T, tx pgx.Tx, table string) (updated, hot int64) {
	t.Helper()
	if err := tx.QueryRow(t.Context(), `SELECT pg_stat_get_xact_tuples_updated($1::regclass),
		pg_stat_get_xact_tuples_hot_updated($1::regclass)`, table).Scan(&updated, &hot); err != nil {
		t.Fatal(err)
	}
	return updated, hot
}

// ackInTx acknowledges k's signals up to upTo in tx, with the statements of
// an ack, and returns how many it marked.
func ackInTx(t *testing.T, tx pgx.Tx, k sessionstore.Key, upTo int64, at time.Time) int {
	t.Helper()
	ctx := t.Context()
	if _, err := tx.Exec(ctx, ackSeqSQL, k.TenantID, k.ProjectID, k.SessionID, upTo); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRow(ctx, ackSQL, k.TenantID, k.ProjectID, k.SessionID, at).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAckIsAHOTUpdate: marking a signal acknowledged writes no index entry.
// With acked_at in an index (signals_unacked_idx's predicate and
// signals_acked_at_idx before migration 0010) no ack was HOT; each wrote a
// new entry in every index of signals. The ack's WAL shows it too: one
// record for the signal (and its page's pruning, when there is any to do)
// where there were four.
func TestAckIsAHOTUpdate(t *testing.T) {
	u := pgtest.Schema(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, k, now := storeWithBob(ctx, t, u)
	const n = 5
	appendSignals(ctx, t, s, k, now, n, benchPayload)

	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // rolled back on purpose
	for seq := int64(1); seq < n; seq++ {
		if got := ackInTx(t, tx, k, seq, now); got != 1 {
			t.Fatalf("the ack of seq %d marked %d signals, want 1", seq, got)
		}
	}
	if updated, hot := xactUpdates(t, tx, "signals"); updated != n-1 || hot != updated {
		t.Errorf("%d acks updated %d signals, %d of them HOT; want every one HOT", n-1, updated, hot)
	}

	// The last one, explained: the update of its signal writes one WAL
	// record (two if its scan pruned the page first), where it wrote the
	// heap and then each of the three indexes.
	if _, err := tx.Exec(ctx, ackSeqSQL, k.TenantID, k.ProjectID, k.SessionID, int64(n)); err != nil {
		t.Fatal(err)
	}
	var plan []struct {
		Plan walNode `json:"Plan"`
	}
	if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) `+ackSQL,
		k.TenantID, k.ProjectID, k.SessionID, now).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	update, ok := plan[0].Plan.find("ModifyTable", "signals")
	if !ok {
		t.Fatalf("no update of signals in the ack's plan: %+v", plan[0].Plan)
	}
	if update.WALRecords > 2 {
		t.Errorf("the update of one acknowledged signal wrote %d WAL records, want 1 (a HOT update; 2 with a pruning)", update.WALRecords)
	}
}

// walNode is the part of an EXPLAIN (WAL, FORMAT JSON) node the tests read.
// A node's WAL records include its children's.
type walNode struct {
	NodeType   string    `json:"Node Type"`
	Relation   string    `json:"Relation Name"`
	WALRecords int64     `json:"WAL Records"`
	Plans      []walNode `json:"Plans"`
}

// find returns the first node under n (n included) of nodeType on relation.
func (n walNode) find(nodeType, relation string) (walNode, bool) {
	if n.NodeType == nodeType && n.Relation == relation {
		return n, true
	}
	for _, c := range n.Plans {
		if f, ok := c.find(nodeType, relation); ok {
			return f, true
		}
	}
	return walNode{}, false
}

// pagesOf is the heap pages of table that hold rows of the transaction's
// snapshot, and how many rows each holds.
func pagesOf(t *testing.T, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, table string) map[int64]int64 {
	t.Helper()
	rows, err := db.Query(t.Context(), `SELECT (ctid::text::point)[0]::bigint, count(*) FROM `+
		pgx.Identifier{table}.Sanitize()+` GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]int64{}
	for rows.Next() {
		var page, n int64
		if err := rows.Scan(&page, &n); err != nil {
			t.Fatal(err)
		}
		out[page] = n
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	return out
}

// TestFullPagesKeepRoomForHOTAcks: a page of signals that appends filled
// to the table's fillfactor keeps room for the ack of every signal it holds
// (of small payloads, the tightest case: the acknowledged version is nearly
// as large as the row), with no pruning at all, as when a snapshot held
// anywhere in the database forbids it. At Postgres's default fillfactor
// (100) the first ack finds its page full and writes its new version
// elsewhere, with new entries in every index.
func TestFullPagesKeepRoomForHOTAcks(t *testing.T) {
	u := pgtest.Schema(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, k, now := storeWithBob(ctx, t, u)
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// Signals until the first page is full and a third one is begun.
	for len(pagesOf(t, conn, "signals")) < 3 {
		appendSignals(ctx, t, s, k, now, 10, benchPayload)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // rolled back on purpose
	onFirst := pagesOf(t, tx, "signals")[0]
	for seq := int64(1); seq <= onFirst; seq++ {
		if got := ackInTx(t, tx, k, seq, now); got != 1 {
			t.Fatalf("the ack of seq %d marked %d signals, want 1", seq, got)
		}
	}
	if updated, hot := xactUpdates(t, tx, "signals"); updated != onFirst || hot != updated {
		t.Errorf("acknowledging the %d signals of a full page updated %d, %d of them HOT; want every one HOT", onFirst, updated, hot)
	}
}

// TestFullPagesKeepRoomForHOTSessionWrites: a page of sessions filled to
// the table's fillfactor keeps room for one rewrite of every row it holds
// (an append's seq bump, an ack's acked_seq: each writes no indexed column),
// with no pruning at all. At the default fillfactor the first such write
// finds its page full.
func TestFullPagesKeepRoomForHOTSessionWrites(t *testing.T) {
	u := pgtest.Schema(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, _, now := storeWithBob(ctx, t, u)
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for len(pagesOf(t, conn, "sessions")) < 3 {
		if _, err := s.CreateSession(ctx, sessionstore.Session{Key: sessionstore.Key{TenantID: "t", ProjectID: "p",
			SessionID: uuid.NewString()}, TokenHash: []byte(uuid.NewString()), Surface: "claude_code",
			RuntimeMode: "stateless", RuntimeModeSource: "default", ClientID: "client-build-1.2.3",
			RegisteredAt: now, ExpiresAt: now.Add(time.Hour)}, now); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // rolled back on purpose
	tag, err := tx.Exec(ctx, `UPDATE sessions SET last_seq = last_seq + 1, pending_bytes = pending_bytes + 60
		WHERE (ctid::text::point)[0] = 0`)
	if err != nil {
		t.Fatal(err)
	}
	updated, hot := xactUpdates(t, tx, "sessions")
	if updated != tag.RowsAffected() || updated < 2 || hot != updated {
		t.Errorf("one write of each of the %d session rows of a full page: %d updated, %d of them HOT; want every one HOT",
			tag.RowsAffected(), updated, hot)
	}
}
