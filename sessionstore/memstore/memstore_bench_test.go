package memstore_test

// Benchmarks of the memstore's hot lookups, run by hand and recorded in
// docs/benchmarks-history.md ("In-memory store lookups"). They run only with -bench.

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

var benchT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// benchPayload is a ~60-byte payload, as in the hub benchmarks.
var benchPayload = json.RawMessage(`{"text":"hello from the benchmark","n":12345,"ok":true}`)

// benchStore returns a store with the given sessions registered in tenant t,
// project p, live for a day.
func benchStore(b *testing.B, ids ...string) *memstore.Store {
	b.Helper()
	s := memstore.New()
	b.Cleanup(func() { _ = s.Close() })
	for i, id := range ids {
		_, err := s.CreateSession(b.Context(), sessionstore.Session{
			Key:          sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: id},
			RuntimeMode:  "stateless",
			TokenHash:    []byte(fmt.Sprintf("hash-%d", i)),
			RegisteredAt: benchT0,
			ExpiresAt:    benchT0.Add(24 * time.Hour),
		}, benchT0)
		if err != nil {
			b.Fatalf("CreateSession %s: %v", id, err)
		}
	}
	return s
}

func benchKey(id string) sessionstore.Key {
	return sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: id}
}

// benchAppend appends one signal from from to to with idempotency key idem.
func benchAppend(b *testing.B, s *memstore.Store, to sessionstore.Key, from, idem string, n int) (sessionstore.Signal, bool) {
	b.Helper()
	sig, dup, err := s.AppendSignal(b.Context(), sessionstore.NewSignal{
		ID:               fmt.Sprintf("sig-%d", n),
		To:               to,
		FromSession:      from,
		Kind:             "message",
		Payload:          benchPayload,
		CreatedAt:        benchT0,
		IdempotencyKey:   idem,
		IdempotencySince: benchT0.Add(-24 * time.Hour),
		Delivery:         "queued_offline",
		RouteState:       "offline",
	}, benchT0)
	if err != nil {
		b.Fatalf("AppendSignal: %v", err)
	}
	return sig, dup
}

// BenchmarkAppendIdempotent sends with an idempotency key into a project that
// already holds 10 000 signals with keys (10 senders to 10 recipients, half
// of them acknowledged, as the 24 h idempotency window keeps them).
//
// new: every send carries a fresh key, so it is stored (the store grows by
// one signal per op). duplicate: every send repeats a stored key, so it is
// answered with the first signal and nothing is stored.
func BenchmarkAppendIdempotent(b *testing.B) {
	const prior, peers = 10_000, 10
	setup := func(b *testing.B) *memstore.Store {
		ids := make([]string, 0, 2*peers)
		for i := range peers {
			ids = append(ids, fmt.Sprintf("to-%d", i), fmt.Sprintf("from-%d", i))
		}
		s := benchStore(b, ids...)
		for i := range prior {
			benchAppend(b, s, benchKey(fmt.Sprintf("to-%d", i%peers)), fmt.Sprintf("from-%d", i/peers%peers),
				fmt.Sprintf("prior-%d", i), i)
		}
		for i := range peers {
			if _, err := s.AckSignals(b.Context(), benchKey(fmt.Sprintf("to-%d", i)), prior/peers/2, benchT0); err != nil {
				b.Fatal(err)
			}
		}
		return s
	}
	b.Run("new", func(b *testing.B) {
		s := setup(b)
		to := benchKey("to-0")
		i := 0
		for b.Loop() {
			i++
			if _, dup := benchAppend(b, s, to, "from-1", fmt.Sprintf("new-%d", i), prior+i); dup {
				b.Fatal("fresh key answered as a duplicate")
			}
		}
	})
	b.Run("duplicate", func(b *testing.B) {
		s := setup(b)
		to := benchKey("to-0")
		for b.Loop() {
			// prior-10 went from from-1 to to-0 and is acknowledged.
			if _, dup := benchAppend(b, s, to, "from-1", "prior-10", prior); !dup {
				b.Fatal("repeated key stored anew")
			}
		}
	})
}

// pendingSession returns a store whose session "alice" holds 10 000
// acknowledged signals and then 10 pending ones.
func pendingSession(b *testing.B) (*memstore.Store, sessionstore.Key) {
	const acked, pending = 10_000, 10
	s := benchStore(b, "alice")
	k := benchKey("alice")
	for i := range acked + pending {
		benchAppend(b, s, k, "bob", "", i)
		if i == acked-1 {
			if _, err := s.AckSignals(b.Context(), k, acked, benchT0); err != nil {
				b.Fatal(err)
			}
		}
	}
	return s, k
}

// BenchmarkPendingSignals lists the pending signals of a session with 10 000
// acknowledged and 10 pending signals, as a catch-up from 0 (the dashboard,
// a reconnect without a cursor) and from the last delivered seq (the hub's
// sweep of an attached connection).
func BenchmarkPendingSignals(b *testing.B) {
	for _, c := range []struct {
		name  string
		after int64
	}{{"after=0", 0}, {"after=last_acked", 10_000}} {
		b.Run(c.name, func(b *testing.B) {
			s, k := pendingSession(b)
			for b.Loop() {
				sigs, err := s.PendingSignals(b.Context(), k, c.after, 256)
				if err != nil || len(sigs) != 10 {
					b.Fatalf("PendingSignals: %d signals, %v; want 10", len(sigs), err)
				}
			}
		})
	}
}

// BenchmarkCountPending counts the pending signals of a session with 10 000
// acknowledged and 10 pending signals.
func BenchmarkCountPending(b *testing.B) {
	s, k := pendingSession(b)
	for b.Loop() {
		n, err := s.CountPending(b.Context(), k)
		if err != nil || n != 10 {
			b.Fatalf("CountPending = %d, %v; want 10", n, err)
		}
	}
}

// BenchmarkPendingTotal sums the pending signals of 100 sessions, each with
// 100 acknowledged and 1 pending signal (the pending-signals gauge).
func BenchmarkPendingTotal(b *testing.B) {
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = fmt.Sprintf("s-%d", i)
	}
	s := benchStore(b, ids...)
	for _, id := range ids {
		for i := range 101 {
			benchAppend(b, s, benchKey(id), "bob", "", i)
		}
		if _, err := s.AckSignals(b.Context(), benchKey(id), 100, benchT0); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		n, err := s.PendingTotal(b.Context(), benchT0)
		if err != nil || n != len(ids) {
			b.Fatalf("PendingTotal = %d, %v; want %d", n, err, len(ids))
		}
	}
}
