package hub_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// bothStores opens, by name, a fresh memory store or a pgstore on a schema
// of its own (which skips without MARCONI_TEST_DATABASE_URL).
func bothStores() map[string]func(t *testing.T) sessionstore.Store {
	return map[string]func(t *testing.T) sessionstore.Store{
		"memstore": func(*testing.T) sessionstore.Store { return memstore.New() },
		"postgres": func(t *testing.T) sessionstore.Store { return pgStore(t) },
	}
}

// TestUntrustedStringsAreValidated (issue 12.3): every string that would
// reach the store is checked first (NUL, control characters, length,
// pattern) and refused with a 400 naming the field, on the memory store and
// on Postgres alike; nothing is stored and no request ends in a 500.
func TestUntrustedStringsAreValidated(t *testing.T) {
	for name, open := range bothStores() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := hubtest.Start(t, hubtest.Options{Store: open(t)})
			alice := register(t, h, "alice", "claude_code")
			register(t, h, "bob", "claude_code")
			tests := []struct {
				name, method, path, cred string
				body                     string
				status                   int
				code, field              string
			}{
				{"idempotency_key with NUL", "POST", "/v1/signals", alice.Token, `{"to_session":"bob","idempotency_key":"a\u0000b"}`, 400, "invalid_field", "idempotency_key"},
				{"idempotency_key with a control character", "POST", "/v1/signals", alice.Token, `{"to_session":"bob","idempotency_key":"a\u001bb"}`, 400, "invalid_field", "idempotency_key"},
				{"idempotency_key too long", "POST", "/v1/signals", alice.Token, `{"to_session":"bob","idempotency_key":"` + strings.Repeat("é", 129) + `"}`, 400, "invalid_field", "idempotency_key"},
				{"kind with NUL", "POST", "/v1/signals", alice.Token, `{"to_session":"bob","kind":"a\u0000"}`, 400, "invalid_field", "kind"},
				{"to_session with NUL", "POST", "/v1/signals", alice.Token, `{"to_session":"bob\u0000"}`, 400, "invalid_field", "to_session"},
				{"session_id with NUL", "POST", "/v1/sessions", h.APIKey, `{"session_id":"x\u0000","surface":"codex"}`, 400, "invalid_field", "session_id"},
				{"client_id with NUL", "POST", "/v1/sessions", h.APIKey, `{"surface":"codex","client_id":"c\u0000"}`, 400, "invalid_field", "client_id"},
				{"client_id too long", "POST", "/v1/sessions", h.APIKey, `{"surface":"codex","client_id":"` + strings.Repeat("c", 129) + `"}`, 400, "invalid_field", "client_id"},
				{"surface with NUL", "POST", "/v1/sessions", h.APIKey, `{"surface":"console_\u0000"}`, 400, "invalid_surface", "surface"},
				{"runtime_mode with NUL", "POST", "/v1/sessions", h.APIKey, `{"surface":"codex","runtime_mode":"sticky\u0000"}`, 400, "invalid_runtime_mode", "runtime_mode"},
				{"reason with NUL", "POST", "/v1/placement-mismatch", alice.Token, `{"reason":"a\u0000"}`, 400, "invalid_field", "reason"},
				{"reason with a newline (log forging)", "POST", "/v1/placement-mismatch", alice.Token, `{"reason":"ok\nlevel=ERROR msg=forged"}`, 400, "invalid_field", "reason"},
				{"api key tenant with NUL", "POST", "/v1/ops/api_keys", h.AdminToken, `{"tenant_id":"t\u0000","project_id":"p"}`, 400, "invalid_field", "tenant_id"},
				{"route_state tenant_id NUL", "GET", "/v1/ops/route_state?tenant_id=%00", h.AdminToken, "", 400, "invalid_field", "tenant_id"},
				{"route_state project_id invalid UTF-8", "GET", "/v1/ops/route_state?project_id=%ff", h.AdminToken, "", 400, "invalid_field", "project_id"},
				{"route_state tenant_id too long", "GET", "/v1/ops/route_state?tenant_id=" + strings.Repeat("t", 129), h.AdminToken, "", 400, "invalid_field", "tenant_id"},
				{"route_state path with NUL", "GET", "/v1/ops/route_state/t1/p1/a%00b", h.AdminToken, "", 404, "not_found", "route_state"},
			}
			for _, tt := range tests {
				var body any
				if tt.body != "" {
					body = tt.body
				}
				st, r := call(t, tt.method, h.URL+tt.path, tt.cred, body)
				e, _ := r["error"].(map[string]any)
				msg, _ := e["message"].(string)
				if st != tt.status || errCode(r) != tt.code || !strings.Contains(msg, tt.field) {
					t.Errorf("%s: got %d %v, want %d %s naming %s", tt.name, st, r, tt.status, tt.code, tt.field)
				}
			}
			if n, err := h.Store.CountPending(t.Context(), sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}); err != nil || n != 0 {
				t.Errorf("bob has %d pending (%v), want 0", n, err)
			}
			if n := countSessions(t, h, "t1", "p1"); n != 2 {
				t.Errorf("%d sessions, want 2", n)
			}
			// A NUL inside the JSON payload is data, kept byte for byte.
			if r := send(t, h, alice, "bob", map[string]any{"x": "a\u0000b"}); r["seq"] != float64(1) {
				t.Errorf("payload holding \\u0000: %v", r)
			}
			if st, _ := call(t, "GET", h.URL+"/readyz", "", nil); st != http.StatusOK {
				t.Fatalf("readyz after hostile strings: %d", st)
			}
		})
	}
}
