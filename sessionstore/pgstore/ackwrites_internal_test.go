package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
)

// benchPayload is the payload of the ack and append benchmarks, 60 bytes of
// JSON: a small signal.
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
// an ack, and returns how many it acknowledged.
func ackInTx(t *testing.T, tx pgx.Tx, k sessionstore.Key, upTo int64) int {
	t.Helper()
	ctx := t.Context()
	if _, err := tx.Exec(ctx, ackSeqSQL, k.TenantID, k.ProjectID, k.SessionID, upTo); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRow(ctx, ackSQL, k.TenantID, k.ProjectID, k.SessionID, int64(DefaultAckedPayloadBytes)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAckWritesNoSignal: an acknowledgement of signals whose payloads are no
// larger than WithAckedPayloadBytes moves its session's acked_seq and byte
// counter and writes no signal: each signal is written once, by its append,
// and deleted once, by Prune. Until acked_seq alone acknowledged, an
// ack marked every signal it passed (acked_at set, payload dropped), a
// HOT update per signal, about a tenth of a durable send's WAL
// (docs/benchmarks-history.md, "Acknowledged by acked_seq alone"). The
// counters still lose exactly the bytes acknowledged, and the signals stay
// readable for a duplicate send until Prune.
func TestAckWritesNoSignal(t *testing.T) {
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
	if got := ackInTx(t, tx, k, 1); got != 1 {
		t.Fatalf("the ack of seq 1 acknowledged %d signals, want 1", got)
	}
	if got := ackInTx(t, tx, k, n-1); got != n-2 {
		t.Fatalf("the ack of seqs 2..%d acknowledged %d signals, want %d", n-1, got, n-2)
	}
	if got := ackInTx(t, tx, k, n-1); got != 0 {
		t.Fatalf("the ack of seq %d again acknowledged %d signals, want 0", n-1, got)
	}
	if updated, _ := xactUpdates(t, tx, "signals"); updated != 0 {
		t.Errorf("three acks updated %d signals, want none", updated)
	}
	var sessBytes, rows, payloads int64
	if err := tx.QueryRow(ctx, `SELECT pending_bytes FROM sessions WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3`,
		k.TenantID, k.ProjectID, k.SessionID).Scan(&sessBytes); err != nil {
		t.Fatal(err)
	}
	if want := int64(len(benchPayload)); sessBytes != want {
		t.Errorf("the session's pending bytes after acknowledging %d of %d signals: %d, want %d (one payload)", n-1, n, sessBytes, want)
	}
	var deltas int64
	if err := tx.QueryRow(ctx, `SELECT coalesce(sum(delta), 0) FROM project_usage_deltas`).Scan(&deltas); err != nil {
		t.Fatal(err)
	}
	if want := -int64(n-1) * int64(len(benchPayload)); deltas != want {
		t.Errorf("the project's deltas after the acks: %d, want %d", deltas, want)
	}
	if err := tx.QueryRow(ctx, `SELECT count(*), count(payload) FROM signals`).Scan(&rows, &payloads); err != nil {
		t.Fatal(err)
	}
	if rows != n || payloads != n {
		t.Errorf("after the acks: %d signals stored, %d with their payloads; want all %d until Prune", rows, payloads, n)
	}

	// The last one, explained: nothing in its plan writes signals.
	if _, err := tx.Exec(ctx, ackSeqSQL, k.TenantID, k.ProjectID, k.SessionID, int64(n)); err != nil {
		t.Fatal(err)
	}
	var plan []struct {
		Plan walNode `json:"Plan"`
	}
	if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) `+ackSQL,
		k.TenantID, k.ProjectID, k.SessionID, int64(DefaultAckedPayloadBytes)).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	if update, ok := plan[0].Plan.find("ModifyTable", "signals"); ok && update.WALRecords > 0 {
		t.Errorf("the ack of a small signal wrote %d WAL records of signals, want none", update.WALRecords)
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

// TestAckDropsLargePayloads: an ack drops the payloads larger than
// WithAckedPayloadBytes of the signals it passes, and keeps the others until
// Prune (issue 19.1: what a day of acknowledged signals keeps is bounded by
// their count, whatever their senders send); at 0 it drops every one. Each
// ack takes the bytes of all it passes off the counters, dropped or kept.
func TestAckDropsLargePayloads(t *testing.T) {
	pgtest.DatabaseURL(t)
	t.Parallel()
	small := json.RawMessage(`"small"`)
	large := json.RawMessage(`"` + strings.Repeat("x", 300) + `"`)
	for _, tt := range []struct {
		keep int
		want []bool // payload kept, per seq
	}{
		{keep: DefaultAckedPayloadBytes, want: []bool{true, false, true, true}},
		{keep: 0, want: []bool{false, false, false, true}},
	} {
		t.Run(fmt.Sprintf("keep=%d", tt.keep), func(t *testing.T) {
			u := pgtest.Schema(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s, k, now := storeWithBob(ctx, t, u, WithAckedPayloadBytes(tt.keep))
			for _, p := range []json.RawMessage{small, large, small, large} {
				appendSignals(ctx, t, s, k, now, 1, p)
			}
			if n, err := s.AckSignals(ctx, k, 3, now); err != nil || n != 3 {
				t.Fatalf("AckSignals(<=3): %d, %v; want 3", n, err)
			}
			rows, err := s.pool.Query(ctx, `SELECT payload IS NOT NULL FROM signals ORDER BY seq`)
			if err != nil {
				t.Fatal(err)
			}
			kept, err := pgx.CollectRows(rows, pgx.RowTo[bool])
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(kept, tt.want) {
				t.Errorf("payloads kept after acknowledging seqs 1..3: %v, want %v", kept, tt.want)
			}
			var pending int64
			if err := s.pool.QueryRow(ctx, `SELECT pending_bytes FROM sessions`).Scan(&pending); err != nil {
				t.Fatal(err)
			}
			if pending != int64(len(large)) {
				t.Errorf("pending bytes after the ack: %d, want %d (seq 4's)", pending, len(large))
			}
		})
	}
}
