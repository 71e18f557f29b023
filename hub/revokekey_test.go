package hub_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/testlog"
)

// An API key made by POST /v1/ops/api_keys can be revoked by
// POST /v1/ops/api_keys/revoke: from then on it registers nothing, a second
// revocation is 404, a key of MARCONI_API_KEYS is refused with what to do
// (and keeps working), and the log names the project, never the key. On the
// memory store and on Postgres.
func TestRevokeAPIKey(t *testing.T) {
	for name, open := range bothStores() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var logs testlog.Buffer
			h := hubtest.Start(t, hubtest.Options{Store: open(t),
				Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
			st, made := call(t, "POST", h.URL+"/v1/ops/api_keys", h.AdminToken, map[string]any{"tenant_id": "t2", "project_id": "p2"})
			if st != http.StatusCreated {
				t.Fatalf("create key: %d %v", st, made)
			}
			key := made["api_key"].(string)
			reg := map[string]any{"surface": "claude_code"}
			if st, r := call(t, "POST", h.URL+"/v1/sessions", key, reg); st != http.StatusCreated {
				t.Fatalf("register with the new key: %d %v", st, r)
			}

			if st, r := call(t, "POST", h.URL+"/v1/ops/api_keys/revoke", h.APIKey, map[string]any{"api_key": key}); st != http.StatusUnauthorized {
				t.Errorf("revoke with an API key: %d %v, want 401", st, r)
			}
			st, r := call(t, "POST", h.URL+"/v1/ops/api_keys/revoke", h.AdminToken, map[string]any{"api_key": key})
			if st != http.StatusOK || r["revoked"] != true || r["tenant_id"] != "t2" || r["project_id"] != "p2" {
				t.Fatalf("revoke: %d %v, want 200 revoked t2/p2", st, r)
			}
			if st, r := call(t, "POST", h.URL+"/v1/sessions", key, reg); st != http.StatusUnauthorized || errCode(r) != "unauthorized" || !strings.Contains(errMessage(r), "revoked") {
				t.Errorf("register with the revoked key: %d %v, want 401 unauthorized saying the key may be revoked", st, r)
			}
			if st, r := call(t, "POST", h.URL+"/v1/ops/api_keys/revoke", h.AdminToken, map[string]any{"api_key": key}); st != http.StatusNotFound || errCode(r) != "not_found" {
				t.Errorf("revoke again: %d %v, want 404 not_found", st, r)
			}
			if st, r := call(t, "POST", h.URL+"/v1/ops/api_keys/revoke", h.AdminToken, map[string]any{}); st != http.StatusBadRequest || errCode(r) != "invalid_field" {
				t.Errorf("revoke without api_key: %d %v, want 400 invalid_field", st, r)
			}
			st, r = call(t, "POST", h.URL+"/v1/ops/api_keys/revoke", h.AdminToken, map[string]any{"api_key": h.APIKey})
			if msg := errMessage(r); st != http.StatusBadRequest || errCode(r) != "invalid_field" || !strings.Contains(msg, "MARCONI_API_KEYS") {
				t.Errorf("revoke a configured key: %d %v, want 400 invalid_field naming MARCONI_API_KEYS", st, r)
			}
			if st, r := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, reg); st != http.StatusCreated {
				t.Errorf("register with the configured key after its refused revocation: %d %v, want 201", st, r)
			}

			text := logs.String()
			if !strings.Contains(text, `"msg":"api key revoked"`) || !strings.Contains(text, `"project_id":"p2"`) {
				t.Errorf("log does not record the revocation:\n%s", text)
			}
			if strings.Contains(text, key) || strings.Contains(text, h.APIKey) {
				t.Errorf("log holds an API key:\n%s", text)
			}
		})
	}
}
