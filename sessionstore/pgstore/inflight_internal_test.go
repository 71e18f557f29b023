package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
)

// Several batches in flight, on the real Postgres: the pending-bytes quota
// stays exact, a recipient's appends keep their order, and batches of two
// instances crossing the same rows never deadlock.

// inFlightStores opens n stores (instances) on u, each with inFlight
// batches in flight of at most maxBatch, and creates sessions s0..s<count-1>
// of project t/p; the stores close when the test ends. opts apply to
// every store.
func inFlightStores(ctx context.Context, t *testing.T, u string, n, inFlight, maxBatch, count int, opts ...Option) ([]*Store, []sessionstore.Key, time.Time) {
	t.Helper()
	var stores []*Store
	for range n {
		s, err := Open(ctx, u, append([]Option{WithBatchesInFlight(inFlight), WithMaxBatch(maxBatch), WithMaxConns(int32(inFlight + 2))}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	var keys []sessionstore.Key
	for i := range count {
		k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "s" + strconv.Itoa(i)}
		if _, err := stores[0].CreateSession(ctx, sessionstore.Session{Key: k, TokenHash: []byte(uuid.NewString()),
			RegisteredAt: now, ExpiresAt: now.Add(time.Hour)}, now); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	return stores, keys, now
}

// sized is a signal to k whose payload is n bytes (a JSON string).
func sized(k sessionstore.Key, n int, now time.Time) sessionstore.NewSignal {
	return sessionstore.NewSignal{ID: uuid.NewString(), To: k, FromSession: "sender", Kind: "k",
		Payload: json.RawMessage(`"` + strings.Repeat("x", n-2) + `"`), CreatedAt: now}
}

// TestProjectQuotaExactWithBatchesInFlight: two stores (instances), three
// batches in flight each, many senders filling one project near its
// pending-bytes limit while others acknowledge: no snapshot ever shows the
// project's pending bytes past the limit, every refusal is the quota's,
// and the project's counter, less its leases, ends equal to what its
// sessions hold. With quota leases off, of three appends (each lane then
// leases and reclaims often), and of the default size.
func TestProjectQuotaExactWithBatchesInFlight(t *testing.T) {
	for _, lease := range []int64{0, 3 * 100, DefaultQuotaLeaseBytes} {
		t.Run(fmt.Sprint("lease=", lease), func(t *testing.T) {
			t.Parallel()
			projectQuotaExactWithBatchesInFlight(t, lease)
		})
	}
}

func projectQuotaExactWithBatchesInFlight(t *testing.T, lease int64) {
	u := pgtest.Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const limit, size, senders, sends = 2000, 100, 12, 40
	stores, keys, now := inFlightStores(ctx, t, u, 2, 3, 8, 8, WithQuotaLease(lease))

	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	pendingBytes := func() int64 {
		var n int64
		if err := conn.QueryRow(ctx, `SELECT coalesce(sum(octet_length(g.payload::text)), 0) FROM signals g
			JOIN sessions e ON e.tenant_id = g.tenant_id AND e.project_id = g.project_id AND e.session_id = g.to_session
			WHERE g.seq > e.acked_seq`).Scan(&n); err != nil {
			t.Error(err)
		}
		return n
	}

	var (
		wg                sync.WaitGroup
		mu                sync.Mutex
		stored, refused   int
		unexpected        []error
		done              = make(chan struct{})
		most              int64
		monitorWasWatched = make(chan int)
	)
	go func() { // owned: ends with done, waited for on monitorWasWatched
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		samples := 0
		for {
			select {
			case <-done:
				monitorWasWatched <- samples
				return
			case <-tick.C:
			}
			most = max(most, pendingBytes())
			samples++
		}
	}()
	for i := range senders {
		s := stores[i%len(stores)]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 18))
			for j := range sends {
				k := keys[rng.IntN(len(keys))]
				if j%5 == 4 { // free room now and then
					if _, err := s.DropPending(ctx, k, now); err != nil {
						mu.Lock()
						unexpected = append(unexpected, err)
						mu.Unlock()
					}
					continue
				}
				ns := sized(k, size, now)
				ns.Limits.PendingBytesPerProject = limit
				_, _, err := s.AppendSignal(ctx, ns, now)
				var q *sessionstore.QuotaError
				mu.Lock()
				switch {
				case err == nil:
					stored++
				case errors.As(err, &q) && q.Quota == marconi.QuotaPendingBytesPerProject && q.Limit == limit:
					refused++
				default:
					unexpected = append(unexpected, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(done)
	samples := <-monitorWasWatched
	for _, err := range unexpected {
		t.Errorf("a call failed: %v", err)
	}
	if most > limit {
		t.Errorf("the project held %d pending bytes at one point, over its limit of %d", most, limit)
	}
	if refused == 0 || stored < limit/size {
		t.Errorf("%d appends stored, %d refused by the quota: want the project filled and refusing", stored, refused)
	}
	var counter, sessions int64
	if err := conn.QueryRow(ctx, `SELECT
		(SELECT pending_bytes FROM project_usage WHERE tenant_id = 't' AND project_id = 'p')
		  + (SELECT coalesce(sum(delta), 0) FROM project_usage_deltas WHERE tenant_id = 't' AND project_id = 'p')
		  - (SELECT coalesce(sum(bytes), 0) FROM project_leases WHERE tenant_id = 't' AND project_id = 'p'),
		(SELECT sum(pending_bytes) FROM sessions WHERE tenant_id = 't' AND project_id = 'p')`).Scan(&counter, &sessions); err != nil {
		t.Fatal(err)
	}
	if real := pendingBytes(); counter != real || sessions != real {
		t.Errorf("pending bytes: project counter %d, sessions %d, signals %d; want all equal", counter, sessions, real)
	}
	t.Logf("%d stored, %d refused; at most %d pending bytes over %d samples", stored, refused, most, samples)
}

// TestRecipientOrderWithBatchesInFlight: with three batches in flight of
// up to four appends each, appends to one recipient queued one after the other
// take their seqs in that order. Three batches are held first (appends to
// rows the test locks), so that the rest queue in a known order and are
// then free to run three at a time.
func TestRecipientOrderWithBatchesInFlight(t *testing.T) {
	u := pgtest.Schema(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const inFlight, perRecipient = 3, 12
	stores, keys, now := inFlightStores(ctx, t, u, 1, inFlight, 4, inFlight+2)
	s := stores[0]
	held, targets := keys[:inFlight], keys[inFlight:]

	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // committed below
	if _, err := tx.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = ANY($1) FOR UPDATE`,
		[]string{held[0].SessionID, held[1].SessionID, held[2].SessionID}); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	appendTo := func(k sessionstore.Key, payload string) {
		ns := sized(k, 2, now)
		ns.Payload = json.RawMessage(payload)
		wg.Go(func() {
			if _, _, err := s.AppendSignal(ctx, ns, now); err != nil {
				t.Error(err)
			}
		})
	}
	for _, k := range held {
		appendTo(k, `"held"`)
	}
	waitCommitter(t, s.group, "three batches in flight", func() bool { return s.group.running == inFlight })
	for i := range perRecipient {
		for j, k := range targets {
			appendTo(k, strconv.Itoa(i))
			waitQueued(t, s.group, i*len(targets)+j+1)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for _, k := range targets {
		rows, err := conn.Query(ctx, `SELECT seq, payload::text FROM signals
			WHERE tenant_id = $1 AND project_id = $2 AND to_session = $3 ORDER BY seq`, k.TenantID, k.ProjectID, k.SessionID)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		var seq int64
		var payload string
		if _, err := pgx.ForEachRow(rows, []any{&seq, &payload}, func() error {
			got = append(got, payload)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		want := make([]string, perRecipient)
		for i := range want {
			want[i] = strconv.Itoa(i)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s's signals in seq order: %v, want %v (the order they were queued)", k.SessionID, got, want)
		}
	}
}

// TestNoDeadlockWithBatchesInFlight: two stores (instances), three batches
// in flight each, senders appending to, acknowledging and touching the same
// few sessions in every order, so that batches cross one another's rows
// (an append to A and a touch of B beside an append to B and a touch of A):
// no call fails, and Postgres never aborts a batch as a deadlock.
func TestNoDeadlockWithBatchesInFlight(t *testing.T) {
	u := pgtest.Schema(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const workers, ops = 16, 60
	stores, keys, now := inFlightStores(ctx, t, u, 2, 3, 8, 6)
	var wg sync.WaitGroup
	for i := range workers {
		s := stores[i%len(stores)]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 40))
			for range ops {
				k := keys[rng.IntN(len(keys))]
				var err error
				switch rng.IntN(4) {
				case 0, 1:
					_, _, err = s.AppendSignal(ctx, sized(k, 8, now), now)
				case 2:
					_, err = s.DropPending(ctx, k, now)
				case 3:
					err = s.TouchSession(ctx, k, sessionstore.Touch{SeenAt: time.Now().UTC()}, now)
				}
				if err != nil {
					t.Errorf("%s: %v", k.SessionID, err)
				}
			}
		})
	}
	wg.Wait()
	for i, s := range stores {
		if n := testutil.ToFloat64(s.metrics.reruns.WithLabelValues(rerunDeadlock)); n > 0 {
			t.Errorf("store %d: Postgres aborted %v batches as deadlocks", i, n)
		}
	}
}
