package conns_test

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkSweep measures the pending sweep of an instance with idle
// attached sessions (every signal written): the store reads one sweep costs
// (heads/sweep batch reads, conn-reads/sweep per-connection reads of a row
// or of pending signals) and the time from one sweep's start to the next's (ns/op;
// the sweep runs every millisecond, so that is the sweep's own time when it
// takes longer). docs/benchmarks-history.md, "The pending sweep".
func BenchmarkSweep(b *testing.B) {
	for _, store := range stores {
		for _, n := range []int{100, 1000} {
			b.Run(fmt.Sprintf("store=%s/conns=%d", store, n), func(b *testing.B) {
				st := &sweepReads{Store: openStore(b, store)}
				h, _ := attachIdle(b, st, time.Millisecond, n)
				// Let the attaches' own catch-ups finish.
				s0 := sweeps(b, h)
				waitFor(b, "two sweeps", func() bool { return sweeps(b, h) >= s0+2 })
				b.ResetTimer()
				h0, c0, s0 := st.heads.Load(), st.perConn.Load(), sweeps(b, h)
				// Sweep s0+N+1 starts when sweep s0+N has ended.
				waitFor(b, "b.N sweeps", func() bool { return sweeps(b, h) > s0+int64(b.N) })
				b.StopTimer()
				b.ReportMetric(float64(st.heads.Load()-h0)/float64(b.N), "heads/sweep")
				b.ReportMetric(float64(st.perConn.Load()-c0)/float64(b.N), "conn-reads/sweep")
			})
		}
	}
}
