package pgcluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgcluster"
)

// TestSwitchoverKeepsCommittedRows: a row committed on the primary (with
// the standby synchronous) is on the promoted standby after the primary
// crashes; the multi-host URL reaches whichever node takes writes; after the
// old primary is rebuilt as the standby the cluster is synchronous again and
// a second switchover brings the writes back to the first node.
func TestSwitchoverKeepsCommittedRows(t *testing.T) {
	c := pgcluster.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first := c.Primary()
	exec(t, ctx, c.URL(), "CREATE TABLE ledger (n int)", "INSERT INTO ledger VALUES (1)")

	c.Switchover()
	if c.Primary() == first || c.Standby() != first {
		t.Fatalf("after a switchover the primary is %s and the standby %v; want the roles swapped", c.Primary().Name, c.Standby())
	}
	exec(t, ctx, c.URL(), "INSERT INTO ledger VALUES (2)")
	c.Switchover()
	if c.Primary() != first {
		t.Fatalf("after two switchovers the primary is %s, want %s", c.Primary().Name, first.Name)
	}
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n, inRecovery = 0, true
	if err := conn.QueryRow(ctx, "SELECT sum(n), pg_is_in_recovery() FROM ledger").Scan(&n, &inRecovery); err != nil {
		t.Fatal(err)
	}
	if n != 3 || inRecovery {
		t.Fatalf("the multi-host URL reached a server with sum %d, in recovery %v; want 3 on the primary", n, inRecovery)
	}
}

func exec(t *testing.T, ctx context.Context, url string, stmts ...string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}
