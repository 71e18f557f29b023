package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
)

// The quota leases (migration 0015): a lane's batches take their bytes from
// its lease; a project near its limit reclaims the leases no running batch
// holds, and only those.

// leaseStores opens one store of one lane per holder on u, each leasing
// lease bytes at a time, and creates session s0 of project t/p.
func leaseStores(ctx context.Context, t *testing.T, u string, lease int64, holders ...string) ([]*Store, sessionstore.Key, time.Time) {
	t.Helper()
	var stores []*Store
	for _, h := range holders {
		s, err := Open(ctx, u, WithQuotaLease(lease), WithLeaseHolder(h))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	_, keys, now := inFlightStores(ctx, t, u, 1, 1, 8, 1)
	return stores, keys[0], now
}

// appendUpTo appends signals of size bytes to k through s, under limit,
// until one is refused, and returns how many it stored and the refusal.
func appendUpTo(ctx context.Context, t *testing.T, s *Store, k sessionstore.Key, size int, limit int64, now time.Time) (int, *sessionstore.QuotaError) {
	t.Helper()
	for n := 0; ; n++ {
		ns := sized(k, size, now)
		ns.Limits.PendingBytesPerProject = limit
		_, _, err := s.AppendSignal(ctx, ns, now)
		var q *sessionstore.QuotaError
		if errors.As(err, &q) {
			return n, q
		}
		if err != nil {
			t.Fatalf("append %d: %v", n, err)
		}
		if n > int(limit)/size {
			t.Fatalf("%d appends of %d bytes stored under a limit of %d", n+1, size, limit)
		}
	}
}

// usage is the project t/p's counter, its unfolded deltas and its leases.
func usage(ctx context.Context, t *testing.T, u string) (counter, deltas, leased int64) {
	t.Helper()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, `SELECT
		(SELECT coalesce(sum(pending_bytes), 0) FROM project_usage WHERE tenant_id = 't' AND project_id = 'p'),
		(SELECT coalesce(sum(delta), 0) FROM project_usage_deltas WHERE tenant_id = 't' AND project_id = 'p'),
		(SELECT coalesce(sum(bytes), 0) FROM project_leases WHERE tenant_id = 't' AND project_id = 'p')`).Scan(&counter, &deltas, &leased); err != nil {
		t.Fatal(err)
	}
	return counter, deltas, leased
}

// The lease tests' project: a limit of 1 000 bytes, filled by signals of
// 100, leased 600 bytes at a time.
const leaseLimit, leaseSize = 1000, 100

// aLeasesFirst opens stores a and b, each of one lane, and has a append
// one signal: a then holds a lease of 500 bytes it does not use. It
// returns b, the session the signals go to and the time they are sent at.
func aLeasesFirst(ctx context.Context, t *testing.T, u string) (*Store, sessionstore.Key, time.Time) {
	t.Helper()
	stores, k, now := leaseStores(ctx, t, u, 600, "a", "b")
	ns := sized(k, leaseSize, now)
	ns.Limits.PendingBytesPerProject = leaseLimit
	if _, _, err := stores[0].AppendSignal(ctx, ns, now); err != nil {
		t.Fatal(err)
	}
	if counter, _, leased := usage(ctx, t, u); counter != 600 || leased != 500 {
		t.Fatalf("after a's append: counter %d, leased %d; want a lease of 600 taken, 500 of it left", counter, leased)
	}
	return stores[1], k, now
}

// TestLeasesAreReclaimedNearTheLimit: one instance leases room it does not
// use; another fills the project to exactly its limit, reclaiming that
// lease on the way, and is refused only at the limit.
func TestLeasesAreReclaimedNearTheLimit(t *testing.T) {
	u := pgtest.Schema(t)
	t.Parallel()
	ctx := t.Context()
	b, k, now := aLeasesFirst(ctx, t, u)

	stored, q := appendUpTo(ctx, t, b, k, leaseSize, leaseLimit, now)
	if stored != leaseLimit/leaseSize-1 {
		t.Errorf("b stored %d appends of %d beside a's one under a limit of %d; want %d (a's unused lease reclaimed)",
			stored, leaseSize, leaseLimit, leaseLimit/leaseSize-1)
	}
	if q.Current != leaseLimit || q.Limit != leaseLimit {
		t.Errorf("the refusal says %d of %d bytes pending; want %d of %d", q.Current, q.Limit, leaseLimit, leaseLimit)
	}
	counter, deltas, leased := usage(ctx, t, u)
	if counter+deltas-leased != leaseLimit {
		t.Errorf("counter %d + deltas %d - leases %d = %d, want the %d bytes stored", counter, deltas, leased, counter+deltas-leased, leaseLimit)
	}
}

// TestLeaseOfARunningBatchIsNotReclaimed: a lease whose row a running
// transaction holds (as a batch of its lane holds it until it commits) is
// not reclaimed, and a batch near the limit does not wait for it: it is
// refused at once, below the limit by at most that lease. Once the lease
// is free, the project fills to its limit.
func TestLeaseOfARunningBatchIsNotReclaimed(t *testing.T) {
	u := pgtest.Schema(t)
	t.Parallel()
	ctx := t.Context()
	b, k, now := aLeasesFirst(ctx, t, u)

	running, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close(context.Background())
	tx, err := running.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT 1 FROM project_leases WHERE holder = 'a/0' FOR NO KEY UPDATE`); err != nil {
		t.Fatal(err)
	}

	held, _ := appendUpTo(ctx, t, b, k, leaseSize, leaseLimit, now)
	if want := (leaseLimit - 600) / leaseSize; held != want {
		t.Errorf("with a's lease of 500 held: b stored %d appends, want %d (refused below the limit by that lease)", held, want)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	more, _ := appendUpTo(ctx, t, b, k, leaseSize, leaseLimit, now)
	if 1+held+more != leaseLimit/leaseSize {
		t.Errorf("once a's lease was free: %d more appends, %d in all; want the project full at %d", more, 1+held+more, leaseLimit/leaseSize)
	}
}

// TestLeaseTakenUnderAHigherLimit: a lease taken with no limit is not used
// past a limit that applies later (the setting lowered).
func TestLeaseTakenUnderAHigherLimit(t *testing.T) {
	u := pgtest.Schema(t)
	t.Parallel()
	ctx := t.Context()
	const lower = 300
	stores, k, now := leaseStores(ctx, t, u, 600, "a")
	if _, _, err := stores[0].AppendSignal(ctx, sized(k, leaseSize, now), now); err != nil {
		t.Fatal(err)
	}
	stored, q := appendUpTo(ctx, t, stores[0], k, leaseSize, lower, now)
	if 1+stored != lower/leaseSize || q.Current != lower {
		t.Errorf("under a limit of %d after a lease of 600: %d appends stored in all, refused at %d; want %d, at %d",
			lower, 1+stored, q.Current, lower/leaseSize, lower)
	}
}
