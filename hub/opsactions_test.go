package hub_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
)

func TestOpsPendingSignalsOfASession(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	alice := register(t, h, "alice", "claude_code")
	register(t, h, "bob", "claude_code")
	for i := 1; i <= 3; i++ {
		send(t, h, alice, "bob", i)
	}
	st, r := call(t, "GET", h.URL+"/v1/ops/sessions/t1/p1/bob/signals?limit=2", h.AdminToken, nil)
	if st != 200 || r["total"] != float64(3) {
		t.Fatalf("pending: %d %v", st, r)
	}
	sigs := r["signals"].([]any)
	if len(sigs) != 2 || sigs[0].(map[string]any)["seq"] != float64(1) || sigs[1].(map[string]any)["from_session"] != "alice" {
		t.Fatalf("pending signals: %v", sigs)
	}
	for _, tt := range []struct {
		url, cred string
		status    int
		code      string
	}{
		{"/v1/ops/sessions/t1/p1/nobody/signals", h.AdminToken, 404, "not_found"},
		{"/v1/ops/sessions/t1/p1/bob/signals?limit=0", h.AdminToken, 400, "invalid_field"},
		{"/v1/ops/sessions/t1/p1/bob/signals?limit=201", h.AdminToken, 400, "invalid_field"},
		{"/v1/ops/sessions/t1/p1/bob/signals", alice.Token, 401, "unauthorized"},
	} {
		if st, r := call(t, "GET", h.URL+tt.url, tt.cred, nil); st != tt.status || errCode(r) != tt.code {
			t.Errorf("%s: %d %v, want %d %s", tt.url, st, r, tt.status, tt.code)
		}
	}
}

func TestOpsDisconnectAndDeregister(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	bob := register(t, h, "bob", "claude_code")
	carol := register(t, h, "carol", "claude_code")
	c, _ := dial(t, h, bob)

	st, r := call(t, "POST", h.URL+"/v1/ops/sessions/t1/p1/bob/disconnect", h.AdminToken, nil)
	if st != 200 || r["disconnected"] != true {
		t.Fatalf("disconnect: %d %v", st, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := c.Read(ctx); closeStatus(err) != 1012 {
		t.Fatalf("bob's WebSocket after the operator's disconnect: %v, want 1012", err)
	}
	waitFor(t, "the operator disconnect to be counted", func() bool {
		return metric(t, h, "marconi_ws_disconnects_total", "reason", "operator") == 1
	})
	// Nothing attached: nothing to close, and the session stays.
	if st, r := call(t, "POST", h.URL+"/v1/ops/sessions/t1/p1/carol/disconnect", h.AdminToken, nil); st != 200 || r["disconnected"] != false {
		t.Fatalf("disconnect of an unattached session: %d %v", st, r)
	}

	c2, _ := dial(t, h, bob)
	if st, _ := call(t, "DELETE", h.URL+"/v1/ops/sessions/t1/p1/bob", h.AdminToken, nil); st != http.StatusNoContent {
		t.Fatalf("deregister: %d", st)
	}
	if _, _, err := c2.Read(ctx); closeStatus(err) != 4410 {
		t.Fatalf("bob's WebSocket after the operator's deregister: %v, want 4410", err)
	}
	if rs := routeState(t, h, "bob"); rs["route_state"] != "not_registered" {
		t.Fatalf("bob after deregister: %v", rs["route_state"])
	}
	if st, r := call(t, "POST", h.URL+"/v1/heartbeat", bob.Token, nil); st != 410 {
		t.Fatalf("bob's token after deregister: %d %v", st, r)
	}
	for _, tt := range []struct{ method, url, cred string }{
		{"DELETE", "/v1/ops/sessions/t1/p1/bob", h.AdminToken},
		{"POST", "/v1/ops/sessions/t1/p1/bob/disconnect", h.AdminToken},
		{"DELETE", "/v1/ops/sessions/t1/other/carol", h.AdminToken},
	} {
		if st, r := call(t, tt.method, h.URL+tt.url, tt.cred, nil); st != 404 || errCode(r) != "not_found" {
			t.Errorf("%s %s: %d %v, want 404 not_found", tt.method, tt.url, st, r)
		}
	}
	if st, _ := call(t, "DELETE", h.URL+"/v1/ops/sessions/t1/p1/carol", carol.Token, nil); st != 401 {
		t.Errorf("deregister with a session token: %d, want 401", st)
	}
	if rs := routeState(t, h, "carol"); rs["route_state"] == "not_registered" {
		t.Fatal("a refused deregister deleted carol")
	}
}

// TestSelfhealHistoryFromTheHub: the hub keeps the self-heal outcomes per
// bucket, so the dashboard shows them without having sampled them itself.
func TestSelfhealHistoryFromTheHub(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{SelfhealHistoryBucket: 10 * time.Millisecond}})
	alice := register(t, h, "alice", "claude_code")
	register(t, h, "bob", "claude_code") // no WebSocket: route_without_queue
	r := send(t, h, alice, "bob", "hi")
	if r["selfheal_outcome"] != "attempted" {
		t.Fatalf("send: %v", r)
	}
	sumBuckets := func(hist map[string]any, outcome string) float64 {
		var n float64
		for _, b := range hist["buckets"].([]any) {
			n += b.(map[string]any)["counts"].(map[string]any)[outcome].(float64)
		}
		return n
	}
	var hist map[string]any
	waitFor(t, "the attempt in the history", func() bool {
		var st int
		st, hist = call(t, "GET", h.URL+"/v1/ops/selfheal/history", h.AdminToken, nil)
		return st == 200 && len(hist["buckets"].([]any)) > 0 && sumBuckets(hist, "attempted") >= 1
	})
	if hist["totals"].(map[string]any)["attempted"].(float64) < 1 || hist["instance_id"] != "test-1" || hist["enabled"] != true {
		t.Fatalf("history: %v", hist)
	}
	// The history is bounded: older buckets fall off.
	waitFor(t, "the history to fill", func() bool {
		_, hist = call(t, "GET", h.URL+"/v1/ops/selfheal/history", h.AdminToken, nil)
		return len(hist["buckets"].([]any)) == 20 && sumBuckets(hist, "attempted") == 0
	})
	if st, _ := call(t, "GET", h.URL+"/v1/ops/selfheal/history", alice.Token, nil); st != 401 {
		t.Errorf("history with a session token: %d", st)
	}
}
