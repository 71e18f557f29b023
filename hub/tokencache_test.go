package hub_test

import (
	"net/http"
	"testing"

	"github.com/marconihub/marconi/sessionstore"
)

// TestTokenCacheNeverAuthorisesAStaleToken: instance b caches alice's token
// while she sends through it; a resume, then a deregistration, on instance a
// must stop the old token at once on b, with nothing stored.
func TestTokenCacheNeverAuthorisesAStaleToken(t *testing.T) {
	t.Parallel()
	p := startPair(t, pairOptions{sweepB: noSweep})
	alice := register(t, p.a, "alice", "headless_cc")
	register(t, p.a, "bob", "headless_cc")
	bob := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	for range 3 { // b now has alice's token cached
		send(t, p.b, alice, "bob", "cached")
	}

	// Resume on a: the old token stops working on b too.
	st, r := call(t, "POST", p.a.URL+"/v1/sessions", p.a.APIKey,
		map[string]any{"session_id": "alice", "surface": "headless_cc"}, "X-Marconi-Session-Token", alice.Token)
	if st != http.StatusOK {
		t.Fatalf("resume on a: %d %v", st, r)
	}
	rotated := agent{ID: "alice", Token: r["token"].(string)}
	for range 2 {
		st, r = call(t, "POST", p.b.URL+"/v1/signals", alice.Token, map[string]any{"to_session": "bob", "payload": "stale"})
		if st != http.StatusGone || errCode(r) != "session_expired" {
			t.Fatalf("send with the rotated-out token through b: %d %v, want 410 session_expired", st, r)
		}
	}
	if r := send(t, p.b, rotated, "bob", "fresh"); r["seq"] != float64(4) {
		t.Fatalf("send with the new token: seq %v, want 4 (the refused sends stored nothing)", r["seq"])
	}

	// Deregistered on a: the current token stops on b.
	if st, r := call(t, "DELETE", p.a.URL+"/v1/session", rotated.Token, nil); st != http.StatusNoContent {
		t.Fatalf("deregister on a: %d %v", st, r)
	}
	st, r = call(t, "POST", p.b.URL+"/v1/signals", rotated.Token, map[string]any{"to_session": "bob", "payload": "gone"})
	if st != http.StatusGone || errCode(r) != "session_expired" {
		t.Fatalf("send after deregistration on a, through b: %d %v, want 410 session_expired", st, r)
	}
	if n, err := p.storeB.CountPending(t.Context(), bob); err != nil || n != 4 {
		t.Fatalf("bob has %d pending (%v), want 4", n, err)
	}
}
