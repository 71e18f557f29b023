package hub_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/marconihub/marconi/hub/hubtest"
)

// TestDotIDsAreRefused (issue 19, item 7): "." and ".." are never a
// session id, a tenant or a project (browsers and proxies normalise such
// path segments away, so an operator could neither see nor end such a
// session): 400 invalid_field naming the field wherever one is given, and
// nothing is stored.
func TestDotIDsAreRefused(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	alice := register(t, h, "alice", "claude_code")
	for _, id := range []string{".", ".."} {
		for _, tc := range []struct {
			name, method, path, cred string
			body                     map[string]any
			field                    string
		}{
			{"registration", "POST", "/v1/sessions", h.APIKey, map[string]any{"session_id": id, "surface": "claude_code"}, "session_id"},
			{"send", "POST", "/v1/signals", alice.Token, map[string]any{"to_session": id, "payload": 1}, "to_session"},
			{"api key tenant", "POST", "/v1/ops/api_keys", h.AdminToken, map[string]any{"tenant_id": id, "project_id": "p"}, "tenant_id"},
			{"api key project", "POST", "/v1/ops/api_keys", h.AdminToken, map[string]any{"tenant_id": "t", "project_id": id}, "project_id"},
			{"route_state filter", "GET", "/v1/ops/route_state?tenant_id=" + url.QueryEscape(id), h.AdminToken, nil, "tenant_id"},
		} {
			st, r := call(t, tc.method, h.URL+tc.path, tc.cred, tc.body)
			msg, _ := r["error"].(map[string]any)["message"].(string)
			if st != http.StatusBadRequest || errCode(r) != "invalid_field" || !strings.Contains(msg, tc.field) {
				t.Errorf("%s %q: %d %v, want 400 invalid_field naming %s", tc.name, id, st, r, tc.field)
			}
		}
	}
	st, list := call(t, "GET", h.URL+"/v1/ops/route_state?tenant_id=t1&project_id=p1", h.AdminToken, nil)
	if sessions, _ := list["sessions"].([]any); st != http.StatusOK || len(sessions) != 1 {
		t.Fatalf("sessions after the refusals: %d %v, want alice alone", st, list)
	}
	// An id that merely contains dots is an id like any other.
	register(t, h, "a..b", "claude_code")
	register(t, h, "...", "claude_code")
}
