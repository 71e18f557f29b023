package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// TestReachableWhileThePoolIsHeld: with every pooled connection held by a
// call waiting on a lock (a store slow, not gone), Ping waits for a
// connection and runs out of time, but Reachable answers on a connection of
// its own. A closed store is unreachable.
func TestReachableWhileThePoolIsHeld(t *testing.T) {
	u := pgtest.Schema(t)
	st, err := pgstore.Open(context.Background(), u, pgstore.WithMaxConns(1))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	if err := st.Reachable(ctx); err != nil {
		t.Fatalf("Reachable with the pool free: %v", err)
	}

	lock := pgtest.LockTable(t, u, "sessions")
	held := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_, err := st.GetSession(cctx, sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "s"}, time.Now())
		held <- err
	}()
	lock.WaitForWaiter(t)
	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = st.Ping(pctx)
	cancel()
	if !errors.Is(err, sessionstore.ErrUnavailable) {
		t.Fatalf("Ping with the pool held: %v, want it out of time (it waits for the pool)", err)
	}
	if err := st.Reachable(ctx); err != nil {
		t.Fatalf("Reachable with the pool held: %v, want nil (Postgres answers)", err)
	}
	lock.Release(t)
	if err := <-held; !errors.Is(err, sessionstore.ErrNotFound) {
		t.Fatalf("the held call: %v, want not found once the lock is gone", err)
	}
	st.Close()
	if err := st.Reachable(ctx); !errors.Is(err, sessionstore.ErrUnavailable) {
		t.Fatalf("Reachable on a closed store: %v, want ErrUnavailable", err)
	}
}
