package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
	"github.com/marconihub/marconi/sessionstore/storetest"
)

// conformancePruneBatch is the prune batch of the conformance stores: small,
// so that the suite's prunes (a few dozen rows) each run many batches.
const conformancePruneBatch = 4

// newStore opens a Store on a fresh, migrated schema of its own.
func newStore(t *testing.T, opts ...pgstore.Option) *pgstore.Store {
	t.Helper()
	u := pgtest.Schema(t)
	opts = append([]pgstore.Option{pgstore.WithMaxConns(4), pgstore.WithPruneBatch(conformancePruneBatch)}, opts...)
	s, err := pgstore.Open(context.Background(), u, opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	pgtest.DatabaseURL(t) // skip once, not once per subtest
	storetest.Run(t, func(t *testing.T) sessionstore.Store { return newStore(t) })
}

// TestConformanceStatementPerAppend runs the suite on stores that store
// each append by a statement of its own (WithStatementPerAppend), the way
// back from the statement of a batch's appends.
func TestConformanceStatementPerAppend(t *testing.T) {
	pgtest.DatabaseURL(t)
	storetest.Run(t, func(t *testing.T) sessionstore.Store {
		return newStore(t, pgstore.WithStatementPerAppend(true))
	})
}

// TestConformanceBatchesInFlight runs the suite on stores with three group
// commits in flight (MARCONI_STORE_BATCHES_IN_FLIGHT=3).
func TestConformanceBatchesInFlight(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (the whole suite a second time): skipped by -short")
	}
	pgtest.DatabaseURL(t)
	storetest.Run(t, func(t *testing.T) sessionstore.Store {
		return newStore(t, pgstore.WithBatchesInFlight(3), pgstore.WithMaxConns(5))
	})
}

func TestOpenFailsOnlyOnAMalformedURL(t *testing.T) {
	if _, err := pgstore.Open(context.Background(), "postgres://%zz"); err == nil {
		t.Fatal("Open(malformed URL) succeeded")
	}
	// Nothing listens on port 1: Open succeeds, calls fail closed.
	s, err := pgstore.Open(context.Background(), "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable")
	if err != nil {
		t.Fatalf("Open with Postgres down: %v", err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := s.Ping(ctx); !errors.Is(err, sessionstore.ErrUnavailable) {
		t.Fatalf("Ping with Postgres down: err = %v, want ErrUnavailable", err)
	}
	if _, err := s.GetSession(ctx, sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "s"}, time.Now()); !errors.Is(err, sessionstore.ErrUnavailable) {
		t.Fatalf("GetSession with Postgres down: err = %v, want ErrUnavailable", err)
	}
}

// During a rolling upgrade an instance of the release before migration 0014
// heartbeats with the statement it always ran, which names no bus key
// version: its row reads as unknown (0).
func TestHeartbeatOfAnOlderReleaseHasNoBusKeyVersion(t *testing.T) {
	t.Parallel()
	u := pgtest.Schema(t)
	ctx := context.Background()
	s, err := pgstore.Open(ctx, u, pgstore.WithMaxConns(2))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	// The heartbeat of the release before 0014, as it ran.
	now := time.Now()
	if _, err := conn.Exec(ctx, `INSERT INTO instances (id, url, draining, started_at, last_heartbeat_at)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (id) DO UPDATE SET url = EXCLUDED.url, draining = EXCLUDED.draining,
			started_at = EXCLUDED.started_at, last_heartbeat_at = EXCLUDED.last_heartbeat_at`,
		"old", "http://old", false, now, now); err != nil {
		t.Fatal(err)
	}
	if err := s.HeartbeatInstance(ctx, sessionstore.Instance{ID: "new", URL: "http://new", StartedAt: now, LastHeartbeatAt: now, BusKeyVersion: 3}); err != nil {
		t.Fatal(err)
	}
	list, err := s.ListInstances(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, in := range list {
		got[in.ID] = in.BusKeyVersion
	}
	if len(got) != 2 || got["old"] != 0 || got["new"] != 3 {
		t.Fatalf("bus key versions %v, want old unknown (0) and new 3", got)
	}
}
