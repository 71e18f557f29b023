package migrations_test

import (
	"context"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/migrations"
)

// latestOnDisk is the highest NNNN of the *.up.sql files beside this test.
func latestOnDisk(t *testing.T) uint {
	t.Helper()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var latest uint
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".up.sql") {
			continue
		}
		n, err := strconv.ParseUint(name[:strings.IndexByte(name, '_')], 10, 32)
		if err != nil {
			t.Fatalf("migration %s: %v", name, err)
		}
		latest = max(latest, uint(n))
	}
	if latest == 0 {
		t.Fatal("no migrations found")
	}
	return latest
}

func tablesIn(t *testing.T, ctx context.Context, conn *pgx.Conn) map[string]bool {
	t.Helper()
	rows, err := conn.Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, n := range names {
		got[n] = true
	}
	return got
}

func TestUpDownUp(t *testing.T) {
	t.Parallel()
	u := pgtest.EmptySchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	if v, dirty, err := migrations.Version(u); err != nil || v != 0 || dirty {
		t.Fatalf("Version on an empty schema = %d, %v, %v; want 0, false, nil", v, dirty, err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("Up: %v", err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("second Up (no change) must succeed: %v", err)
	}
	if err := migrations.Down(ctx, u); err != nil {
		t.Fatalf("Down: %v", err)
	}
	if v, dirty, err := migrations.Version(u); err != nil || v != 0 || dirty {
		t.Fatalf("Version after Down = %d, %v, %v; want 0, false, nil", v, dirty, err)
	}

	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, table := range []string{"sessions", "api_keys", "signals", "instances", "fallback_events", "counters"} {
		if tablesIn(t, ctx, conn)[table] {
			t.Errorf("table %s survived Down", table)
		}
	}

	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("Up after Down: %v", err)
	}
	want := latestOnDisk(t)
	if v, dirty, err := migrations.Version(u); err != nil || v != want || dirty {
		t.Fatalf("Version = %d, %v, %v; want %d, false, nil", v, dirty, err, want)
	}

	// Everything, golang-migrate's own table included, is in the test schema.
	tables := tablesIn(t, ctx, conn)
	for _, table := range []string{"sessions", "api_keys", "signals", "instances", "fallback_events", "counters", "schema_migrations"} {
		if !tables[table] {
			t.Errorf("table %s missing from the test schema (have %v)", table, tables)
		}
	}

	// The schema works: a session, a signal for it, and the cascade on
	// delete (a trigger since 0012: TestSignalsCascadeTrigger).
	now := time.Now()
	if _, err := conn.Exec(ctx, `INSERT INTO sessions (tenant_id, project_id, session_id, token_hash, registered_at, expires_at)
		VALUES ('t', 'p', 'bob', '\x01', $1, $2)`, now, now.Add(time.Hour)); err != nil {
		t.Fatalf("insert session: %v", err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO signals (tenant_id, project_id, to_session, seq, id, from_session, kind, payload, created_at)
		VALUES ('t', 'p', 'bob', 1, 'sig-1', 'alice', 'k', '{"a":1}', $1)`, now); err != nil {
		t.Fatalf("insert signal: %v", err)
	}
	// Payloads are json, kept verbatim (0004): not jsonb, which re-encodes
	// them and refuses \u0000.
	const verbatim = `{"b":1, "a":1, "a":"\u0000"}`
	if _, err := conn.Exec(ctx, `INSERT INTO signals (tenant_id, project_id, to_session, seq, id, from_session, kind, payload, created_at)
		VALUES ('t', 'p', 'bob', 2, 'sig-3', 'alice', 'k', $1::text::json, $2)`, verbatim, now); err != nil {
		t.Fatalf("insert signal with a verbatim payload: %v", err)
	}
	var payload string
	if err := conn.QueryRow(ctx, `SELECT payload::text FROM signals WHERE id = 'sig-3'`).Scan(&payload); err != nil || payload != verbatim {
		t.Fatalf("payload read back = %q, %v; want %q", payload, err, verbatim)
	}
	if _, err := conn.Exec(ctx, `DELETE FROM sessions WHERE session_id = 'bob'`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM signals`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("signals after deleting their recipient = %d, %v; want 0 (cascade)", n, err)
	}
}

func TestDriverURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://u@h:5432/db?sslmode=disable", "pgx5://u@h:5432/db?connect_timeout=5&sslmode=disable"},
		{"postgresql://u@h/db?connect_timeout=2", "pgx5://u@h/db?connect_timeout=2"},
		{"postgres://u@h/db?search_path=t_1", "pgx5://u@h/db?connect_timeout=5&search_path=t_1"},
		// pgxpool's settings size the hub's pool; the server refuses them.
		{"postgres://u@h/db?pool_max_conns=4&search_path=t_1&pool_min_conns=1", "pgx5://u@h/db?connect_timeout=5&search_path=t_1"},
	} {
		got, err := migrations.DriverURL(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("DriverURL(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"mysql://h/db", "host=h dbname=db", "://"} {
		if _, err := migrations.DriverURL(bad); err == nil {
			t.Errorf("DriverURL(%q) succeeded; want an error", bad)
		}
	}
}

// TestUpWithPoolSettings: the URL the hub's pool takes (pool_max_conns, as
// pgstore documents) migrates too; before, the server refused the unknown
// runtime parameter and the hub never became ready.
func TestUpWithPoolSettings(t *testing.T) {
	t.Parallel()
	u := pgtest.EmptySchema(t)
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := migrations.Up(ctx, u+sep+"pool_max_conns=2"); err != nil {
		t.Fatalf("Up with pool_max_conns in the URL: %v", err)
	}
	if v, dirty, err := migrations.Version(u); err != nil || v != latestOnDisk(t) || dirty {
		t.Fatalf("Version = %d, %v, %v; want %d, false, nil", v, dirty, err, latestOnDisk(t))
	}
}

// TestUpWithKeywordValueString: the keyword/value form pgx takes (host=…
// dbname=…, pool settings included) migrates as the URL form does, into
// the schema its search_path names.
func TestUpWithKeywordValueString(t *testing.T) {
	t.Parallel()
	u := pgtest.EmptySchema(t)
	kv, err := pgtest.KeywordValue(u)
	if err != nil {
		t.Fatal(err)
	}
	kv += " pool_max_conns=2"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := migrations.Up(ctx, kv); err != nil {
		t.Fatalf("Up(%q): %v", kv, err)
	}
	if v, dirty, err := migrations.Version(kv); err != nil || v != latestOnDisk(t) || dirty {
		t.Fatalf("Version = %d, %v, %v; want %d, false, nil", v, dirty, err, latestOnDisk(t))
	}
	conn, err := pgx.Connect(ctx, u) // the URL form sees the same schema
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if got := tablesIn(t, ctx, conn); !got["signals"] || !got["schema_migrations"] {
		t.Fatalf("tables after Up with the keyword form: %v", got)
	}
	if err := migrations.Up(ctx, "host=127.0.0.1 port=notaport"); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Errorf("Up with a malformed keyword/value string: %v, want it refused as malformed", err)
	}
}

func TestUpUnreachableFailsFast(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Port 1 on loopback refuses at once.
	if err := migrations.Up(ctx, "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable"); err == nil {
		t.Fatal("Up against a closed port succeeded")
	}
}

// TestHotAckIndexes: at 0010 no index of signals holds acked_at or payload
// (an ack is then a HOT update) and signals and sessions keep room in their
// pages; a step down to 0009 puts back the indexes and settings 0010
// replaced, and a step up again takes them away.
func TestHotAckIndexes(t *testing.T) {
	t.Parallel()
	u := pgtest.EmptySchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	indexes := func() map[string]string {
		t.Helper()
		rows, err := conn.Query(ctx, `SELECT indexname, indexdef FROM pg_indexes
			WHERE schemaname = current_schema() AND tablename = 'signals'`)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for rows.Next() {
			var name, def string
			if err := rows.Scan(&name, &def); err != nil {
				t.Fatal(err)
			}
			out[name] = def
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		return out
	}
	options := func(table string) string {
		t.Helper()
		var opts *string
		if err := conn.QueryRow(ctx, `SELECT array_to_string(reloptions, ',') FROM pg_class
			WHERE oid = (quote_ident(current_schema()) || '.' || $1)::regclass`, table).Scan(&opts); err != nil {
			t.Fatal(err)
		}
		if opts == nil {
			return ""
		}
		return *opts
	}
	at10 := func() {
		t.Helper()
		for name, def := range indexes() {
			if strings.Contains(def, "acked_at") || strings.Contains(def, "payload") {
				t.Errorf("at 0010, index %s holds what an ack writes: %s", name, def)
			}
		}
		for _, name := range []string{"signals_pkey", "signals_id_key", "signals_created_at_idx", "signals_sender_key_idx"} {
			if _, ok := indexes()[name]; !ok {
				t.Errorf("at 0010, index %s missing (have %v)", name, indexes())
			}
		}
		if got := options("signals"); got != "fillfactor=55" {
			t.Errorf("signals' options at 0010: %q, want fillfactor=55", got)
		}
		if got := options("sessions"); got != "fillfactor=50" {
			t.Errorf("sessions' options at 0010: %q, want fillfactor=50", got)
		}
	}

	if err := migrations.Steps(ctx, u, 10); err != nil {
		t.Fatalf("up to 0010: %v", err)
	}
	at10()
	if err := migrations.Steps(ctx, u, -1); err != nil {
		t.Fatalf("down to 0009: %v", err)
	}
	got := indexes()
	for _, name := range []string{"signals_unacked_idx", "signals_acked_at_idx", "signals_idempotency_idx"} {
		if _, ok := got[name]; !ok {
			t.Errorf("at 0009 again, index %s missing (have %v)", name, got)
		}
	}
	for _, name := range []string{"signals_created_at_idx", "signals_sender_key_idx"} {
		if _, ok := got[name]; ok {
			t.Errorf("at 0009 again, 0010's index %s is still there", name)
		}
	}
	if a, b := options("signals"), options("sessions"); a != "" || b != "" {
		t.Errorf("at 0009 again, options %q on signals and %q on sessions, want none", a, b)
	}
	// An operator with a large signals table builds the new indexes
	// concurrently first (docs/operations.md, "Migration 0010"); 0010 then
	// keeps them rather than building them again under its lock.
	prebuilt := map[string]uint32{}
	for name, stmt := range map[string]string{
		"signals_created_at_idx": `CREATE INDEX CONCURRENTLY signals_created_at_idx ON signals (created_at)`,
		"signals_sender_key_idx": `CREATE INDEX CONCURRENTLY signals_sender_key_idx ON signals (from_session, idempotency_key, created_at)
			WHERE idempotency_key IS NOT NULL`,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s built beforehand: %v", name, err)
		}
		var oid uint32
		if err := conn.QueryRow(ctx, `SELECT (quote_ident(current_schema()) || '.' || $1)::regclass::oid`, name).Scan(&oid); err != nil {
			t.Fatal(err)
		}
		prebuilt[name] = oid
	}
	if err := migrations.Steps(ctx, u, 1); err != nil {
		t.Fatalf("up to 0010 again, its indexes built beforehand: %v", err)
	}
	at10()
	for name, oid := range prebuilt {
		var now uint32
		if err := conn.QueryRow(ctx, `SELECT (quote_ident(current_schema()) || '.' || $1)::regclass::oid`, name).Scan(&now); err != nil {
			t.Fatal(err)
		}
		if now != oid {
			t.Errorf("0010 built %s again (oid %d, was %d): it must keep one built beforehand", name, now, oid)
		}
	}
}

// TestHotAckMigratesBesideWrites: 0010 runs while the hub writes. An
// append or an ack reads signals (ACCESS SHARE) before it writes it (ROW
// EXCLUSIVE). Had 0010 built its indexes under CREATE INDEX's SHARE lock
// and only then asked for ACCESS EXCLUSIVE (its DROP INDEX), such a write
// caught between the two would wait for the migration while the migration
// waited for it: a deadlock, which Postgres breaks by aborting one of them.
// Taking ACCESS EXCLUSIVE first, the migration waits for the write to end.
func TestHotAckMigratesBesideWrites(t *testing.T) {
	t.Parallel()
	u := pgtest.EmptySchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := migrations.Steps(ctx, u, 9); err != nil {
		t.Fatalf("up to 0009: %v", err)
	}
	writer, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close(context.Background())
	now := time.Now()
	if _, err := writer.Exec(ctx, `INSERT INTO sessions (tenant_id, project_id, session_id, token_hash, registered_at, expires_at)
		VALUES ('t', 'p', 'bob', '\x01', $1, $2)`, now, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// The write's read: its ACCESS SHARE lock on signals is held to its end.
	tx, err := writer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // committed below
	if _, err := tx.Exec(ctx, `SELECT count(*) FROM signals`); err != nil {
		t.Fatal(err)
	}

	migrated := make(chan error, 1)
	go func() { migrated <- migrations.Steps(ctx, u, 1) }()
	defer func() {
		if err := <-migrated; err != nil {
			t.Errorf("0010 beside a write: %v", err)
		}
	}()
	// The migration waits for a lock on signals.
	watcher, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close(context.Background())
	for {
		var waiting bool
		if err := watcher.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE relation = 'signals'::regclass AND NOT granted)`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-migrated:
			migrated <- err
			t.Fatalf("0010 ended (%v) while a transaction held signals", err)
		case <-ctx.Done():
			t.Fatal("0010 never waited for the transaction that holds signals")
		case <-time.After(10 * time.Millisecond):
		}
	}
	// The write itself, then its commit: the migration goes on after it.
	if _, err := tx.Exec(ctx, `INSERT INTO signals (tenant_id, project_id, to_session, seq, id, from_session, kind, payload, created_at)
		VALUES ('t', 'p', 'bob', 1, 'sig-1', 'alice', 'k', '{}', $1)`, now); err != nil {
		t.Fatalf("a write beside the migration: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("a write beside the migration: %v", err)
	}
}

// TestSignalsCascadeTrigger: 0012 replaces the foreign key from signals to
// sessions by a trigger that deletes a session's signals with it. On a
// table with rows: up, a deleted session takes its signals and no other's;
// down, the foreign key is back and cascades as before; up again.
func TestSignalsCascadeTrigger(t *testing.T) {
	t.Parallel()
	u := pgtest.EmptySchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := migrations.Steps(ctx, u, 11); err != nil {
		t.Fatalf("up to 0011: %v", err)
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	now := time.Now()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for _, s := range []string{"bob", "carol", "dave"} {
		exec(`INSERT INTO sessions (tenant_id, project_id, session_id, token_hash, registered_at, expires_at)
			VALUES ('t', 'p', $1, $1::text::bytea, $2, $3)`, s, now, now.Add(time.Hour))
		exec(`INSERT INTO signals (tenant_id, project_id, to_session, seq, id, from_session, kind, payload, created_at)
			SELECT 't', 'p', $1, g, $1 || '-' || g, 'alice', 'k', '{}', $2 FROM generate_series(1, 100) g`, s, now)
	}
	signalsOf := func() map[string]int {
		t.Helper()
		rows, err := conn.Query(ctx, `SELECT to_session, count(*) FROM signals GROUP BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
			s string
			n int
		}, error) {
			var v struct {
				s string
				n int
			}
			return v, r.Scan(&v.s, &v.n)
		})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for _, v := range got {
			out[v.s] = v.n
		}
		return out
	}
	foreignKeys := func() int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_constraint
			WHERE conrelid = (quote_ident(current_schema()) || '.signals')::regclass AND contype = 'f'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if err := migrations.Steps(ctx, u, 1); err != nil {
		t.Fatalf("up to 0012 on a table with rows: %v", err)
	}
	if n := foreignKeys(); n != 0 {
		t.Errorf("at 0012, signals has %d foreign keys, want none", n)
	}
	exec(`DELETE FROM sessions WHERE session_id = 'bob'`)
	if got := signalsOf(); got["bob"] != 0 || got["carol"] != 100 || got["dave"] != 100 {
		t.Errorf("at 0012, signals per session after deleting bob: %v, want carol and dave's 100 each", got)
	}
	if err := migrations.Steps(ctx, u, -1); err != nil {
		t.Fatalf("down to 0011 on a table with rows: %v", err)
	}
	if n := foreignKeys(); n != 1 {
		t.Errorf("at 0011 again, signals has %d foreign keys, want 1", n)
	}
	exec(`DELETE FROM sessions WHERE session_id = 'carol'`)
	if got := signalsOf(); got["carol"] != 0 || got["dave"] != 100 {
		t.Errorf("at 0011 again, signals per session after deleting carol: %v, want dave's 100", got)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO signals (tenant_id, project_id, to_session, seq, id, from_session, kind, created_at)
		VALUES ('t', 'p', 'nobody', 1, 'sig-x', 'alice', 'k', $1)`, now); err == nil {
		t.Error("at 0011 again, a signal for a session that does not exist was accepted")
	}
	if err := migrations.Steps(ctx, u, 1); err != nil {
		t.Fatalf("up to 0012 again: %v", err)
	}
	exec(`DELETE FROM sessions WHERE session_id = 'dave'`)
	if got := signalsOf(); len(got) != 0 {
		t.Errorf("at 0012 again, signals left after deleting every session: %v", got)
	}
}

// TestSignalsCascadeTriggerSeesARacingAppend: a session deleted while an
// append to it is in flight (its row updated and its signal inserted, not
// yet committed) waits for the append, then deletes the signal it stored
// too: the trigger's statement reads the table after the row's lock was
// granted, as ON DELETE CASCADE did, and leaves no signal without its
// session.
func TestSignalsCascadeTriggerSeesARacingAppend(t *testing.T) {
	t.Parallel()
	u := pgtest.EmptySchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatal(err)
	}
	connect := func() *pgx.Conn {
		t.Helper()
		c, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	appender, deleter, watcher := connect(), connect(), connect()
	now := time.Now()
	if _, err := appender.Exec(ctx, `INSERT INTO sessions (tenant_id, project_id, session_id, token_hash, registered_at, expires_at)
		VALUES ('t', 'p', 'bob', '\x01', $1, $2)`, now, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// The append, as appendSQL does it: the row's seq taken under its lock,
	// then the signal with that seq; not committed yet.
	tx, err := appender.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // committed below
	if _, err := tx.Exec(ctx, `WITH bump AS (
			UPDATE sessions SET last_seq = last_seq + 1 WHERE session_id = 'bob' RETURNING last_seq)
		INSERT INTO signals (tenant_id, project_id, to_session, seq, id, from_session, kind, created_at)
		SELECT 't', 'p', 'bob', last_seq, 'sig-1', 'alice', 'k', $1 FROM bump`, now); err != nil {
		t.Fatal(err)
	}
	deleted := make(chan error, 1)
	go func() {
		_, err := deleter.Exec(ctx, `DELETE FROM sessions WHERE session_id = 'bob'`)
		deleted <- err
	}()
	for {
		var waiting bool
		if err := watcher.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted
			AND pid IN (SELECT pid FROM pg_stat_activity WHERE query LIKE 'DELETE FROM sessions%'))`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-deleted:
			t.Fatalf("the delete ended (%v) while an append held the session's row", err)
		case <-ctx.Done():
			t.Fatal("the delete never waited for the append")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-deleted; err != nil {
		t.Fatalf("delete: %v", err)
	}
	var n int
	if err := watcher.QueryRow(ctx, `SELECT count(*) FROM signals`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("signals after their session was deleted beside an append: %d, %v; want 0", n, err)
	}
}

