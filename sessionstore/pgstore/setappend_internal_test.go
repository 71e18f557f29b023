package pgstore

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/storetest"
)

// setFixture is two stores on two schemas holding the same sessions: one
// storing every batch's appends by one statement (setFrom 1, so a batch of
// one append too), the other by a statement each. Recipients r0 to r4 are
// live, r0 to r2 with a queue; "old" has expired by now; senders a, b and c
// hold tokens tok-a, tok-b and tok-c.
type setFixture struct {
	set, each *Store
	urls      [2]string
	now       time.Time
	seen      map[string]*sessionstore.RecipientSeen
}

func newSetFixture(ctx context.Context, t *testing.T) *setFixture {
	t.Helper()
	f := &setFixture{seen: map[string]*sessionstore.RecipientSeen{}}
	start := time.Now().UTC().Truncate(time.Microsecond)
	f.now = start.Add(2 * time.Minute)
	for i, perAppend := range []bool{false, true} {
		f.urls[i] = pgtest.Schema(t)
		s, err := Open(ctx, f.urls[i], WithGroupCommit(false), WithMaxConns(2), WithStatementPerAppend(perAppend))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if perAppend {
			f.each = s
		} else {
			s.setFrom = 1
			f.set = s
		}
		create := func(id string, token string, expires time.Time) {
			k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: id}
			if _, err := s.CreateSession(ctx, sessionstore.Session{Key: k, TokenHash: []byte(token),
				RegisteredAt: start, ExpiresAt: expires}, start); err != nil {
				t.Fatal(err)
			}
		}
		for _, id := range []string{"a", "b", "c"} {
			create(id, "tok-"+id, start.Add(time.Hour))
		}
		for r := range 5 {
			id := "r" + strconv.Itoa(r)
			create(id, "rt-"+id, start.Add(time.Hour))
			k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: id}
			if r < 3 {
				if _, err := s.AttachQueue(ctx, k, "hub-1", start, sessionstore.Touch{}, start); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.GetSession(ctx, k, f.now)
			if err != nil {
				t.Fatal(err)
			}
			f.seen[id] = sessionstore.SeenOf(got)
		}
		create("old", "rt-old", start.Add(time.Minute))
	}
	return f
}

// run runs batch in both stores, each its own copy, and fails the test
// unless every member came to the same in both; it returns the set store's
// copy.
func (f *setFixture) run(t *testing.T, batch []*appendReq) []*appendReq {
	t.Helper()
	copies := [2][]*appendReq{}
	for i := range copies {
		for _, r := range batch {
			c := *r
			copies[i] = append(copies[i], &c)
		}
	}
	f.set.runBatch(0, copies[0])
	f.each.runBatch(0, copies[1])
	for i := range batch {
		a, b := copies[0][i].out, copies[1][i].out
		if a.dup && b.dup && (a.sig.Payload == nil) != (b.sig.Payload == nil) {
			// A duplicate of a signal acknowledged is answered without
			// its payload: by an ack that ran before it in one store,
			// after it in the other (an ack of another session, or one
			// that ran before the appends the statement left).
			a.sig.Payload, b.sig.Payload = nil, nil
		}
		if fmt.Sprint(a.err) != fmt.Sprint(b.err) || a.dup != b.dup || a.acked != b.acked || !reflect.DeepEqual(a.sig, b.sig) {
			var all string
			for j, r := range batch {
				all += fmt.Sprintf("\n  %d: %s: %v/%v %d/%d", j, describe(r), copies[0][j].out.err, copies[1][j].out.err, copies[0][j].out.sig.Seq, copies[1][j].out.sig.Seq)
			}
			t.Fatalf("member %d (%s) came to\n  %v (%+v) by one statement,\n  %v (%+v) by a statement each; the batch:%s", i, describe(batch[i]), a.err, a, b.err, b, all)
		}
	}
	return copies[0]
}

