package main

import (
	"context"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// sendHistogram is the hubs' marconi_send_duration_seconds, summed over
// the hubs of a run: the time each send spent in a hub, from validation to
// the answer (the group commit's wait included, HTTP excluded). Beside the
// senders' own p99 it tells a tail made in the hub from one made outside
// it (the HTTP exchange, the load's and the machine's scheduling).
type sendHistogram struct {
	bounds []float64 // the buckets' upper bounds, in seconds, ascending; +Inf last
	counts []float64 // cumulative counts, one per bound
}

// readSendHistogram reads a hub's histogram from its /metrics; the zero
// histogram when it cannot.
func readSendHistogram(ctx context.Context, hub string) sendHistogram {
	var h sendHistogram
	if readMetrics(ctx, hub, h.parseLine) != nil {
		return sendHistogram{}
	}
	return h
}

// parseLine takes one line of a Prometheus text exposition into h when it
// is one of marconi_send_duration_seconds' buckets.
func (h *sendHistogram) parseLine(line string) {
	const prefix = `marconi_send_duration_seconds_bucket{le="`
	rest, ok := strings.CutPrefix(line, prefix)
	if !ok {
		return
	}
	le, count, ok := strings.Cut(rest, `"} `)
	if !ok {
		return
	}
	bound, err1 := strconv.ParseFloat(le, 64)
	n, err2 := strconv.ParseFloat(strings.TrimSpace(count), 64)
	if err1 != nil || err2 != nil {
		return
	}
	h.bounds, h.counts = append(h.bounds, bound), append(h.counts, n)
}

// add is h and o summed, bucket by bucket (the zero histogram adds nothing).
func (h sendHistogram) add(o sendHistogram) sendHistogram {
	if len(h.bounds) == 0 {
		return sendHistogram{bounds: slices.Clone(o.bounds), counts: slices.Clone(o.counts)}
	}
	if !slices.Equal(h.bounds, o.bounds) {
		return h
	}
	for i := range h.counts {
		h.counts[i] += o.counts[i]
	}
	return h
}

// since is what h counted after earlier.
func (h sendHistogram) since(earlier sendHistogram) sendHistogram {
	if !slices.Equal(h.bounds, earlier.bounds) {
		return sendHistogram{}
	}
	d := sendHistogram{bounds: h.bounds, counts: slices.Clone(h.counts)}
	for i := range d.counts {
		d.counts[i] -= earlier.counts[i]
	}
	return d
}

// quantile is the q quantile of h, interpolated linearly inside its
// bucket as Prometheus's histogram_quantile does; 0 when h is empty, and
// the last finite bound when it falls in +Inf's bucket.
func (h sendHistogram) quantile(q float64) time.Duration {
	n := len(h.counts)
	if n == 0 || h.counts[n-1] <= 0 {
		return 0
	}
	rank := q * h.counts[n-1]
	i, _ := slices.BinarySearch(h.counts, rank)
	i = min(i, n-1)
	if math.IsInf(h.bounds[i], 1) {
		return secondsDuration(h.bounds[max(i-1, 0)])
	}
	lower, below := 0.0, 0.0
	if i > 0 {
		lower, below = h.bounds[i-1], h.counts[i-1]
	}
	in := h.counts[i] - below
	if in <= 0 {
		return secondsDuration(h.bounds[i])
	}
	return secondsDuration(lower + (h.bounds[i]-lower)*(rank-below)/in)
}

func secondsDuration(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
