package pgstore

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/netcount"
	"github.com/marconihub/marconi/internal/pgtest"
)

// Postgres plans a prepared statement generically from its sixth run on,
// from the statistics of that moment, and keeps the plan for the
// connection's life. Statistics taken while the signals table held a few
// rows of one session say a session's rows are most of the table, so the
// generic ack scanned the whole table, twice, for every ack (seen in a
// durable run: a quarter of the sends/s). With no statistics at all (no
// ANALYZE yet) every index looks alike, and the idempotent append's lookup
// took the primary key as often as its own index, walking every signal of
// the project (a third of the sends/s). The store's connections plan each
// statement on signals on an index that finds its rows, whatever the
// statistics said: neither a sequential scan nor the walk of an index.
func TestGenericPlansKeepTheirIndexes(t *testing.T) {
	for _, stats := range smallTableStatistics {
		t.Run(stats.name, func(t *testing.T) { genericPlansKeepTheirIndexes(t, stats.sql) })
	}
}

// smallTableStatistics are the ways a small signals table is counted
// before the plans under test are made: by ANALYZE (autovacuum's first,
// or anyone's), or never.
var smallTableStatistics = []struct{ name, sql string }{
	{"analyzed while small", `VACUUM ANALYZE signals`},
	{"never analyzed", `VACUUM signals`},
}