func describe(r *appendReq) string {
	if r.ack != nil {
		return fmt.Sprintf("ack of %s up to %d", r.ack.k.SessionID, r.ack.upTo)
	}
	ns := r.ns
	return fmt.Sprintf("append %s->%s key %q token %q limit %d seen %v", ns.FromSession, ns.To.SessionID, ns.IdempotencyKey,
		ns.SenderTokenHash, ns.Limits.PendingPerRecipient, ns.Seen != nil)
}

// sameRows fails the test unless both schemas hold the same signals and
// the same sessions' counters.
func (f *setFixture) sameRows(ctx context.Context, t *testing.T) {
	t.Helper()
	var dumps [2]string
	for i, u := range f.urls {
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		for _, q := range []string{
			`SELECT to_session, seq, id, from_session, kind, payload::text, created_at, idempotency_key, delivery, route_state
				FROM signals ORDER BY to_session, seq`,
			`SELECT session_id, last_seq, acked_seq, pending_bytes FROM sessions ORDER BY session_id`,
		} {
			rows, err := conn.Query(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				vals, err := rows.Values()
				if err != nil {
					t.Fatal(err)
				}
				dumps[i] += fmt.Sprintln(vals...)
			}
			if rows.Err() != nil {
				t.Fatal(rows.Err())
			}
		}
	}
	if dumps[0] != dumps[1] {
		t.Fatalf("the stores differ:\none statement:\n%s\na statement each:\n%s", dumps[0], dumps[1])
	}
}

// TestAppendSetAgreesWithStatementPerAppend: random batches of appends and
// acks, with wrong and missing tokens, idempotency keys fresh, repeated
// across batches and within one, recipients' pending limits, recipients
// gone, expired, or seen otherwise than they are, come to the same
// answers and the same rows whether a batch's appends are stored by one
// statement (what that statement does not store then by a statement each,
// after it) or by a statement each. Acks go no further than the signals
// stored before their batch, as a client's do, and share no batch with
// appends to their session.
func TestAppendSetAgreesWithStatementPerAppend(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := newSetFixture(ctx, t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, seed))
	recipients := []string{"r0", "r1", "r2", "r3", "r4", "r0", "r1", "r2", "r3", "r4", "r0", "r1", "old", "ghost"}
	senders := []string{"a", "b", "c"}
	keys := map[string][]string{} // each sender's idempotency keys so far
	lastSeq := map[string]int64{}
	appends := 0
	for b := range 80 {
		var batch []*appendReq
		for range 1 + rnd.IntN(12) {
			to := recipients[rnd.IntN(len(recipients))]
			k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: to}
			if rnd.IntN(4) == 0 && lastSeq[to] > 0 {
				upTo := lastSeq[to]
				if rnd.IntN(4) == 0 {
					upTo = rnd.Int64N(upTo + 1)
				}
				batch = append(batch, &appendReq{ack: &ackReq{k: k, upTo: upTo, at: f.now}})
				continue
			}
			from := senders[rnd.IntN(len(senders))]
			ns := sessionstore.NewSignal{ID: fmt.Sprintf("sig-%d-%d", b, len(batch)), To: k, FromSession: from, Kind: "k",
				CreatedAt: f.now, IdempotencySince: f.now.Add(-time.Hour), Delivery: marconi.DeliveryPushed, RouteState: marconi.StateAttached}
			if rnd.IntN(8) > 0 {
				ns.Payload = json.RawMessage(`{"n":` + strconv.Itoa(rnd.IntN(1000)) + `}`)
			}
			switch rnd.IntN(20) {
			case 0:
				ns.SenderTokenHash = []byte("tok-wrong")
			case 1, 2:
			default:
				ns.SenderTokenHash = []byte("tok-" + from)
			}
			switch n := rnd.IntN(20); {
			case n < 9:
			case n < 18 || len(keys[from]) == 0:
				key := fmt.Sprintf("key-%d-%d", b, len(batch))
				keys[from] = append(keys[from], key)
				ns.IdempotencyKey = key
			default:
				ns.IdempotencyKey = keys[from][rnd.IntN(len(keys[from]))]
			}
			if rnd.IntN(2) == 0 {
				ns.Limits.PendingPerRecipient = 4 + rnd.Int64N(9)
			}
			if seen := f.seen[to]; seen != nil {
				switch rnd.IntN(20) {
				case 0:
					other := *seen
					other.QueueInstance = "hub-elsewhere"
					ns.Seen = &other
				case 1, 2, 3, 4, 5, 6, 7, 8, 9:
					ns.Seen = seen
				}
			}
			batch = append(batch, &appendReq{ns: ns, now: f.now})
		}
		// An ack that shares a batch with appends to its session may run
		// before those the statement left (sendBatch): as if it had
		// arrived first, as it might have. Here it shares none, so the
		// order is the same both ways. TestAcksInOneBatch has acks and
		// appends of one session in one batch.
		appended := map[string]bool{}
		for _, r := range batch {
			if r.isAppend() {
				appended[r.ns.To.SessionID] = true
			}
		}
		batch = slices.DeleteFunc(batch, func(r *appendReq) bool { return r.ack != nil && appended[r.ack.k.SessionID] })
		if len(batch) == 0 {
			continue
		}
		for _, r := range f.run(t, batch) {
			if r.isAppend() {
				appends++
			}
			if r.isAppend() && r.out.err == nil && !r.out.dup {
				lastSeq[r.ns.To.SessionID] = max(lastSeq[r.ns.To.SessionID], r.out.sig.Seq)
			}
		}
	}
	f.sameRows(ctx, t)
	// Both ways were taken: many appends by the statement, some left.
	if alone := int(testutil.ToFloat64(f.set.metrics.alone)); alone == 0 || alone > appends*3/4 {
		t.Errorf("of %d appends, %d were left by the statement: want some, and at most three quarters", appends, alone)
	}
}

