package hub_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// registerRaw posts a registration with key and returns the status, the
// error code (if any) and the Retry-After header.
func registerRaw(t *testing.T, h *hubtest.Hub, key, id string) (int, string, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"session_id": id, "surface": "codex"})
	req, _ := http.NewRequest("POST", h.URL+"/v1/sessions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	json.NewDecoder(resp.Body).Decode(&e)
	if e.Error.Code == "quota_exceeded" && !strings.Contains(e.Error.Message, "quota ") {
		t.Errorf("quota refusal does not name its quota: %q", e.Error.Message)
	}
	return resp.StatusCode, e.Error.Code, resp.Header.Get("Retry-After")
}

func countSessions(t *testing.T, h *hubtest.Hub, tenant, project string) int {
	t.Helper()
	n, err := h.Store.CountSessions(t.Context(), sessionstore.SessionFilter{TenantID: tenant, ProjectID: project}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func secondProjectKey(t *testing.T, h *hubtest.Hub) string {
	t.Helper()
	st, r := call(t, "POST", h.URL+"/v1/ops/api_keys", h.AdminToken, map[string]any{"tenant_id": "t2", "project_id": "p2"})
	if st != 201 {
		t.Fatalf("second project key: %d %v", st, r)
	}
	return r["api_key"].(string)
}

// TestSessionsQuotaCountsOncePerRoom: a count of the project's sessions
// leaves room for up to a tenth of the quota that the next registrations of
// this instance take from memory (counting scans the project, under its
// lock: at every registration it held a fleet starting at once to about a
// hundred registrations a second), and the quota stays exact on one
// instance.
func TestSessionsQuotaCountsOncePerRoom(t *testing.T) {
	clock := hubtest.NewClock(time.Now()) // stands still: the registrations are within one recount
	for _, tc := range []struct {
		quota, register, created, counts int
	}{
		{quota: 1000, register: 100, created: 100, counts: 1}, // room for 100 (a tenth) after one count
		{quota: 1000, register: 101, created: 101, counts: 2}, // the 101st counts again
		{quota: 20, register: 25, created: 20, counts: 11},    // room for 2 per count; refused at 20 (counted: 10 + 1)
	} {
		st := &countingStore{Store: memstore.New()}
		h := hubtest.Start(t, hubtest.Options{Store: st, Now: clock.Now, Config: hub.Config{
			QuotaSessionsPerProject: tc.quota, QuotaRegistrationsPerSecond: 1e6,
		}})
		created := 0
		for i := range tc.register {
			switch code, _, _ := registerRaw(t, h, h.APIKey, fmt.Sprintf("s%d", i)); code {
			case 201:
				created++
			case 429:
			default:
				t.Fatalf("quota %d, registration %d: %d", tc.quota, i, code)
			}
		}
		if got := st.counts.Load(); got != int64(tc.counts) {
			t.Errorf("quota %d, %d registered: %d counts of the project, want %d", tc.quota, tc.register, got, tc.counts)
		}
		if stored := countSessions(t, h, "t1", "p1"); created != tc.created || stored != tc.created {
			t.Errorf("quota %d, %d registered: %d created, %d stored; want %d", tc.quota, tc.register, created, stored, tc.created)
		}
	}
}

// TestSessionsPerProjectQuota: past the quota a registration is refused with
// 429 quota_exceeded naming sessions_per_project, without Retry-After
// (waiting does not help), nothing is stored, other projects still register,
// and a deregistration frees a place.
func TestSessionsPerProjectQuota(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{QuotaSessionsPerProject: 3}})
	other := secondProjectKey(t, h)
	var first agent
	for i := range 3 {
		a := register(t, h, fmt.Sprintf("s%d", i), "codex")
		if i == 0 {
			first = a
		}
	}
	st, code, retry := registerRaw(t, h, h.APIKey, "s3")
	if st != 429 || code != "quota_exceeded" || retry != "" {
		t.Fatalf("fourth session: %d %s Retry-After %q, want 429 quota_exceeded without Retry-After", st, code, retry)
	}
	if n := countSessions(t, h, "t1", "p1"); n != 3 {
		t.Fatalf("%d sessions stored, want 3", n)
	}
	if st, _, _ := registerRaw(t, h, other, "s0"); st != 201 {
		t.Fatalf("another project registering: %d, want 201", st)
	}
	if got := metric(t, h, "marconi_quota_refusals_total", "quota", "sessions_per_project"); got != 1 {
		t.Fatalf("marconi_quota_refusals_total{sessions_per_project} = %v, want 1", got)
	}
	for _, q := range marconi.Quotas {
		metric(t, h, "marconi_quota_refusals_total", "quota", string(q)) // present from start
	}
	if st, _ := call(t, "DELETE", h.URL+"/v1/session", first.Token, nil); st != 204 {
		t.Fatalf("deregister: %d", st)
	}
	if st, _, _ := registerRaw(t, h, h.APIKey, "s3"); st != 201 {
		t.Fatalf("after a deregistration: %d, want 201", st)
	}
}

