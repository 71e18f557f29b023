package conns

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi/sessionstore"
)

// downStore is a store that is unreachable: every batch read of rows fails
// at once (as when the breaker is open).
type downStore struct{ Store }

func (downStore) SessionHeads(context.Context, []sessionstore.Key, time.Time) (map[sessionstore.Key]sessionstore.SessionHead, error) {
	return nil, sessionstore.ErrUnavailable
}

type healthyPeers struct{}

func (healthyPeers) Healthy(context.Context, string) bool               { return true }
func (healthyPeers) HoldsQueue(context.Context, string, time.Time) bool { return true }

// BenchmarkCloseExpiredStoreDown measures one expiry check of an instance
// whose n connections are all due (their sessions' TTL passed during a
// store outage) while the store's reads fail: what each check interval
// costs until the store answers. scan is the part spent under the
// registry's lock (expired); check is the whole run (the scan, then the
// first batch read failing at once). docs/benchmarks-history.md, "The
// expiry check during a store outage".
func BenchmarkCloseExpiredStoreDown(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		now := time.Now()
		h, err := New(Config{InstanceID: "i1", SessionTTL: time.Hour, TouchInterval: time.Second, StoreTimeout: time.Second},
			Deps{
				Store: downStore{},
				Ack: func(context.Context, sessionstore.Key, sessionstore.Holder, int64) (int, error) {
					return 0, nil
				},
				Peers: healthyPeers{}, Draining: func() bool { return false },
				Registry: prometheus.NewRegistry(), Now: func() time.Time { return now },
			})
		if err != nil {
			b.Fatal(err)
		}
		for i := range n {
			c := &Conn{h: h, key: sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: fmt.Sprint(i)}, kicked: make(chan struct{})}
			c.expires.Store(now.Add(-time.Second).UnixNano())
			h.registry.attach(c)
		}
		b.Run(fmt.Sprintf("scan/conns=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if due := h.expired(now); len(due) != n {
					b.Fatalf("%d due, want %d", len(due), n)
				}
			}
		})
		b.Run(fmt.Sprintf("check/conns=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				h.CloseExpired(context.Background())
			}
			if h.nextExpiry.Load() > now.UnixNano() {
				b.Fatal("the due connections are no longer due")
			}
		})
	}
}
