package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
)

// ackPlan builds one recipient's history of n signals, each appended and
// then acknowledged on its own (as an attached client acks every signal),
// with no VACUUM of signals and a snapshot held open meanwhile by another
// connection, so that no dead row version can be removed or its index entry
// marked dead: what a lagging (or disabled) autovacuum leaves. Every
// acknowledged signal stays in the primary key until Prune. It then
// appends one more signal and returns the plan of ackSQL acknowledging it,
// with its buffers: EXPLAIN (ANALYZE, BUFFERS) of the real statement with
// the real arguments, after ackSeqSQL, in a transaction rolled back.
func ackPlan(t *testing.T, n int) (ack, pending explainNode) {
	t.Helper()
	u := pgtest.Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, k, now := storeWithBob(ctx, t, u)
	holder, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	snap, err := holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Rollback(context.Background())                                 //nolint:errcheck // the test is over
	if _, err := snap.Exec(ctx, `SELECT count(*) FROM signals`); err != nil { // takes the snapshot
		t.Fatal(err)
	}

	appendOne := func() {
		t.Helper()
		_, _, err := s.AppendSignal(ctx, sessionstore.NewSignal{ID: uuid.NewString(), To: k, FromSession: "alice",
			Kind: "k", Payload: json.RawMessage(`{"n":1}`), CreatedAt: now}, now)
		if err != nil {
			t.Fatal(err)
		}
	}
	for seq := 1; seq <= n; seq++ {
		appendOne()
		if acked, err := s.AckSignals(ctx, k, int64(seq), now); err != nil || acked != 1 {
			t.Fatalf("ack of seq %d: %d acknowledged, %v; want 1", seq, acked, err)
		}
	}
	// The snapshot goes, and VACUUM cleans the session's row of its
	// versions (an append and an ack each made one), so that what is
	// measured below is the walk of signals; signals keeps every dead entry.
	if err := snap.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `VACUUM sessions`); err != nil {
		t.Fatal(err)
	}
	appendOne()
	var pendingPlan []struct {
		Plan explainNode `json:"Plan"`
	}
	if err := conn.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+pendingSQL,
		k.TenantID, k.ProjectID, k.SessionID, int64(0), nil).Scan(&pendingPlan); err != nil {
		t.Fatal(err)
	}

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // rolled back on purpose
	if _, err := tx.Exec(ctx, ackSeqSQL, k.TenantID, k.ProjectID, k.SessionID, int64(n+1)); err != nil {
		t.Fatal(err)
	}
	var plan []struct {
		Plan explainNode `json:"Plan"`
	}
	if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+ackSQL,
		k.TenantID, k.ProjectID, k.SessionID, int64(DefaultAckedPayloadBytes)).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := tx.QueryRow(ctx, countPendingSQL, k.TenantID, k.ProjectID, k.SessionID).Scan(&left); err != nil || left != 0 {
		t.Fatalf("after the ack of seq %d, %d signals pending (%v); want 0", n+1, left, err)
	}
	return plan[0].Plan, pendingPlan[0].Plan
}

