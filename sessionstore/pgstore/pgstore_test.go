package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

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