// TestSessionsQuotaHoldsUnderConcurrency: many registrations at once cannot
// pass the quota together.
func TestSessionsQuotaHoldsUnderConcurrency(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{QuotaSessionsPerProject: 5}})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for i := range 30 {
		wg.Go(func() {
			st, _, _ := registerRaw(t, h, h.APIKey, fmt.Sprintf("c%d", i))
			mu.Lock()
			codes[st]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[201] != 5 || codes[429] != 25 {
		t.Fatalf("answers %v, want 5×201 and 25×429", codes)
	}
	if n := countSessions(t, h, "t1", "p1"); n != 5 {
		t.Fatalf("%d sessions stored, want 5", n)
	}
}

// TestRegistrationsPerSecondQuota: one API key registers at most its burst
// (twice the rate) at once, then gets 429 quota_exceeded with Retry-After;
// another key is not affected, and the bucket refills with time.
func TestRegistrationsPerSecondQuota(t *testing.T) {
	clock := hubtest.NewClock(time.Now())
	h := hubtest.Start(t, hubtest.Options{Now: clock.Now, Config: hub.Config{QuotaRegistrationsPerSecond: 2}})
	other := secondProjectKey(t, h)
	for i := range 4 {
		if st, code, _ := registerRaw(t, h, h.APIKey, fmt.Sprintf("r%d", i)); st != 201 {
			t.Fatalf("registration %d within the burst: %d %s", i, st, code)
		}
	}
	st, code, retry := registerRaw(t, h, h.APIKey, "r4")
	if st != 429 || code != "quota_exceeded" || retry != "1" {
		t.Fatalf("past the burst: %d %s Retry-After %q, want 429 quota_exceeded, Retry-After 1", st, code, retry)
	}
	if n := countSessions(t, h, "t1", "p1"); n != 4 {
		t.Fatalf("%d sessions stored, want 4 (the refused one stores nothing)", n)
	}
	if st, _, _ := registerRaw(t, h, other, "x"); st != 201 {
		t.Fatalf("another key: %d, want 201", st)
	}
	if got := metric(t, h, "marconi_quota_refusals_total", "quota", "registrations_per_second"); got != 1 {
		t.Fatalf("marconi_quota_refusals_total{registrations_per_second} = %v, want 1", got)
	}
	clock.Advance(time.Second)
	if st, _, _ := registerRaw(t, h, h.APIKey, "r4"); st != 201 {
		t.Fatalf("after a second: %d, want 201", st)
	}
}

// TestQuotaRefusedHook: the connection layer's refusals count in the same
// metric; a name outside marconi.Quotas adds no label.
func TestQuotaRefusedHook(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	h.Server.QuotaRefused(marconi.QuotaFramesPerSecond)
	h.Server.QuotaRefused(marconi.Quota("made_up"))
	if got := metric(t, h, "marconi_quota_refusals_total", "quota", "frames_per_second"); got != 1 {
		t.Fatalf("frames_per_second refusals = %v, want 1", got)
	}
	mfs, _ := h.Registry.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "marconi_quota_refusals_total" && len(mf.GetMetric()) != len(marconi.Quotas) {
			t.Fatalf("%d label values, want exactly the %d quotas", len(mf.GetMetric()), len(marconi.Quotas))
		}
	}
}

// quotaStore refuses every append as a store-side quota would.
type quotaStore struct{ sessionstore.Store }

func (quotaStore) AppendSignal(context.Context, sessionstore.NewSignal, time.Time) (sessionstore.Signal, bool, error) {
	return sessionstore.Signal{}, false, fmt.Errorf("append: %w", &sessionstore.QuotaError{Quota: marconi.QuotaPendingPerRecipient, Limit: 10, Current: 10})
}

// TestStoreQuotaRefusalIsCounted: a quota the store enforces answers 429
// quota_exceeded through the error handler and counts in the same metric.
func TestStoreQuotaRefusalIsCounted(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Store: quotaStore{memstore.New()}})
	alice := register(t, h, "alice", "codex")
	register(t, h, "bob", "codex")
	st, r := call(t, "POST", h.URL+"/v1/signals", alice.Token, map[string]any{"to_session": "bob", "payload": 1})
	if st != 429 || errCode(r) != "quota_exceeded" {
		t.Fatalf("send past a store quota: %d %v", st, r)
	}
	if got := metric(t, h, "marconi_quota_refusals_total", "quota", "pending_per_recipient"); got != 1 {
		t.Fatalf("pending_per_recipient refusals = %v, want 1", got)
	}
}