// storeWithBob opens a store on u with one live session, bob's, closed
// when the test ends.
func storeWithBob(ctx context.Context, t *testing.T, u string, opts ...Option) (*Store, sessionstore.Key, time.Time) {
	t.Helper()
	s, err := Open(ctx, u, append([]Option{WithMaxConns(2)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	now := time.Now().UTC().Truncate(time.Microsecond)
	k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "bob"}
	if _, err := s.CreateSession(ctx, sessionstore.Session{Key: k, TokenHash: []byte(uuid.NewString()),
		RegisteredAt: now, ExpiresAt: now.Add(time.Hour)}, now); err != nil {
		t.Fatal(err)
	}
	return s, k, now
}

// explainNode is the part of one node of EXPLAIN (FORMAT JSON) that the
// test reads.
type explainNode struct {
	NodeType   string        `json:"Node Type"`
	Relation   string        `json:"Relation Name"`
	Index      string        `json:"Index Name"`
	Cond       string        `json:"Index Cond"`
	Parent     string        `json:"Parent Relationship"`
	Subplan    string        `json:"Subplan Name"`
	SharedHit  int64         `json:"Shared Hit Blocks"`
	SharedRead int64         `json:"Shared Read Blocks"`
	Rows       float64       `json:"Actual Rows"`
	Plans      []explainNode `json:"Plans"`
}

// blocks is the shared buffers n touched, its children's included.
func (n explainNode) blocks() int64 { return n.SharedHit + n.SharedRead }

// relationBlocks is the shared buffers that the nodes of the tree under n
// reading or writing rel touched themselves (their children's not
// counted): a scan of signals whose InitPlan reads the session's row is
// counted without that read.
func (n explainNode) relationBlocks(rel string) int64 {
	var b int64
	if n.Relation == rel {
		b = n.blocks()
		for _, c := range n.Plans {
			b -= c.blocks()
		}
	}
	for _, c := range n.Plans {
		b += c.relationBlocks(rel)
	}
	return b
}

// String is the tree under n, one node a line, with its buffers.
func (n explainNode) String() string { return n.indent("") }

func (n explainNode) indent(pre string) string {
	s := fmt.Sprintf("%s%s %s %s %s %s %s: %d buffers, %v rows\n",
		pre, n.Parent, n.Subplan, n.NodeType, n.Relation, n.Index, n.Cond, n.blocks(), n.Rows)
	for _, c := range n.Plans {
		s += c.indent(pre + "  ")
	}
	return s
}

// TestAckScanBoundedBelow: acknowledging the next signal of a recipient
// costs about the same whether 50 or 2000 acknowledged signals precede it
// that no VACUUM removed yet. Without the lower bound (ack_floor) the ack
// walked every one of them from the recipient's first seq, visiting the
// heap for each: O(n) per ack, O(n²) per recipient (14 buffers after 50,
// 247 after 2000, where the bound gives 10 and 11; the acknowledged
// signals stay in the primary key until Prune).
func TestAckScanBoundedBelow(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (4 000 appends and acks, each its own commit): skipped by -short")
	}
	pgtest.DatabaseURL(t)
	t.Parallel()
	const small, large = 50, 2000
	planSmall, pendingSmall := ackPlan(t, small)
	planLarge, pendingLarge := ackPlan(t, large)
	// Only the buffers of signals count. The session's row is read too, and
	// VACUUM cannot clean its versions while a test of another package holds
	// a snapshot of the database: its lookup then walks a chain of dead
	// versions (30 buffers seen), which says nothing about signals.
	//
	// A read of the pending signals (drain, replay, the piggyback) from
	// seq 0 is bounded by acked_seq the same way.
	if pSmall, pLarge := pendingSmall.relationBlocks("signals"), pendingLarge.relationBlocks("signals"); pLarge > 2*pSmall+4 {
		t.Errorf("reading the pending signals touched %d buffers after %d acknowledged signals, %d after %d: it walks the acknowledged history\n%s",
			pLarge, large, pSmall, small, pendingLarge)
	}
	// The read of the acknowledged range; the session's counter and the
	// project's delta are written beside it.
	bSmall, bLarge := planSmall.relationBlocks("signals"), planLarge.relationBlocks("signals")
	t.Logf("the ack of the next signal touched %d buffers of signals after %d acknowledged signals, %d after %d (%d and %d in all)",
		bSmall, small, bLarge, large, planSmall.blocks(), planLarge.blocks())
	if bLarge > 2*bSmall+4 {
		t.Fatalf("the ack of the next signal touched %d buffers after %d acknowledged signals, %d after %d: it walks the acknowledged history\n%s",
			bLarge, large, bSmall, small, planLarge)
	}
}

// TestAcksInOneBatch: acks of one recipient that share a batch (one
// transaction) each mark their own range, in order: a second ack that moves
// acked_seq marks the signals after the first's, one that does not move it
// marks nothing, and one after an append in the same batch marks that
// signal too, whether the batch's appends are one statement or one each.
// The batch is sent as one, so a failure is not hidden by the one-by-one
// retry of runBatch.
func TestAcksInOneBatch(t *testing.T) {
	for _, mode := range []struct {
		name    string
		setFrom int
	}{{"one statement", 1}, {"statement per append", statementPerAppend}} {
		t.Run(mode.name, func(t *testing.T) { acksInOneBatch(t, mode.setFrom) })
	}
}

func acksInOneBatch(t *testing.T, setFrom int) {
	u := pgtest.Schema(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, k, now := storeWithBob(ctx, t, u)
	send := func() *appendReq {
		return &appendReq{now: now, ns: sessionstore.NewSignal{ID: uuid.NewString(), To: k, FromSession: "alice",
			Kind: "k", Payload: json.RawMessage(`{"n":1}`), CreatedAt: now}}
	}
	for range 6 {
		if _, _, err := s.AppendSignal(ctx, send().ns, now); err != nil {
			t.Fatal(err)
		}
	}
	ack := func(upTo int64) *appendReq { return &appendReq{ack: &ackReq{k: k, upTo: upTo, at: now}} }
	batch := func(reqs []*appendReq, want []int, pending int) {
		t.Helper()
		if left, err := s.sendBatch(ctx, 0, reqs, setFrom); err != nil || len(left) > 0 {
			t.Fatalf("the batch failed: %v, or left %d appends", err, len(left))
		}
		var got []int
		for _, r := range reqs {
			if r.out.err != nil {
				t.Fatalf("a member failed: %v", r.out.err)
			}
			if r.ack != nil {
				got = append(got, r.out.acked)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("acknowledged by the batch's acks: %v, want %v", got, want)
		}
		if n, err := s.CountPending(ctx, k); err != nil || n != pending {
			t.Errorf("pending after the batch: %d, %v; want %d", n, err, pending)
		}
	}
	batch([]*appendReq{ack(2), ack(4)}, []int{2, 2}, 2)
	batch([]*appendReq{ack(5), ack(3), ack(5)}, []int{1, 0, 0}, 1)
	batch([]*appendReq{ack(6), send(), ack(100), ack(100)}, []int{1, 1, 0}, 0)
}
