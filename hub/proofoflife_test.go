package hub_test

import (
	"testing"
	"time"

	"github.com/marconihub/marconi/hub/hubtest"
)

// TestAnyAuthenticatedCallIsProofOfLife: last_verb_at moves with every
// authenticated session call, a refused one included (API.md: "any
// authenticated session call"), coalesced to one write per touch interval.
func TestAnyAuthenticatedCallIsProofOfLife(t *testing.T) {
	clock := hubtest.NewClock(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))
	h := hubtest.Start(t, hubtest.Options{Now: clock.Now})
	a := register(t, h, "alice", "claude_code")
	if v := routeState(t, h, "alice")["store"].(map[string]any)["last_verb_at"]; v != nil {
		t.Fatalf("last_verb_at before any call = %v", v)
	}
	clock.Advance(time.Minute)
	if st, r := call(t, "POST", h.URL+"/v1/signals", a.Token, map[string]any{"to_session": "nobody"}); st != 404 {
		t.Fatalf("send to nobody: %d %v", st, r)
	}
	want := clock.Now().Format(time.RFC3339)
	if v := routeState(t, h, "alice")["store"].(map[string]any)["last_verb_at"]; v != want {
		t.Fatalf("last_verb_at after a refused send = %v, want %s", v, want)
	}
	// Within the touch interval (5 s) a second call writes nothing.
	clock.Advance(2 * time.Second)
	call(t, "GET", h.URL+"/v1/signals", a.Token, nil)
	if v := routeState(t, h, "alice")["store"].(map[string]any)["last_verb_at"]; v != want {
		t.Fatalf("last_verb_at within the touch interval = %v, want still %s", v, want)
	}
	clock.Advance(5 * time.Second)
	call(t, "GET", h.URL+"/v1/signals", a.Token, nil)
	if v := routeState(t, h, "alice")["store"].(map[string]any)["last_verb_at"]; v != clock.Now().Format(time.RFC3339) {
		t.Fatalf("last_verb_at after the interval = %v, want %s", v, clock.Now().Format(time.RFC3339))
	}
	clock.Advance(5 * time.Second)
	if st, r := call(t, "POST", h.URL+"/v1/signals/ack", a.Token, map[string]any{"up_to_seq": 0}); st != 200 {
		t.Fatalf("ack: %d %v", st, r)
	}
	if v := routeState(t, h, "alice")["store"].(map[string]any)["last_verb_at"]; v != clock.Now().Format(time.RFC3339) {
		t.Fatalf("last_verb_at after an ack = %v, want %s", v, clock.Now().Format(time.RFC3339))
	}
}
