package breaker_test

import (
	"context"
	"testing"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/breaker"
	"github.com/marconihub/marconi/sessionstore/memstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
	"github.com/marconihub/marconi/sessionstore/storetest"
)

// wrap returns inner behind a breaker of its own, so that the conformance
// suite holds for the store the hub actually calls: every answer, error and
// copy passes through the breaker unchanged while the store is reachable.
func wrap(t *testing.T, inner sessionstore.Store) sessionstore.Store {
	t.Helper()
	t.Cleanup(func() { _ = inner.Close() })
	b, err := breaker.New(inner, breaker.Config{}, nil, nil)
	if err != nil {
		t.Fatalf("breaker.New: %v", err)
	}
	return b
}

func TestConformanceOverMemstore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) sessionstore.Store { return wrap(t, memstore.New()) })
}

func TestConformanceOverPgstore(t *testing.T) {
	pgtest.DatabaseURL(t) // skip once, not once per subtest
	storetest.Run(t, func(t *testing.T) sessionstore.Store {
		s, err := pgstore.Open(context.Background(), pgtest.Schema(t), pgstore.WithMaxConns(4))
		if err != nil {
			t.Fatalf("pgstore.Open: %v", err)
		}
		return wrap(t, s)
	})
}
