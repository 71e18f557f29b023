package pgstore

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
)

// TestBatchMetrics: each committed group commit observes its size, and a
// batch Postgres refuses whole counts one rerun under its reason (a member's
// bad value; the project's pending-bytes limit), its members then committed
// one by one.
func TestBatchMetrics(t *testing.T) {
	u := pgtest.Schema(t)
	t.Parallel()
	ctx := t.Context()
	_, keys, now := inFlightStores(ctx, t, u, 1, 1, 8, 3)
	reg := prometheus.NewRegistry()
	s, err := Open(ctx, u, WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	run := func(nss ...sessionstore.NewSignal) []error {
		t.Helper()
		var batch []*appendReq
		for _, ns := range nss {
			batch = append(batch, &appendReq{ns: ns, now: now})
		}
		s.runBatch(0, batch)
		var errs []error
		for _, r := range batch {
			errs = append(errs, r.out.err)
		}
		return errs
	}
	check := func(what string, batches, requests float64, reruns map[string]float64) {
		t.Helper()
		var m dtoHistogram
		m.read(t, reg, "marconi_store_batch_size")
		if m.count != batches || m.sum != requests {
			t.Errorf("%s: marconi_store_batch_size count %v sum %v, want %v and %v", what, m.count, m.sum, batches, requests)
		}
		for reason, want := range reruns {
			if got := testutil.ToFloat64(s.metrics.reruns.WithLabelValues(reason)); got != want {
				t.Errorf("%s: reruns{reason=%q} %v, want %v", what, reason, got, want)
			}
		}
	}

	for i, err := range run(sized(keys[0], 10, now), sized(keys[1], 10, now), sized(keys[2], 10, now)) {
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	check("one batch of three", 1, 3, map[string]float64{rerunDeadlock: 0, rerunQuota: 0, rerunRefused: 0})

	bad := sized(keys[1], 10, now)
	bad.Payload = json.RawMessage(`{"not json`)
	errs := run(sized(keys[0], 10, now), bad)
	if errs[0] != nil || errs[1] == nil {
		t.Fatalf("a batch with a bad payload: errors %v, want only the second's", errs)
	}
	check("a member's bad value", 2, 4, map[string]float64{rerunRefused: 1})

	limited := func(k sessionstore.Key) sessionstore.NewSignal {
		ns := sized(k, 100, now)
		// 40 bytes pending (four signals of 10): room for one more of 100,
		// not for two.
		ns.Limits.PendingBytesPerProject = 40 + 150
		return ns
	}
	errs = run(limited(keys[0]), limited(keys[1]))
	var q *sessionstore.QuotaError
	if errs[0] != nil || !errors.As(errs[1], &q) {
		t.Fatalf("a batch past the project's limit: errors %v, want the second's a QuotaError", errs)
	}
	check("the project's limit", 4, 6, map[string]float64{rerunQuota: 1, rerunRefused: 1, rerunDeadlock: 0})
}

// dtoHistogram is one histogram's count and sum as gathered from a registry.
type dtoHistogram struct{ count, sum float64 }

func (h *dtoHistogram) read(t *testing.T, g prometheus.Gatherer, name string) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			hist := mf.GetMetric()[0].GetHistogram()
			h.count, h.sum = float64(hist.GetSampleCount()), hist.GetSampleSum()
			return
		}
	}
	t.Fatalf("no histogram %s gathered", name)
}
