package hub_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// BenchmarkRegister is POST /v1/sessions over real HTTP, one request at a
// time, each registering a new session_id: without an Idempotency-Key
// (no_key), with a fresh one (key: the hub first looks for a registration to
// retry, and finds none), and the retry of one registration with its key
// (retry: a new token each time). ns/op is the latency a client sees.
func BenchmarkRegister(b *testing.B) {
	for _, store := range benchStores {
		for _, mode := range []string{"no_key", "key", "retry"} {
			b.Run(store+"/"+mode, func(b *testing.B) {
				h := benchHub(b, store)
				hc := benchHTTP(b)
				lat := make([]time.Duration, 0, b.N)
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					id, key := fmt.Sprintf("reg-%d", i), fmt.Sprintf("registration-key-%030d", i)
					if mode == "retry" {
						id, key = "reg-retried", "registration-key-retried-0000"
					}
					body, _ := json.Marshal(map[string]any{"session_id": id, "surface": "claude_code"})
					req, err := http.NewRequest(http.MethodPost, h.URL+"/v1/sessions", bytes.NewReader(body))
					if err != nil {
						b.Fatal(err)
					}
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Authorization", "Bearer "+h.APIKey)
					if mode != "no_key" {
						req.Header.Set("Idempotency-Key", key)
					}
					t0 := time.Now()
					resp, err := hc.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					_ = resp.Body.Close()
					lat = append(lat, time.Since(t0))
					if resp.StatusCode != http.StatusCreated {
						b.Fatalf("register %s (%s): %d", id, mode, resp.StatusCode)
					}
				}
				b.StopTimer()
				reportPercentiles(b, "register_", lat)
			})
		}
	}
}
