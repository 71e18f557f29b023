package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TableLock holds an ACCESS EXCLUSIVE lock on one table of a test database,
// so that every store call touching it waits: a store that is slow, not
// gone.
type TableLock struct {
	conn  *pgx.Conn
	tx    pgx.Tx
	table string
}

// LockTable locks table in the database at url until Release, or the end
// of the test.
func LockTable(t testing.TB, url, table string) *TableLock {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	l := &TableLock{conn: conn, tx: tx, table: table}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // released already, or here
	return l
}

// WaitForWaiter returns once some backend waits on the lock, and fails the
// test when none does within setupTimeout.
func (l *TableLock) WaitForWaiter(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(setupTimeout)
	for {
		var n int
		err := l.conn.QueryRow(context.Background(),
			"SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::regclass", l.table).Scan(&n)
		if err == nil && n >= 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no call waited on the lock of %s within %v: %d waiting, %v", l.table, setupTimeout, n, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Release ends the lock: the calls waiting on it go on.
func (l *TableLock) Release(t testing.TB) {
	t.Helper()
	if err := l.tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
}
