package pgstore_test

// BenchmarkCountSessions measures the sessions-per-project quota's count
// (docs/benchmarks-history.md, "Counting a project's sessions"). It runs only with
// -bench and MARCONI_TEST_DATABASE_URL.

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// BenchmarkCountSessions counts, with the quota's limit of 20000, one
// project holding 20000 live sessions (full) and one holding 10, among
// 100000 sessions of 8001 projects.
func BenchmarkCountSessions(b *testing.B) {
	url := pgtest.Schema(b)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	_, err = conn.Exec(ctx, `
		INSERT INTO sessions (tenant_id, project_id, session_id, surface, runtime_mode, runtime_mode_source, client_id, token_hash, registered_at, expires_at)
		SELECT 't', 'full', 's' || g, 'codex', 'stateless', 'default', '', decode(md5('f' || g), 'hex'), now(), now() + interval '1 day'
		FROM generate_series(1, 20000) g;
		INSERT INTO sessions (tenant_id, project_id, session_id, surface, runtime_mode, runtime_mode_source, client_id, token_hash, registered_at, expires_at)
		SELECT 't', 'p' || (g % 8000), 's' || g, 'codex', 'stateless', 'default', '', decode(md5('o' || g), 'hex'), now(), now() + interval '1 day'
		FROM generate_series(1, 80000) g;
		ANALYZE sessions;`)
	conn.Close(ctx)
	if err != nil {
		b.Fatal(err)
	}
	st, err := pgstore.Open(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	for _, project := range []string{"full", "p1"} {
		b.Run("project="+project, func(b *testing.B) {
			f := sessionstore.SessionFilter{TenantID: "t", ProjectID: project, Limit: 20000}
			for b.Loop() {
				if _, err := st.CountSessions(ctx, f, time.Now()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
