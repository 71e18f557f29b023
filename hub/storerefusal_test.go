package hub_test

import (
	"testing"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// TestStoreRefusals: what the store refuses inside a send reaches the client
// as a clear 4xx, on both stores, and nothing is stored.
func TestStoreRefusals(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) sessionstore.Store
	}{
		{"memory", func(*testing.T) sessionstore.Store { return memstore.New() }},
		{"postgres", func(t *testing.T) sessionstore.Store { return pgStore(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := hubtest.Start(t, hubtest.Options{Store: tc.store(t), Config: hub.Config{
				StoreQuotas: sessionstore.Limits{PendingPerRecipient: 2, PendingBytesPerProject: 40},
			}})
			alice := register(t, h, "alice", "headless_cc")
			bob := register(t, h, "bob", "headless_cc")
			carol := register(t, h, "carol", "headless_cc")
			bobKey := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
			post := func(from agent, body string) (int, map[string]any) {
				t.Helper()
				return call(t, "POST", h.URL+"/v1/signals", from.Token, body)
			}

			// A NUL in the idempotency key is the client's error, not the store's.
			st, r := post(alice, `{"to_session":"bob","payload":1,"idempotency_key":"a\u0000b"}`)
			if st != 400 || errCode(r) != "invalid_field" {
				t.Fatalf("idempotency_key with a NUL: %d %v, want 400 invalid_field", st, r)
			}
			if n, err := h.Store.CountPending(t.Context(), bobKey); err != nil || n != 0 {
				t.Fatalf("bob has %d pending (%v) after a refused send, want 0", n, err)
			}

			// Pending signals per recipient: two fit, the third is refused.
			for i := range 2 {
				if st, r := post(alice, `{"to_session":"bob","payload":1}`); st != 200 || r["seq"] != float64(i+1) {
					t.Fatalf("send %d: %d %v", i+1, st, r)
				}
			}
			st, r = post(alice, `{"to_session":"bob","payload":1}`)
			if st != 429 || errCode(r) != "quota_exceeded" {
				t.Fatalf("third pending signal: %d %v, want 429 quota_exceeded", st, r)
			}
			if st, r := call(t, "POST", h.URL+"/v1/signals/ack", bob.Token, map[string]any{"up_to_seq": 2}); st != 200 || r["acked"] != float64(2) {
				t.Fatalf("ack: %d %v", st, r)
			}
			if st, r := post(alice, `{"to_session":"bob","payload":1}`); st != 200 || r["seq"] != float64(3) {
				t.Fatalf("send after the ack: %d %v, want seq 3 (the refused one took none)", st, r)
			}

			// Pending bytes per project: 1 byte is pending; 39 more fit, 40 do not.
			big := `"` + "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" + `"` // 39 bytes
			if st, r := post(alice, `{"to_session":"carol","payload":`+big+`}`); st != 200 {
				t.Fatalf("send up to the byte quota: %d %v", st, r)
			}
			st, r = post(carol, `{"to_session":"alice","payload":1}`)
			if st != 429 || errCode(r) != "quota_exceeded" {
				t.Fatalf("send past the byte quota: %d %v, want 429 quota_exceeded", st, r)
			}
		})
	}
}