// TestAppendSetStoresWholeGroups: the statement of a batch's appends stores
// each recipient's appends together or not at all, and what it leaves is
// stored or refused by a statement each, as it would have been alone: a
// recipient with room for one more signal takes the first of two, a
// duplicate is answered with its original, a sender with a wrong token is
// refused, all beside the appends to a fourth recipient, stored by the
// batch's statement. What it left is counted in
// marconi_store_appends_alone_total, and each append in
// marconi_store_batch_size once, in the transaction that answered it.
func TestAppendSetStoresWholeGroups(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := newSetFixture(ctx, t)
	s := f.set
	key := func(id string) sessionstore.Key {
		return sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: id}
	}
	send := func(id, to, from string) *appendReq {
		return &appendReq{now: f.now, ns: sessionstore.NewSignal{ID: id, To: key(to), FromSession: from, Kind: "k",
			Payload: json.RawMessage(`{}`), CreatedAt: f.now, SenderTokenHash: []byte("tok-" + from)}}
	}
	first := send("first", "r1", "a")
	first.ns.IdempotencyKey = "once"
	if r := f.run(t, []*appendReq{first})[0]; r.out.err != nil {
		t.Fatal(r.out.err)
	}

	limited := func(id string) *appendReq {
		r := send(id, "r0", "a")
		r.ns.Limits.PendingPerRecipient = 1
		return r
	}
	again := send("again", "r1", "b")
	again.ns.IdempotencyKey = "once"
	again.ns.FromSession, again.ns.SenderTokenHash = "a", []byte("tok-a")
	wrong := send("wrong", "r2", "c")
	wrong.ns.SenderTokenHash = []byte("tok-a")
	batch := func(x, y string) []*appendReq {
		return []*appendReq{limited("l1"), limited("l2"), again, send("after", "r1", "b"), wrong, send(x, "r3", "b"), send(y, "r3", "c")}
	}

	// The statement alone, as sendBatch runs it: only r3's group stored.
	trial := batch("x1", "x2")
	left, err := s.sendBatch(ctx, 0, trial, s.setFrom)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range left {
		ids = append(ids, r.ns.ID)
	}
	if fmt.Sprint(ids) != "[l1 l2 again after wrong]" {
		t.Errorf("the statement left %v, want [l1 l2 again after wrong]", ids)
	}
	for _, r := range trial {
		if r.ns.To.SessionID == "r3" && (r.out.err != nil || r.out.sig.Seq == 0) {
			t.Errorf("%s: %+v, want stored", r.ns.ID, r.out)
		}
	}
	var pending int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM signals WHERE to_session <> 'r1'`).Scan(&pending); err != nil || pending != 2 {
		t.Fatalf("signals stored by the statement: %d, %v; want r3's 2", pending, err)
	}

	// The whole batch, in both stores (the trial's r3 signals are in the
	// set store only: the other stores them too).
	f.each.runBatch(0, []*appendReq{send("x1", "r3", "b"), send("x2", "r3", "c")})
	before := testutil.ToFloat64(s.metrics.alone)
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.metrics.size)
	var sizes dtoHistogram
	sizes.read(t, reg, "marconi_store_batch_size")
	got := f.run(t, batch("x3", "x4"))
	if n := testutil.ToFloat64(s.metrics.alone) - before; n != 5 {
		t.Errorf("marconi_store_appends_alone_total grew by %v, want 5", n)
	}
	if n := testutil.ToFloat64(f.each.metrics.alone); n != 0 {
		t.Errorf("the store of a statement per append left %v appends, want none", n)
	}
	// The batch's transaction answered r3's two, the next the five left:
	// each append counts once, in the transaction that answered it.
	count, sum := sizes.count, sizes.sum
	sizes.read(t, reg, "marconi_store_batch_size")
	if sizes.count-count != 2 || sizes.sum-sum != 7 {
		t.Errorf("marconi_store_batch_size: %v transactions of %v appends, want 2 of 7", sizes.count-count, sizes.sum-sum)
	}
	var q *sessionstore.QuotaError
	switch {
	case got[0].out.err != nil || got[0].out.sig.Seq != 1:
		t.Errorf("l1: %+v, want stored as 1", got[0].out)
	case !errors.As(got[1].out.err, &q) || q.Quota != marconi.QuotaPendingPerRecipient:
		t.Errorf("l2: %v, want the recipient's pending quota", got[1].out.err)
	case !got[2].out.dup || got[2].out.sig.ID != "first":
		t.Errorf("again: %+v, want a duplicate of first", got[2].out)
	case got[3].out.err != nil || got[3].out.sig.Seq != 2:
		t.Errorf("after: %+v, want stored as r1's 2", got[3].out)
	case !errors.Is(got[4].out.err, sessionstore.ErrTokenMismatch):
		t.Errorf("wrong: %v, want ErrTokenMismatch", got[4].out.err)
	case got[5].out.err != nil || got[5].out.sig.Seq != 3 || got[6].out.sig.Seq != 4:
		t.Errorf("x1, x2: %+v %+v, want stored as r3's 3 and 4", got[5].out, got[6].out)
	}
	f.sameRows(ctx, t)
}

// TestGenericPlanOfAppendSet is TestGenericPlansKeepTheirIndexes for the
// statement of a batch's appends: planned generically while the signals
// table was small (counted by ANALYZE, or never), it still finds each
// append's earlier signal under its idempotency key, and its sender's and
// recipient's rows, through their indexes once the table has grown.
func TestGenericPlanOfAppendSet(t *testing.T) {
	for _, stats := range smallTableStatistics {
		t.Run(stats.name, func(t *testing.T) { genericPlanOfAppendSet(t, stats.sql) })
	}
}

func genericPlanOfAppendSet(t *testing.T, statistics string) {
	u, conn := plannedConn(t)
	ctx := t.Context()
	s, now := oneConnStore(t, u)
	keys := createRecipients(ctx, t, s, 2, now)
	// Two appends from r1 to r0, each with an idempotency key, r1's token
	// and a pending limit, as the hub sends them.
	b := &pgx.Batch{}
	var batch []*appendReq
	for i := range 2 {
		batch = append(batch, &appendReq{now: now, ns: sessionstore.NewSignal{ID: "plan-" + strconv.Itoa(i),
			To: keys[0], FromSession: keys[1].SessionID, Kind: "k",
			Payload: json.RawMessage(`1`), CreatedAt: now, IdempotencyKey: "idem-" + strconv.Itoa(i), IdempotencySince: now.Add(-time.Hour),
			Delivery: marconi.DeliveryPushed, RouteState: marconi.StateAttached, SenderTokenHash: []byte(keys[1].SessionID),
			Limits: sessionstore.Limits{PendingPerRecipient: 1000, PendingBytesPerProject: 1 << 30}}})
	}
	newAppendSet(batch).queue(b, batch)
	args := b.QueuedQueries[1].Arguments // after genericPlanSQL
	tx := rolledBack(t, conn)
	smallTable(t, conn, statistics)
	for range 2 {
		tx(func(txn pgx.Tx) {
			rows, err := txn.Query(ctx, appendSetSQL, args...)
			if err != nil {
				t.Fatal(err)
			}
			rows.Close()
			if rows.Err() != nil {
				t.Fatal(rows.Err())
			}
		})
	}
	grow(t, conn, 21, 20000)
	// The plan kept from when the table was small, then the plan made
	// again on the grown table with the small table's statistics (or none).
	for _, when := range []string{"planned when the table was small", "planned again since, with the same statistics"} {
		var name string
		if err := conn.QueryRow(ctx, `SELECT name FROM pg_prepared_statements WHERE statement = $1`, appendSetSQL).Scan(&name); err != nil {
			t.Fatalf("its prepared statement: %v", err)
		}
		var plan []struct {
			Plan explainNode `json:"Plan"`
		}
		tx(func(txn pgx.Tx) {
			if err := txn.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE `+pgx.Identifier{name}.Sanitize()+
				`(`+arrayLiterals(t, args)+`)`).Scan(&plan); err != nil {
				t.Fatalf("explain: %v", err)
			}
		})
		root := plan[0].Plan
		if root.has("Seq Scan", "signals") {
			t.Errorf("%s, it reads the whole signals table:\n%s", when, root)
		}
		if b := root.maxBlocks(); b > 100 {
			t.Errorf("%s, it touched %d buffers in one node: it walks the table\n%s", when, b, root)
		}
		if !root.has("ModifyTable", "signals") || root.rows("ModifyTable", "sessions") != 1 {
			t.Errorf("%s, the plan stored no group (no insert, or not one update of the recipient's row):\n%s", when, root)
		}
		if _, err := conn.Exec(ctx, `DISCARD PLANS`); err != nil {
			t.Fatal(err)
		}
	}
}