func genericPlansKeepTheirIndexes(t *testing.T, statistics string) {
	_, conn := plannedConn(t)
	ctx := t.Context()
	now := time.Now()
	statements := []struct {
		name, sql string
		args      []any
	}{
		{"ack", ackSQL, []any{"t", "p", "r", int64(DefaultAckedPayloadBytes)}},
		{"idempotent append", appendSQL, []any{"t", "p", "r", "id", "s", "k", `1`, now, "idem-key", "pushed_to_ws", "attached",
			now.Add(-time.Hour), now, int64(1), int64(0), int64(0), nil, nil, "", nil, nil}},
		{"pending", pendingSQL, []any{"t", "p", "r", int64(0), int64(100)}},
		{"prune acknowledged", pruneAckedSQL, []any{now.Add(-time.Hour), int64(100)}},
		{"prune signals of expired sessions", pruneExpiredSignalsSQL, []any{now, int64(100)}},
		{"prune expired sessions", pruneExpiredSessionsSQL, []any{now, int64(100)}},
	}
	tx := rolledBack(t, conn)
	smallTable(t, conn, statistics)
	for _, s := range statements {
		for range 2 {
			tx(func(txn pgx.Tx) {
				rows, err := txn.Query(ctx, s.sql, s.args...)
				if err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				rows.Close()
				if rows.Err() != nil {
					t.Fatalf("%s: %v", s.name, rows.Err())
				}
			})
		}
	}
	// The table grows, as it does under load, with no ANALYZE since: one
	// project's signals, from the sender the append names, under other keys.
	grow(t, conn, 21, 20000)
	// The plans kept from when the table was small, then the plans made
	// again on the grown table, its statistics still the small table's
	// (or none): a connection new since, or plans Postgres dropped.
	for _, when := range []string{"planned when the table was small", "planned again since, with the same statistics"} {
		for _, s := range statements {
			var name string
			if err := conn.QueryRow(ctx, `SELECT name FROM pg_prepared_statements WHERE statement = $1`, s.sql).Scan(&name); err != nil {
				t.Fatalf("%s: its prepared statement: %v", s.name, err)
			}
			var plan []struct {
				Plan explainNode `json:"Plan"`
			}
			tx(func(txn pgx.Tx) {
				if err := txn.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE `+pgx.Identifier{name}.Sanitize()+
					`(`+literals(s.args)+`)`).Scan(&plan); err != nil {
					t.Fatalf("%s: explain: %v", s.name, err)
				}
			})
			root := plan[0].Plan
			if root.has("Seq Scan", "signals") {
				t.Errorf("%s, %s, reads the whole signals table:\n%s", s.name, when, root)
			}
			// Every statement here finds nothing or one row: a node that
			// touched hundreds of buffers walked the 20 000 signals.
			if b := root.maxBlocks(); b > 100 {
				t.Errorf("%s, %s, touched %d buffers in one node: it walks the table\n%s", s.name, when, b, root)
			}
		}
		if _, err := conn.Exec(ctx, `DISCARD PLANS`); err != nil {
			t.Fatal(err)
		}
	}
}

// rolledBack runs f in a transaction of conn that it rolls back: each
// statement f runs is planned and executed, and leaves nothing.
func rolledBack(t *testing.T, conn *pgx.Conn) func(f func(pgx.Tx)) {
	return func(f func(pgx.Tx)) {
		txn, err := conn.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer txn.Rollback(t.Context())
		f(txn)
	}
}

// smallTable is a store's first minutes: a few signals, counted by
// statistics (a VACUUM or ANALYZE, autovacuum's or anyone's, or none);
// conn then plans each prepared statement generically. Which plan
// Postgres keeps past the fifth run depends on costs it compares then;
// the generic plan is the one that can be kept.
func smallTable(t *testing.T, conn *pgx.Conn, statistics string) {
	t.Helper()
	grow(t, conn, 1, 20)
	for _, q := range []string{statistics, `SET plan_cache_mode = force_generic_plan`} {
		if _, err := conn.Exec(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
}

// has says whether a node under n (n included) is nodeType on relation.
func (n explainNode) has(nodeType, relation string) bool {
	if n.NodeType == nodeType && n.Relation == relation {
		return true
	}
	for _, c := range n.Plans {
		if c.has(nodeType, relation) {
			return true
		}
	}
	return false
}

// maxBlocks is the most buffers one node under n (n included) touched.
func (n explainNode) maxBlocks() int64 {
	b := n.blocks()
	for _, c := range n.Plans {
		b = max(b, c.maxBlocks())
	}
	return b
}

// plannedConn is a connection to a fresh schema with the store's planner
// settings, and the schema's URL.
func plannedConn(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	u := pgtest.Schema(t)
	ctx := t.Context()
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if err := afterConnect(cfg.RuntimeParams, newHistory())(ctx, conn); err != nil {
		t.Fatal(err)
	}
	return u, conn
}

// grow stores signals from seq to seq of another recipient (the insert is
// checked by no foreign key: migration 0012), each with an idempotency key
// of 32 characters (a UUID's worth, as clients send them: a longer key
// makes the idempotency index larger than the primary key, which then
// looks cheaper to a planner with no statistics). It leaves the
// connection's cached plans as they were: no setting changes
// (session_replication_role, say, would reset them all, and the plans
// under test would be made again on the grown table).
func grow(t *testing.T, conn *pgx.Conn, from, to int) {
	t.Helper()
	if _, err := conn.Exec(t.Context(), `INSERT INTO signals (tenant_id, project_id, to_session, seq, id, from_session, kind, payload, created_at, idempotency_key)
		SELECT 't', 'p', 'other', g, 'sig-' || g, 's', 'k', '1', now(), md5(g::text) FROM generate_series(`+strconv.Itoa(from)+`, `+strconv.Itoa(to)+`) AS g`); err != nil {
		t.Fatal(err)
	}
}

// literals are args as SQL literals, for EXECUTE (which takes no bind
// parameters inside EXPLAIN).
func literals(args []any) string {
	out := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case nil:
			out[i] = "NULL"
		case string:
			out[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'"
		case int64:
			out[i] = strconv.FormatInt(v, 10)
		case time.Time:
			out[i] = "'" + v.Format(time.RFC3339Nano) + "'"
		default:
			panic("literals: no literal form for " + fmt.Sprintf("%T", a))
		}
	}
	return strings.Join(out, ", ")
}

// A statement with no index to use costs what the planner adds to a
// disabled path, past every JIT threshold: the store's connections do not
// compile it (a one-row listing spent 230 ms so).
func TestDisabledPathsAreNotCompiled(t *testing.T) {
	u, conn := plannedConn(t)
	ctx := t.Context()
	// pg_jit_available is false where jit is off: ask a plain connection.
	plain, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close(ctx)
	var available bool
	if err := plain.QueryRow(ctx, `SELECT pg_jit_available()`).Scan(&available); err != nil {
		t.Fatal(err)
	}
	if !available {
		// CI's Postgres (Debian's, with its LLVM JIT) has it: there the test must run.
		if os.Getenv(pgtest.EnvRequire) == "1" {
			t.Fatalf("this Postgres has no JIT to compile with, and %s=1", pgtest.EnvRequire)
		}
		t.Skip("this Postgres has no JIT to compile with")
	}
	var plan string
	if err := conn.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) SELECT id FROM instances WHERE url = 'nowhere'`).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan, `"Seq Scan"`) {
		t.Fatalf("the listing did not scan, so it tests nothing:\n%s", plan)
	}
	if strings.Contains(plan, `"JIT"`) {
		t.Errorf("a disabled scan was JIT-compiled:\n%s", plan)
	}
}

func TestPlannerSettingsYieldToTheURL(t *testing.T) {
	if got, want := plannerSettings(map[string]string{"enable_seqscan": "on"}), []string{"set_config('jit', 'off', false)"}; !slices.Equal(got, want) {
		t.Errorf("with the URL's enable_seqscan: %q, want %q", got, want)
	}
	if got := plannerSettings(map[string]string{"enable_seqscan": "on", "jit": "on"}); len(got) != 0 {
		t.Errorf("with both set by the URL: %q, want none", got)
	}
}

// The store's own connections carry the settings.
func TestStoreConnectionsCarryPlannerSettings(t *testing.T) {
	u := pgtest.Schema(t)
	ctx := t.Context()
	s, err := Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var seqscan, jit string
	if err := s.pool.QueryRow(ctx, `SELECT current_setting('enable_seqscan'), current_setting('jit')`).Scan(&seqscan, &jit); err != nil {
		t.Fatal(err)
	}
	if seqscan != "off" || jit != "off" {
		t.Errorf("a store connection has enable_seqscan %s and jit %s, want both off", seqscan, jit)
	}
}

// A new connection of the store, once connected, costs one round trip: it
// reads the server's history and takes the planner settings in one
// statement. The client's writes to the server are counted: each round
// trip is one (a message batch flushed, then its answer awaited).
func TestNewConnectionCostsOneRoundTrip(t *testing.T) {
	u := pgtest.Schema(t)
	ctx := t.Context()
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	var writes atomic.Int64
	cfg.DialFunc = netcount.Dial(&writes)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })

	hist := newHistory()
	before := writes.Load()
	if err := afterConnect(cfg.RuntimeParams, hist)(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if n := writes.Load() - before; n != 1 {
		t.Errorf("a new connection made %d round trips, want 1", n)
	}
	if got := hist.load().n; got != 1 {
		t.Errorf("history %d after the connection, want 1", got)
	}
	var seqscan, jit string
	if err := conn.QueryRow(ctx, `SELECT current_setting('enable_seqscan'), current_setting('jit')`).Scan(&seqscan, &jit); err != nil {
		t.Fatal(err)
	}
	if seqscan != "off" || jit != "off" {
		t.Errorf("the connection has enable_seqscan %s and jit %s, want both off", seqscan, jit)
	}
}

// TestSettleKeepsItsIndexAfterSmallBatches: the settle of a batch
// (settleLeasedSQL) finds the batch's signals by id through an index on
// the plans its plpgsql function keeps for the connection's life, made at
// its first batches on a fresh database's small table. Until migration 0017
// the plan Postgres took for it after its first five runs, made then,
// walked every signal at every batch (4 437 buffers here at 20 000
// signals; seen in a fleet run as a stall at 0.6x its sends/s).
func TestSettleKeepsItsIndexAfterSmallBatches(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, now := oneConnStore(t, pgtest.Schema(t))
	if _, err := s.pool.Exec(ctx, `VACUUM signals`); err != nil { // a fresh database's, empty
		t.Fatal(err)
	}
	keys := createRecipients(ctx, t, s, 4, now)
	batch := func() []string {
		var reqs []*appendReq
		for _, k := range keys {
			reqs = append(reqs, &appendReq{ns: sized(k, 10, now), now: now})
		}
		s.runBatch(0, reqs)
		var ids []string
		for _, r := range reqs {
			if r.out.err != nil {
				t.Fatal(r.out.err)
			}
			ids = append(ids, r.ns.ID)
		}
		return ids
	}
	for range 8 {
		batch()
	}
	conn, err := s.pool.Acquire(ctx) // the one connection, and its cached plans
	if err != nil {
		t.Fatal(err)
	}
	grow(t, conn.Conn(), 1, 20000)
	conn.Release()
	ids := batch()
	conn, err = s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	txn, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Rollback(ctx)
	n := len(ids)
	var plan []struct {
		Plan explainNode `json:"Plan"`
	}
	if err := txn.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+settleLeasedSQL, s.lease.holder(0), s.lease.bytes,
		ids, slices.Repeat([]string{"t"}, n), slices.Repeat([]string{"p"}, n), slices.Repeat([]int64{10}, n), make([]int64, n)).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	// The function's statements count in the buffers of the node that
	// calls it: four lookups by id, and the settle's rows.
	if b := plan[0].Plan.blocks(); b > 100 {
		t.Errorf("the settle, planned at the first batches, touched %d buffers: it walks the signals", b)
	}
}
