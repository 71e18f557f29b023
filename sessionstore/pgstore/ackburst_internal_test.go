package pgstore

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi/internal/pgtest"
)

// TestAnAckBurstBesideSendsAllLands: on the real Postgres, a burst of acks
// queued beside appends to the same sessions (the committer held by a
// batch waiting on a row the test locks, so that all of them queue first)
// is spread over several batches, and every ack and every append lands:
// each ack acknowledges exactly what it covers, and each session keeps the
// append queued beside its ack.
func TestAnAckBurstBesideSendsAllLands(t *testing.T) {
	u := pgtest.Schema(t)
	t.Parallel()
	ctx := t.Context()
	const sessions, before = 24, 3
	stores, keys, now := inFlightStores(ctx, t, u, 1, 1, 64, sessions+1, WithAcksPerBatch(2))
	s, blocker, keys := stores[0], keys[sessions], keys[:sessions]
	for _, k := range keys {
		for range before {
			if _, _, err := s.AppendSignal(ctx, sized(k, 10, now), now); err != nil {
				t.Fatal(err)
			}
		}
	}

	lock, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close(context.Background())
	tx, err := lock.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE`, blocker.SessionID); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*sessions+1)
	wg.Go(func() { // runs first, and waits on the lock
		_, _, err := s.AppendSignal(ctx, sized(blocker, 10, now), now)
		errs <- err
	})
	waitCommitter(t, s.group, "the blocker's batch running", func() bool { return s.group.running == 1 && len(s.group.queue) == 0 })
	acked := make([]int, sessions)
	for i, k := range keys {
		wg.Go(func() {
			n, err := s.AckSignals(ctx, k, before, now)
			acked[i] = n
			errs <- err
		})
		wg.Go(func() {
			_, _, err := s.AppendSignal(ctx, sized(k, 10, now), now)
			errs <- err
		})
	}
	waitQueued(t, s.group, 2*sessions)
	batchesBefore := batchCount(t, s)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i, k := range keys {
		if acked[i] != before {
			t.Errorf("%s: the ack acknowledged %d signals, want %d", k.SessionID, acked[i], before)
		}
		if n, err := s.CountPending(ctx, k); err != nil || n != 1 {
			t.Errorf("%s: %d pending (%v), want the one append queued beside the ack", k.SessionID, n, err)
		}
	}
	// The blocker's batch, then the appends with two acks, then the 22
	// acks left, at once: nothing else waits for them.
	if batches := batchCount(t, s) - batchesBefore; batches != 3 {
		t.Errorf("the blocker's batch and %d acks queued beside %d appends went in %v batches, want 3", sessions, sessions, batches)
	}
}

// batchCount is how many batches s has committed
// (marconi_store_batch_size's count).
func batchCount(t *testing.T, s *Store) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(s.metrics.size); err != nil {
		t.Fatal(err)
	}
	var m dtoHistogram
	m.read(t, reg, "marconi_store_batch_size")
	return m.count
}
