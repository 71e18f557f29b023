package hub

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// BenchmarkSampleCluster: one sample of the cluster-wide gauges (pending
// total, and every live session listed and classified by route state) on
// the in-memory store. docs/benchmarks-history.md, "Operator metrics".
func BenchmarkSampleCluster(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			st := memstore.New()
			defer st.Close()
			now := time.Now()
			ctx := context.Background()
			for i := range n {
				surface := marconi.SurfaceClaudeCode
				if i%4 == 0 {
					surface = marconi.SurfaceCodex
				}
				_, err := st.CreateSession(ctx, sessionstore.Session{
					Key:     sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: fmt.Sprintf("s%d", i)},
					Surface: surface, RuntimeMode: "stateless", TokenHash: []byte{byte(i), byte(i >> 8), byte(i >> 16)},
					RegisteredAt: now, ExpiresAt: now.Add(time.Hour),
				}, now)
				if err != nil {
					b.Fatal(err)
				}
			}
			s, err := New(Config{InstanceID: "bench"}, Deps{Store: st, Registry: prometheus.NewRegistry()})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				s.sampleCluster(ctx)
			}
			b.StopTimer()
			s.cluster.mu.Lock()
			got := s.cluster.sessions[[2]string{"route_without_queue", "live"}] + s.cluster.sessions[[2]string{"route_without_queue", "piggyback"}]
			s.cluster.mu.Unlock()
			if got != n {
				b.Fatalf("sampled %d sessions without a queue, want %d", got, n)
			}
		})
	}
}

// BenchmarkObserveHTTP: the HTTP metrics middleware's cost on a trivial
// route, beside the same route without it, in one run (compare the ratio).
func BenchmarkObserveHTTP(b *testing.B) {
	s, err := New(Config{InstanceID: "bench"}, Deps{Store: memstore.New(), Registry: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	for _, withMetrics := range []bool{false, true} {
		b.Run(fmt.Sprintf("metrics=%v", withMetrics), func(b *testing.B) {
			e := echo.New()
			if withMetrics {
				e.Use(s.observeHTTP)
			}
			e.GET("/v1/ops/route_state/:tenant/:project/:session", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
			req := httptest.NewRequest(http.MethodGet, "/v1/ops/route_state/t/p/s", nil)
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				e.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d", w.Code)
				}
			}
		})
	}
}
