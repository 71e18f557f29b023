package hub_test

import (
	"net/http"
	"testing"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/hub/hubtest"
)

// X-Marconi-Project is for the balancer: the hub never reads it. A session
// of t1/p1 that names another project in it still registers into, sends
// within and sees only its own project (docs/api.md, "Credentials").
func TestProjectHeaderChangesNothing(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	st, r := call(t, "POST", h.URL+"/v1/ops/api_keys", h.AdminToken, map[string]any{"tenant_id": "t2", "project_id": "p2"})
	if st != http.StatusCreated {
		t.Fatalf("create key: %d %v", st, r)
	}
	other := r["api_key"].(string)
	if st, r := call(t, "POST", h.URL+"/v1/sessions", other, map[string]any{"session_id": "theirs", "surface": "claude_code"}); st != http.StatusCreated {
		t.Fatalf("register t2/p2's session: %d %v", st, r)
	}

	forged := []string{marconi.HeaderProject, "t2/p2"}
	st, reg := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": "mine", "surface": "claude_code"}, forged...)
	if st != http.StatusCreated || reg["tenant_id"] != "t1" || reg["project_id"] != "p1" {
		t.Fatalf("register with the key of t1/p1 naming t2/p2: %d %v, want 201 in t1/p1", st, reg)
	}
	token := reg["token"].(string)
	h.Register(t, "peer")
	if st, r := call(t, "POST", h.URL+"/v1/signals", token, map[string]any{"to_session": "theirs", "payload": 1}, forged...); st != http.StatusNotFound || errCode(r) != string(marconi.CodeRecipientNotRegistered) {
		t.Errorf("send to t2/p2's session naming t2/p2: %d %v, want 404 recipient_not_registered", st, r)
	}
	if st, r := call(t, "POST", h.URL+"/v1/signals", token, map[string]any{"to_session": "peer", "payload": 1}, forged...); st != http.StatusOK {
		t.Errorf("send within t1/p1 naming t2/p2: %d %v, want 200", st, r)
	}
	for _, v := range []string{"", "garbage", "t1/p1/extra"} {
		if st, r := call(t, "POST", h.URL+"/v1/heartbeat", token, nil, marconi.HeaderProject, v); st != http.StatusOK {
			t.Errorf("heartbeat with %s %q: %d %v, want 200", marconi.HeaderProject, v, st, r)
		}
	}
}
