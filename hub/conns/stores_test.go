package conns_test

import (
	"context"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// stores are the stores every test of a store-backed behaviour runs on.
var stores = []string{"memory", "postgres"}

// openStore opens a fresh store of the kind named (one of stores), closed
// when tb ends; Postgres skips (or fails, in CI) without a test database.
func openStore(tb testing.TB, store string) sessionstore.Store {
	tb.Helper()
	if store == "memory" {
		return memstore.New()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := pgstore.Open(ctx, pgtest.Schema(tb))
	if err != nil {
		tb.Fatalf("open pgstore: %v", err)
	}
	tb.Cleanup(func() { st.Close() })
	return st
}
