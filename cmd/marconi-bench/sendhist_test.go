package main

import (
	"strings"
	"testing"
	"time"
)

func TestSendHistogramQuantile(t *testing.T) {
	const text = `# HELP marconi_send_duration_seconds Time to handle a send.
# TYPE marconi_send_duration_seconds histogram
marconi_send_duration_seconds_bucket{le="0.001"} 10
marconi_send_duration_seconds_bucket{le="0.002"} 90
marconi_send_duration_seconds_bucket{le="0.004"} 100
marconi_send_duration_seconds_bucket{le="+Inf"} 100
marconi_send_duration_seconds_sum 0.15
marconi_send_duration_seconds_count 100
marconi_signals_sent_total{delivery="pushed_to_ws"} 100
`
	h := parseSendHistogram(text)
	if len(h.bounds) != 4 {
		t.Fatalf("bounds %v, want the four buckets", h.bounds)
	}
	before := parseSendHistogram(strings.ReplaceAll(strings.ReplaceAll(strings.ReplaceAll(text,
		"} 10\n", "} 5\n"), "} 90\n", "} 5\n"), "} 100\n", "} 5\n"))
	d := h.since(before)
	// 95 sends in the window: 5, 80 and 10 in the three buckets.
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{
		{0.05, 950 * time.Microsecond},   // rank 4.75: 4.75 of 5 into (0, 1 ms]
		{0.5, 1531250 * time.Nanosecond}, // rank 47.5: 42.5 of 80 into (1, 2 ms]
		{0.99, 3810 * time.Microsecond},  // rank 94.05: 9.05 of 10 into (2, 4 ms]
	} {
		if got := d.quantile(c.q); (got - c.want).Abs() > time.Microsecond {
			t.Errorf("quantile %v: %v, want %v", c.q, got, c.want)
		}
	}
	sum := d.add(d)
	if got := sum.quantile(0.99); (got - 3810*time.Microsecond).Abs() > time.Microsecond {
		t.Errorf("two hubs alike: p99 %v, want the same 3.81ms", got)
	}
	if (sendHistogram{}).quantile(0.99) != 0 {
		t.Error("an empty histogram has a p99")
	}
}

// parseSendHistogram reads the buckets of a Prometheus text exposition, as
// readSendHistogram does from a hub's /metrics.
func parseSendHistogram(text string) sendHistogram {
	var h sendHistogram
	for line := range strings.Lines(text) {
		h.parseLine(strings.TrimSuffix(line, "\n"))
	}
	return h
}
