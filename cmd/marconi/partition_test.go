package main

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/pgtest"
)

// metricValue reads one unlabelled series from the hub's /metrics.
func metricValue(t *testing.T, base, name string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(text)
	if m == nil {
		t.Fatalf("no %s in /metrics", name)
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// TestPartitionFailsFast (issue 12.7): Postgres behind a proxy that drops
// every packet (a partition, not a refusal). The first call waits out the
// store timeout; after it, calls answer 503 registry_unavailable at once
// instead of one timeout each, and so does /readyz once a probe confirms, and everything recovers by itself
// when the partition heals.
func TestPartitionFailsFast(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (waits out store timeouts): skipped by -short")
	}
	dbURL, proxy := viaProxy(t, pgtest.Schema(t))
	m, out := startMain(t, map[string]string{
		"MARCONI_DATABASE_URL":            dbURL,
		"MARCONI_STORE_TIMEOUT_SECONDS":   "1",
		"MARCONI_STORE_PROBE_INTERVAL_MS": "100",
	})
	key := devKey(t, out.String())
	if a := post(t, m.URL()+"/v1/sessions", key, `{"session_id":"alice","surface":"claude_code"}`); a.status != 201 {
		t.Fatalf("register before the partition: %+v", a)
	}

	proxy.Partition()
	start := time.Now()
	if a := post(t, m.URL()+"/v1/sessions", key, `{"session_id":"bob","surface":"claude_code"}`); a.status != 503 || a.code != "registry_unavailable" {
		t.Fatalf("first call in the partition: %+v, want 503 registry_unavailable", a)
	}
	t.Logf("first call in the partition: %v (store timeout 1s)", time.Since(start))
	// A call out of time may be a slow store: /readyz fails once a probe
	// finds the store unreachable (TestReadyzStaysUpWhileTheStoreIsSlow).
	pollUntil(t, "a probe to find the store unreachable", func() bool { return get(t, m.URL()+"/readyz") == 503 })

	var took []time.Duration
	for i := range 7 {
		start := time.Now()
		a := post(t, m.URL()+"/v1/sessions", key, `{"session_id":"bob","surface":"claude_code"}`)
		took = append(took, time.Since(start))
		if a.status != 503 || a.code != "registry_unavailable" {
			t.Fatalf("call %d in the partition: %+v, want 503 registry_unavailable", i, a)
		}
		start = time.Now()
		st := get(t, m.URL()+"/readyz")
		took = append(took, time.Since(start))
		if st != 503 {
			t.Fatalf("readyz in the partition: %d, want 503", st)
		}
	}
	slices.Sort(took)
	t.Logf("answers in the partition: median %v, slowest %v", took[len(took)/2], took[len(took)-1])
	// The spec is 100 ms; the slowest may meet a noisy shared machine, but
	// none may wait for the store (1 s).
	if took[len(took)/2] > 100*time.Millisecond || took[len(took)-1] > 500*time.Millisecond {
		t.Fatalf("answers in the partition took median %v, slowest %v; want them at once (median under 100ms), not after the store timeout",
			took[len(took)/2], took[len(took)-1])
	}
	if v := metricValue(t, m.URL(), "marconi_store_breaker_open"); v != 1 {
		t.Fatalf("marconi_store_breaker_open = %v in the partition, want 1", v)
	}

	proxy.Heal()
	checkRecovered(t, m, key)
	if v := metricValue(t, m.URL(), "marconi_store_breaker_trips_total"); v < 1 {
		t.Fatalf("marconi_store_breaker_trips_total = %v, want at least 1", v)
	}
}

// TestReadyzStaysUpWhileTheStoreIsSlow: Postgres answers but every call
// needing the sessions table waits on a lock past the store timeout, and
// such a call holds the whole pool (one connection here). They answer 503
// registry_unavailable (and open the breaker), yet /readyz stays 200: the
// store is reachable, every instance shares it, and a balancer left with no
// server would answer nobody. Before, /readyz pinged through the exhausted
// pool and failed. The same holds with the breaker off.
func TestReadyzStaysUpWhileTheStoreIsSlow(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (waits out store timeouts): skipped by -short")
	}
	for _, br := range []string{"on", "off"} {
		t.Run("breaker "+br, func(t *testing.T) { readyzWhileSlow(t, br) })
	}
}

func readyzWhileSlow(t *testing.T, breaker string) {
	dbURL := pgtest.Schema(t)
	m, out := startMain(t, map[string]string{
		"MARCONI_DATABASE_URL":          dbURL,
		"MARCONI_STORE_TIMEOUT_SECONDS": "3",
		"MARCONI_DATABASE_MAX_CONNS":    "1",
		"MARCONI_STORE_BREAKER":         breaker,
	})
	key := devKey(t, out.String())
	if a := post(t, m.URL()+"/v1/sessions", key, `{"session_id":"alice","surface":"claude_code"}`); a.status != 201 {
		t.Fatalf("register before the lock: %+v", a)
	}

	lock := pgtest.LockTable(t, dbURL, "sessions")

	const calls = 2 // twice the pool
	statuses := make(chan int, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			body := fmt.Sprintf(`{"session_id":"slow-%d","surface":"claude_code"}`, i)
			req, _ := http.NewRequest("POST", m.URL()+"/v1/sessions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
			if err != nil {
				statuses <- 0
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		})
	}
	lock.WaitForWaiter(t)
	if st := get(t, m.URL()+"/readyz"); st != 200 {
		t.Fatalf("/readyz with the pool held by slow calls: %d, want 200", st)
	}
	wg.Wait()
	close(statuses)
	for st := range statuses {
		if st != 503 {
			t.Fatalf("a call that waited past the store timeout: %d, want 503", st)
		}
	}
	if breaker == "on" {
		if v := metricValue(t, m.URL(), "marconi_store_breaker_trips_total"); v < 1 {
			t.Fatalf("marconi_store_breaker_trips_total = %v: the slow calls should have opened the breaker", v)
		}
	}
	if st := get(t, m.URL()+"/readyz"); st != 200 {
		t.Fatalf("/readyz after the slow calls: %d, want 200", st)
	}
	lock.Release(t)
	pollUntil(t, "a register once the lock is gone", func() bool {
		return post(t, m.URL()+"/v1/sessions", key, `{"session_id":"bob","surface":"claude_code"}`).status == 201
	})
}