// TestBusKeyRotationMigration: 0013 keeps the key 0008 made as version 1
// with no previous one, and holds a rotation's row; down keeps the current
// key (what every release before reads) and drops the rest; up again.
func TestBusKeyRotationMigration(t *testing.T) {
	t.Parallel()
	u := pgtest.EmptySchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := migrations.Steps(ctx, u, 12); err != nil {
		t.Fatalf("up to 0012: %v", err)
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var made []byte
	if err := conn.QueryRow(ctx, `SELECT key FROM bus_key`).Scan(&made); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Steps(ctx, u, 1); err != nil {
		t.Fatalf("up to 0013: %v", err)
	}
	var key, prev []byte
	var version int64
	if err := conn.QueryRow(ctx, `SELECT key, previous, version FROM bus_key`).Scan(&key, &prev, &version); err != nil {
		t.Fatal(err)
	}
	if string(key) != string(made) || prev != nil || version != 1 {
		t.Fatalf("at 0013: the key kept %v, previous %x, version %d; want the key 0008 made, no previous, version 1",
			string(key) == string(made), prev, version)
	}
	rotated := strings.Repeat("r", 32)
	if _, err := conn.Exec(ctx, `UPDATE bus_key SET previous = key, key = $1::text::bytea, version = version + 1, rotated_at = now()`, rotated); err != nil {
		t.Fatalf("rotate at 0013: %v", err)
	}
	if _, err := conn.Exec(ctx, `UPDATE bus_key SET previous = 'short'::bytea`); err == nil {
		t.Error("at 0013, a previous key of 5 bytes was accepted")
	}
	if err := migrations.Steps(ctx, u, -1); err != nil {
		t.Fatalf("down to 0012: %v", err)
	}
	if err := conn.QueryRow(ctx, `SELECT key FROM bus_key`).Scan(&key); err != nil || string(key) != rotated {
		t.Fatalf("at 0012 again: key %q, %v; want the rotated key kept", key, err)
	}
	var cols int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = 'bus_key'`).Scan(&cols); err != nil || cols != 2 {
		t.Fatalf("at 0012 again, bus_key has %d columns, %v; want id and key", cols, err)
	}
	if err := migrations.Steps(ctx, u, 1); err != nil {
		t.Fatalf("up to 0013 again: %v", err)
	}
	if err := conn.QueryRow(ctx, `SELECT version FROM bus_key`).Scan(&version); err != nil || version != 1 {
		t.Fatalf("at 0013 again: version %d, %v; want 1", version, err)
	}
}

// TestAckByAckedSeqStepBack: from 0016 an ack marks no signal; a step down
// to 0015 marks every signal at or below its session's acked_seq
// acknowledged, its payload dropped, as an ack of a binary from before 0016
// would have (whose retention loop finds acknowledged signals by acked_at),
// and leaves the pending ones as they are.
func TestAckByAckedSeqStepBack(t *testing.T) {
	t.Parallel()
	u := pgtest.EmptySchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := migrations.Steps(ctx, u, 16); err != nil {
		t.Fatalf("up to 0016: %v", err)
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	now := time.Now()
	// bob acknowledged 3 of his 5 signals, carol none of her 2.
	for _, s := range []struct {
		id          string
		last, acked int
	}{{"bob", 5, 3}, {"carol", 2, 0}} {
		if _, err := conn.Exec(ctx, `INSERT INTO sessions (tenant_id, project_id, session_id, token_hash, registered_at, expires_at, last_seq, acked_seq)
			VALUES ('t', 'p', $1, $1::text::bytea, $2, $3, $4, $5)`, s.id, now, now.Add(time.Hour), s.last, s.acked); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `INSERT INTO signals (tenant_id, project_id, to_session, seq, id, from_session, kind, payload, created_at)
			SELECT 't', 'p', $1, g, $1 || '-' || g, 'alice', 'k', '{"n":1}', $2 FROM generate_series(1, $3::int) g`, s.id, now, s.last); err != nil {
			t.Fatal(err)
		}
	}
	if err := migrations.Steps(ctx, u, -1); err != nil {
		t.Fatalf("down to 0015: %v", err)
	}
	rows, err := conn.Query(ctx, `SELECT to_session || '-' || seq, acked_at IS NOT NULL, payload IS NULL FROM signals ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][2]bool{}
	for rows.Next() {
		var id string
		var marked, dropped bool
		if err := rows.Scan(&id, &marked, &dropped); err != nil {
			t.Fatal(err)
		}
		got[id] = [2]bool{marked, dropped}
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	want := map[string][2]bool{
		"bob-1": {true, true}, "bob-2": {true, true}, "bob-3": {true, true}, "bob-4": {}, "bob-5": {},
		"carol-1": {}, "carol-2": {},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("at 0015 again, signals (acked_at set, payload dropped):\n%v\nwant\n%v", got, want)
	}
	if err := migrations.Steps(ctx, u, 1); err != nil {
		t.Fatalf("up to 0016 again: %v", err)
	}
}
