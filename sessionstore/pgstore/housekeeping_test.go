package pgstore_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
)

// The warning follows the server's own autovacuum setting: CI's Postgres
// runs without it (so the warning must be there), a default one with it.
func TestAutovacuumWarningFollowsTheServer(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, pgtest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var on string
	if err := conn.QueryRow(ctx, `SELECT current_setting('autovacuum')`).Scan(&on); err != nil {
		t.Fatal(err)
	}
	got := s.AutovacuumWarning(ctx)
	switch on {
	case "on":
		if got != "" {
			t.Errorf("autovacuum on, warning %q, want none", got)
		}
	default:
		if !strings.Contains(got, "autovacuum is "+on) || !strings.Contains(got, "Postgres housekeeping") {
			t.Errorf("autovacuum %s, warning %q, want it named with where the docs explain it", on, got)
		}
	}
	s.Close()
	if got := s.AutovacuumWarning(ctx); got != "" {
		t.Errorf("a closed store warned %q, want nothing (it cannot tell)", got)
	}
}