// rows is the rows the first node under n (n included) of nodeType on
// relation returned; -1 when there is none.
func (n explainNode) rows(nodeType, relation string) float64 {
	if n.NodeType == nodeType && n.Relation == relation {
		return n.Rows
	}
	for _, c := range n.Plans {
		if r := c.rows(nodeType, relation); r >= 0 {
			return r
		}
	}
	return -1
}

// arrayLiterals are args, arrays and scalars, as SQL literals, for
// EXECUTE: each array as an array literal the prepared statement's
// parameter type reads.
func arrayLiterals(t *testing.T, args []any) string {
	t.Helper()
	quote := func(s string) string { return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"` }
	stamp := func(v time.Time) string { return quote(v.Format(time.RFC3339Nano)) }
	out := make([]string, len(args))
	for i, a := range args {
		var elems []string
		switch v := a.(type) {
		case []int32:
			for _, e := range v {
				elems = append(elems, strconv.Itoa(int(e)))
			}
		case []int64:
			for _, e := range v {
				elems = append(elems, strconv.FormatInt(e, 10))
			}
		case []string:
			for _, e := range v {
				elems = append(elems, quote(e))
			}
		case []*string:
			for _, e := range v {
				if e == nil {
					elems = append(elems, "NULL")
				} else {
					elems = append(elems, quote(*e))
				}
			}
		case []time.Time:
			for _, e := range v {
				elems = append(elems, stamp(e))
			}
		case []*time.Time:
			for _, e := range v {
				if e == nil {
					elems = append(elems, "NULL")
				} else {
					elems = append(elems, stamp(*e))
				}
			}
		case [][]byte:
			for _, e := range v {
				if e == nil {
					elems = append(elems, "NULL")
				} else {
					elems = append(elems, quote(`\x`+hex.EncodeToString(e)))
				}
			}
		default:
			t.Fatalf("arrayLiterals: no literal form for %T", a)
		}
		out[i] = "'{" + strings.ReplaceAll(strings.Join(elems, ","), "'", "''") + "}'"
	}
	return strings.Join(out, ", ")
}

// TestConformanceOneStatementForEveryAppend runs the store's suite with
// every append, a batch's only one too, stored by the statement of its
// batch's appends (appendSetSQL), and what it leaves by appendSQL. (The
// suite's prunes run in batches of 4, as TestConformance's do.)
func TestConformanceOneStatementForEveryAppend(t *testing.T) {
	pgtest.DatabaseURL(t)
	storetest.Run(t, func(t *testing.T) sessionstore.Store {
		s, err := Open(context.Background(), pgtest.Schema(t), WithMaxConns(4), WithPruneBatch(4))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		s.setFrom = 1
		return s
	})
}

// TestAppendSetRunsOnItsGenericPlan: a connection whose first batches are
// of two appends (where a plan for the arguments looks cheaper than the
// generic plan) runs the statement of a batch's appends on its generic
// plan from the first batch on, never planning it again, and the batch's
// later statements as Postgres chooses.
func TestAppendSetRunsOnItsGenericPlan(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, now := oneConnStore(t, pgtest.Schema(t))
	keys := createRecipients(ctx, t, s, 2, now)
	for b := range 8 {
		batch := []*appendReq{{ns: sized(keys[0], 10, now), now: now}, {ns: sized(keys[1], 10, now), now: now}}
		for i, r := range batch {
			r.ns.IdempotencyKey = fmt.Sprint("key-", b, "-", i)
		}
		if b < 3 { // an ack after the appends, run after the statement
			batch = append(batch, &appendReq{ack: &ackReq{k: keys[0], upTo: int64(b), at: now}})
		}
		s.runBatch(0, batch)
		for _, r := range batch[:2] {
			if r.out.err != nil || r.out.sig.Seq != int64(b+1) {
				t.Fatalf("batch %d: %+v, want stored as %d", b, r.out, b+1)
			}
		}
	}
	plans := func(sql string) (generic, custom int64) {
		t.Helper()
		if err := s.pool.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`,
			sql).Scan(&generic, &custom); err != nil {
			t.Fatal(err)
		}
		return generic, custom
	}
	if generic, custom := plans(appendSetSQL); generic != 8 || custom != 0 {
		t.Errorf("the statement ran on %d generic and %d custom plans, want 8 and 0", generic, custom)
	}
	// The batch's other statements are planned as Postgres chooses: the
	// first five runs for their arguments.
	if generic, custom := plans(ackSQL); generic != 0 || custom != 3 {
		t.Errorf("the ack after the statement ran on %d generic and %d custom plans, want 0 and 3", generic, custom)
	}
}

// oneConnStore is a store on u with one connection, so that a test sees
// the plans that connection keeps, and group commit off (the test runs its
// batches), and the time now.
func oneConnStore(t *testing.T, u string) (*Store, time.Time) {
	t.Helper()
	s, err := Open(t.Context(), u, WithGroupCommit(false), WithMaxConns(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, time.Now().UTC().Truncate(time.Microsecond)
}

// createRecipients creates the live sessions r0 to r(n-1) of tenant t and
// project p, each holding its name as its token hash.
func createRecipients(ctx context.Context, t *testing.T, s *Store, n int, now time.Time) []sessionstore.Key {
	t.Helper()
	var keys []sessionstore.Key
	for i := range n {
		k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "r" + strconv.Itoa(i)}
		if _, err := s.CreateSession(ctx, sessionstore.Session{Key: k, TokenHash: []byte(k.SessionID),
			RegisteredAt: now, ExpiresAt: now.Add(time.Hour)}, now); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	return keys
}
