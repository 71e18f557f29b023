package hub_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
)

// flood runs n calls of do over workers goroutines and tallies the answers
// by status and quota name.
func flood(n, workers int, do func(i int) (int, string)) map[string]int {
	var mu sync.Mutex
	tally := map[string]int{}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				st, quota := do(i)
				mu.Lock()
				tally[fmt.Sprintf("%d %s", st, quota)]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return tally
}

// postQuota posts body with cred and returns the status and, for a quota
// refusal, the quota its message names.
func postQuota(client *http.Client, url, cred string, body []byte) (int, string) {
	req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+cred)
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	json.NewDecoder(resp.Body).Decode(&e)
	if e.Error.Code != "quota_exceeded" {
		return resp.StatusCode, e.Error.Code
	}
	name, _, _ := strings.Cut(strings.TrimPrefix(e.Error.Message, "quota "), " ")
	return resp.StatusCode, name
}

func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestAbusiveKeyIsBounded (issue 12, "Done when"): one API key floods
// registrations; the quotas stop it at exactly the bound they name, in the
// store and in the heap, while another project registers and sends
// throughout without a single refusal.
func TestAbusiveKeyIsBounded(t *testing.T) {
	for name, open := range bothStores() {
		t.Run(name, func(t *testing.T) {
			const (
				sessionsQuota = 300
				regRate       = 1000 // burst 2000
				attempts      = 2400
			)
			clock := hubtest.NewClock(time.Now())
			h := hubtest.Start(t, hubtest.Options{Store: open(t), Now: clock.Now, Config: hub.Config{
				QuotaSessionsPerProject: sessionsQuota, QuotaRegistrationsPerSecond: regRate,
				SendRatePerSecond: 1e6, // the victim's own send limit is not under test
			}})
			victimKey := secondProjectKey(t, h)
			st, r := call(t, "POST", h.URL+"/v1/sessions", victimKey, map[string]any{"session_id": "va", "surface": "codex"})
			if st != 201 {
				t.Fatalf("victim register: %d %v", st, r)
			}
			victim := agent{ID: "va", Token: r["token"].(string)}
			if st, r := call(t, "POST", h.URL+"/v1/sessions", victimKey, map[string]any{"session_id": "vb", "surface": "codex"}); st != 201 {
				t.Fatalf("victim register: %d %v", st, r)
			}
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
			defer client.CloseIdleConnections()
			heapBefore := liveHeap()

			// The victim sends throughout the flood.
			stop := make(chan struct{})
			var victimSends, victimFailures atomic.Int64
			var vwg sync.WaitGroup
			vwg.Go(func() {
				body, _ := json.Marshal(map[string]any{"to_session": "vb", "payload": map[string]any{"n": 1}})
				for victimSends.Load() < 300 { // bounded, so its own signals weigh little in the heap
					select {
					case <-stop:
						return
					default:
					}
					if st, _ := postQuota(client, h.URL+"/v1/signals", victim.Token, body); st != 200 {
						victimFailures.Add(1)
					}
					victimSends.Add(1)
				}
			})
			register := func(i int) (int, string) {
				body, _ := json.Marshal(map[string]any{"session_id": fmt.Sprintf("a%d", i), "surface": "codex"})
				return postQuota(client, h.URL+"/v1/sessions", h.APIKey, body)
			}
			// The clock stands still: the key has its burst of 2000
			// registrations and not one more; of those, the first 300
			// create sessions and the sessions quota refuses the rest.
			got := flood(attempts, 16, register)
			close(stop)
			vwg.Wait()

			t.Logf("answers %v; victim sends %d", got, victimSends.Load())
			want := map[string]int{
				"201 ":                         sessionsQuota,
				"429 sessions_per_project":     2*regRate - sessionsQuota,
				"429 registrations_per_second": attempts - 2*regRate,
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("answers %v, want %v", got, want)
			}
			if n := countSessions(t, h, "t1", "p1"); n != sessionsQuota {
				t.Errorf("the abusive project holds %d sessions in the store, want exactly the quota %d", n, sessionsQuota)
			}
			if victimFailures.Load() != 0 || victimSends.Load() == 0 {
				t.Errorf("the other project: %d of %d sends failed during the flood, want none", victimFailures.Load(), victimSends.Load())
			}
			if n, err := h.Store.CountPending(t.Context(), sessionstore.Key{TenantID: "t2", ProjectID: "p2", SessionID: "vb"}); err != nil || int64(n) != victimSends.Load() {
				t.Errorf("the victim's recipient holds %d signals (%v), want all %d sent", n, err, victimSends.Load())
			}
			if got := metric(t, h, "marconi_quota_refusals_total", "quota", "sessions_per_project") +
				metric(t, h, "marconi_quota_refusals_total", "quota", "registrations_per_second"); int(got) != attempts-sessionsQuota {
				t.Errorf("marconi_quota_refusals_total counts %v refusals, want %d", got, attempts-sessionsQuota)
			}
			if name == "memstore" {
				// The in-memory store holds the sessions in this heap. The
				// bound follows from the quota: 2 KiB a session (measured
				// about 1 KiB, with -race too) plus 512 KiB for what else
				// the flood and the victim's signals left live. Without
				// the quota the 2000 registrations the rate let through
				// hold nearly twice it (measured 1.9 MiB).
				grew := int64(liveHeap()) - int64(heapBefore)
				bound := int64(sessionsQuota*2<<10 + 512<<10)
				t.Logf("heap grew %d KiB for %d sessions", grew>>10, sessionsQuota)
				if grew > bound {
					t.Errorf("heap grew %d bytes, more than the quota allows (%d)", grew, bound)
				}
			}
		})
	}
}
