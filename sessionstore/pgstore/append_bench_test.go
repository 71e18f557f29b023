package pgstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// BenchmarkAppendSignal measures durable appends straight on the store (no
// HTTP), each sender to its own recipient, with group commit on and off:
//
//	go test ./sessionstore/pgstore -run '^$' -bench AppendSignal -benchtime 3000x
//
// It reports appends/s and the p50 and p99 of one append.
func BenchmarkAppendSignal(b *testing.B) {
	for _, gc := range []bool{true, false} {
		for _, senders := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("group_commit=%v/senders=%d", gc, senders), func(b *testing.B) {
				benchAppend(b, gc, senders)
			})
		}
	}
}

// BenchmarkAppendSignalInFlight is BenchmarkAppendSignal with group commit
// on and 1, 2 or 3 batches in flight (MARCONI_STORE_BATCHES_IN_FLIGHT):
//
//	go test ./sessionstore/pgstore -run '^$' -bench AppendSignalInFlight -benchtime 3000x
func BenchmarkAppendSignalInFlight(b *testing.B) {
	for _, inFlight := range []int{1, 2, 3} {
		for _, senders := range []int{8, 64} {
			b.Run(fmt.Sprintf("in_flight=%d/senders=%d", inFlight, senders), func(b *testing.B) {
				benchAppend(b, true, senders, pgstore.WithBatchesInFlight(inFlight))
			})
		}
	}
}

func benchAppend(b *testing.B, groupCommit bool, senders int, opts ...pgstore.Option) {
	u := pgtest.Schema(b)
	ctx := context.Background()
	st, err := pgstore.Open(ctx, u, append([]pgstore.Option{pgstore.WithGroupCommit(groupCommit), pgstore.WithMaxConns(16)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	keys := make([]sessionstore.Key, senders)
	for i := range keys {
		keys[i] = sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: fmt.Sprintf("r%d", i)}
		_, err := st.CreateSession(ctx, sessionstore.Session{Key: keys[i], TokenHash: []byte(uuid.NewString()),
			RegisteredAt: now, ExpiresAt: now.Add(time.Hour)}, now)
		if err != nil {
			b.Fatal(err)
		}
	}
	payload := json.RawMessage(`"` + "012345678901234567890123456789012345678901234567890123456" + `"`)
	var (
		mu   sync.Mutex
		lats []time.Duration
		wg   sync.WaitGroup
	)
	b.ResetTimer()
	start := time.Now()
	for i := range senders {
		n := b.N / senders
		if i < b.N%senders {
			n++
		}
		wg.Go(func() {
			mine := make([]time.Duration, 0, n)
			for range n {
				t0 := time.Now()
				_, _, err := st.AppendSignal(ctx, sessionstore.NewSignal{ID: uuid.NewString(), To: keys[i], FromSession: "s",
					Kind: "bench", Payload: payload, CreatedAt: t0,
					Limits: sessionstore.Limits{PendingPerRecipient: 1 << 30, PendingBytesPerProject: 1 << 40}}, t0)
				if err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if len(lats) == 0 {
		return
	}
	slices.Sort(lats)
	b.ReportMetric(float64(len(lats))/elapsed.Seconds(), "appends/s")
	b.ReportMetric(float64(lats[len(lats)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds())/1000, "p99_ms")
}
