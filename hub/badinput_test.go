package hub_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
)

// TestSendBadInput: every malformed send gets its documented code, nothing
// is stored or delivered, and the hub stays healthy.
func TestSendBadInput(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{MaxPayloadBytes: 1024}})
	alice := register(t, h, "alice", "claude_code")
	register(t, h, "bob", "claude_code")
	st, other := call(t, "POST", h.URL+"/v1/ops/api_keys", h.AdminToken, map[string]any{"tenant_id": "t2", "project_id": "p1"})
	if st != 201 {
		t.Fatalf("second tenant key: %d %v", st, other)
	}
	call(t, "POST", h.URL+"/v1/sessions", other["api_key"].(string), map[string]any{"session_id": "carol", "surface": "claude_code"})

	tests := []struct {
		name   string
		cred   string
		body   any
		status int
		code   string
	}{
		{"not json", alice.Token, `{"to_session":`, 400, "invalid_json"},
		{"array", alice.Token, `[{"to_session":"bob"}]`, 400, "invalid_json"},
		{"trailing data", alice.Token, `{"to_session":"bob"} x`, 400, "invalid_json"},
		{"to_session a number", alice.Token, `{"to_session": 5}`, 400, "invalid_field"},
		{"kind a number", alice.Token, `{"to_session":"bob","kind":1}`, 400, "invalid_field"},
		{"idempotency_key an object", alice.Token, `{"to_session":"bob","idempotency_key":{}}`, 400, "invalid_field"},
		{"no to_session", alice.Token, `{"payload":1}`, 400, "invalid_field"},
		{"bad to_session", alice.Token, `{"to_session":"b o b"}`, 400, "invalid_field"},
		{"over-long to_session", alice.Token, `{"to_session":"` + strings.Repeat("b", 129) + `"}`, 400, "invalid_field"},
		{"over-long kind", alice.Token, `{"to_session":"bob","kind":"` + strings.Repeat("k", 65) + `"}`, 400, "invalid_field"},
		{"over-long idempotency key", alice.Token, `{"to_session":"bob","idempotency_key":"` + strings.Repeat("i", 257) + `"}`, 400, "invalid_field"},
		{"payload over the limit", alice.Token, `{"to_session":"bob","payload":"` + strings.Repeat("p", 2000) + `"}`, 413, "payload_too_large"},
		{"body far over the limit", alice.Token, `{"to_session":"bob","payload":"` + strings.Repeat("p", 40000) + `"}`, 413, "payload_too_large"},
		{"payload not UTF-8", alice.Token, "{\"to_session\":\"bob\",\"payload\":\"\xff\xfe\"}", 400, "invalid_field"},
		{"unknown recipient", alice.Token, `{"to_session":"nobody"}`, 404, "recipient_not_registered"},
		{"another tenant's session", alice.Token, `{"to_session":"carol"}`, 404, "recipient_not_registered"},
		{"no credential", "", `{"to_session":"bob"}`, 401, "unauthorized"},
		{"API key instead of token", h.APIKey, `{"to_session":"bob"}`, 401, "unauthorized"},
		{"admin token instead of token", h.AdminToken, `{"to_session":"bob"}`, 401, "unauthorized"},
		{"garbage token", "mst_x", `{"to_session":"bob"}`, 410, "session_expired"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, r := call(t, "POST", h.URL+"/v1/signals", tt.cred, tt.body)
			if st != tt.status || errCode(r) != tt.code {
				t.Fatalf("got %d %v, want %d %s", st, r, tt.status, tt.code)
			}
		})
	}
	for _, k := range []sessionstore.Key{{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}, {TenantID: "t2", ProjectID: "p1", SessionID: "carol"}} {
		if n, err := h.Store.CountPending(t.Context(), k); err != nil || n != 0 {
			t.Errorf("%v has %d pending after bad sends (%v), want 0", k, n, err)
		}
	}
	if st, _ := call(t, "GET", h.URL+"/readyz", "", nil); st != http.StatusOK {
		t.Fatalf("hub not ready after bad input: %d", st)
	}
	// And a good send still works, with seq 1: nothing bad took a seq.
	if r := send(t, h, alice, "bob", "ok"); r["seq"] != float64(1) {
		t.Fatalf("first good send got seq %v", r["seq"])
	}
}

func TestOtherEndpointsBadInput(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	bob := register(t, h, "bob", "claude_code")
	tests := []struct {
		name, method, path, cred string
		body                     any
		status                   int
		code                     string
	}{
		{"ack not json", "POST", "/v1/signals/ack", bob.Token, `nope`, 400, "invalid_json"},
		{"ack wrong type", "POST", "/v1/signals/ack", bob.Token, `{"up_to_seq":"3"}`, 400, "invalid_field"},
		{"ack oversized", "POST", "/v1/signals/ack", bob.Token, `{"up_to_seq":1,"x":"` + strings.Repeat("x", 5000) + `"}`, 413, "payload_too_large"},
		{"api key not json", "POST", "/v1/ops/api_keys", h.AdminToken, `{`, 400, "invalid_json"},
		{"api key wrong type", "POST", "/v1/ops/api_keys", h.AdminToken, `{"tenant_id":1,"project_id":"p"}`, 400, "invalid_field"},
		{"api key bad tenant", "POST", "/v1/ops/api_keys", h.AdminToken, `{"tenant_id":"a/b","project_id":"p"}`, 400, "invalid_field"},
		{"route_state malformed path", "GET", "/v1/ops/route_state/t1/p1/" + strings.Repeat("s", 200), h.AdminToken, nil, 404, "not_found"},
		{"heartbeat no credential", "POST", "/v1/heartbeat", "", nil, 401, "unauthorized"},
		{"delete no credential", "DELETE", "/v1/session", "", nil, 401, "unauthorized"},
		{"drain API key", "GET", "/v1/signals", h.APIKey, nil, 401, "unauthorized"},
		{"unknown endpoint", "GET", "/v1/nothing", bob.Token, nil, 404, "not_found"},
		// Under /v1/ops, a path that names no route is the admin's to learn of.
		{"unknown ops endpoint no credential", "GET", "/v1/ops/nothing", "", nil, 401, "unauthorized"},
		{"unknown ops endpoint session token", "GET", "/v1/ops/nothing", bob.Token, nil, 401, "unauthorized"},
		{"unknown ops endpoint", "GET", "/v1/ops/nothing", h.AdminToken, nil, 404, "not_found"},
		{"ops root", "POST", "/v1/ops", h.AdminToken, nil, 404, "not_found"},
		{"ops wrong method", "PUT", "/v1/ops/route_state", "", nil, 401, "unauthorized"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, r := call(t, tt.method, h.URL+tt.path, tt.cred, tt.body)
			if st != tt.status || errCode(r) != tt.code {
				t.Fatalf("got %d %v, want %d %s", st, r, tt.status, tt.code)
			}
		})
	}
}