// countingStore counts CountSessions calls.
type countingStore struct {
	sessionstore.Store
	counts atomic.Int64
}

func (c *countingStore) CountSessions(ctx context.Context, f sessionstore.SessionFilter, now time.Time) (int, error) {
	c.counts.Add(1)
	return c.Store.CountSessions(ctx, f, now)
}

// TestFullProjectIsNotRecountedEachTime: a key hammering a full project is
// refused from memory, without a store count each time, until a second has
// passed; then the sessions are counted again, and one that expired frees a
// place.
func TestFullProjectIsNotRecountedEachTime(t *testing.T) {
	clock := hubtest.NewClock(time.Now())
	st := &countingStore{Store: memstore.New()}
	h := hubtest.Start(t, hubtest.Options{Store: st, Now: clock.Now, Config: hub.Config{QuotaSessionsPerProject: 2, SessionTTL: time.Minute}})
	register(t, h, "a", "codex")
	clock.Advance(30 * time.Second)
	register(t, h, "b", "codex")
	if st, code, _ := registerRaw(t, h, h.APIKey, "c"); st != 429 || code != "quota_exceeded" {
		t.Fatalf("third session: %d %s", st, code)
	}
	before := st.counts.Load()
	for i := range 10 {
		if st, _, _ := registerRaw(t, h, h.APIKey, fmt.Sprintf("x%d", i)); st != 429 {
			t.Fatalf("hammering a full project: %d", st)
		}
	}
	if n := st.counts.Load() - before; n != 0 {
		t.Fatalf("%d store counts while the project was known full, want 0", n)
	}
	// 31 s on, "a" has expired (TTL 1 min): a recount finds the place.
	clock.Advance(31 * time.Second)
	if st, code, _ := registerRaw(t, h, h.APIKey, "c"); st != 201 {
		t.Fatalf("after a session expired: %d %s, want 201", st, code)
	}
}

// TestConnectionLayerRefusalsAreCounted: the connection cap's refusal
// (answered through the error handler) and the frame-rate close (which the
// connection layer reports through Server.QuotaRefused) both count in
// marconi_quota_refusals_total.
func TestConnectionLayerRefusalsAreCounted(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{MaxConnections: 1, WSFramesPerSecond: 1}})
	a := register(t, h, "a", "claude_code")
	b := register(t, h, "b", "claude_code")
	ca, _ := dial(t, h, a)

	upgrade := []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}
	if st, body := call(t, "GET", h.URL+"/v1/ws", b.Token, nil, upgrade...); st != http.StatusTooManyRequests || errCode(body) != "quota_exceeded" {
		t.Fatalf("second connection past MaxConnections 1: %d %v", st, body)
	}
	if got := metric(t, h, "marconi_quota_refusals_total", "quota", "connections_total"); got != 1 {
		t.Fatalf("connections_total refusals = %v, want 1", got)
	}

	// A burst of 2 frames is allowed; the flood past it closes the connection.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 10 {
		if err := ca.Write(ctx, websocket.MessageText, []byte(`{"type":"ack","up_to_seq":0}`)); err != nil {
			break
		}
	}
	waitFor(t, "the frame-rate refusal to be counted", func() bool {
		return metric(t, h, "marconi_quota_refusals_total", "quota", "frames_per_second") == 1
	})
}
