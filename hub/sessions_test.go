package hub_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
)

func TestRegisterCreatesAndResumes(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	st, r := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": "alice", "surface": "claude_code"})
	if st != http.StatusCreated {
		t.Fatalf("register: %d %v", st, r)
	}
	for _, f := range []string{"session_id", "token", "tenant_id", "project_id", "surface", "runtime_mode", "runtime_mode_source", "instance_id", "registered_at", "expires_at", "heartbeat_interval_seconds"} {
		if _, ok := r[f]; !ok {
			t.Errorf("register answer lacks %s: %v", f, r)
		}
	}
	if r["runtime_mode"] != "stateless" || r["runtime_mode_source"] != "default" || r["instance_url"] != nil {
		t.Errorf("default placement = %v/%v url %v; want stateless/default url null", r["runtime_mode"], r["runtime_mode_source"], r["instance_url"])
	}
	if r["tenant_id"] != "t1" || r["project_id"] != "p1" {
		t.Errorf("owner = %v/%v", r["tenant_id"], r["project_id"])
	}
	old := r["token"].(string)

	// Registering the live id without its token is refused, and changes nothing.
	st, r2 := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": "alice", "surface": "codex"})
	if st != http.StatusForbidden || errCode(r2) != "forbidden" {
		t.Fatalf("re-register without token: %d %v", st, r2)
	}
	// A wrong token is refused too.
	st, r2 = call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": "alice", "surface": "claude_code"}, "X-Marconi-Session-Token", "mst_wrong")
	if st != http.StatusForbidden {
		t.Fatalf("resume with wrong token: %d %v", st, r2)
	}
	// Resume with the current token: 200, a new token, the old one dead.
	st, r3 := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": "alice", "surface": "claude_code", "runtime_mode": "sticky"}, "X-Marconi-Session-Token", old)
	if st != http.StatusOK {
		t.Fatalf("resume: %d %v", st, r3)
	}
	if r3["token"] == old || r3["runtime_mode"] != "stateless" || r3["runtime_mode_source"] != "default" {
		t.Errorf("resume: token reused or stored mode not kept: %v", r3)
	}
	if st, r := call(t, "POST", h.URL+"/v1/heartbeat", old, nil); st != http.StatusGone || errCode(r) != "session_expired" {
		t.Errorf("old token after resume: %d %v, want 410 session_expired", st, r)
	}
	if st, r := call(t, "POST", h.URL+"/v1/heartbeat", r3["token"].(string), nil); st != http.StatusOK {
		t.Errorf("new token: %d %v", st, r)
	}
}

func TestRegisterServerChoosesID(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	st, r := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"surface": "console_ops"})
	if st != http.StatusCreated || len(r["session_id"].(string)) != 36 {
		t.Fatalf("register without id: %d %v", st, r)
	}
}

func TestRegisterBadInput(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	long := strings.Repeat("a", 129)
	tests := []struct {
		name   string
		body   any
		status int
		code   string
	}{
		{"not json", "{nope", 400, "invalid_json"},
		{"array", `[1]`, 400, "invalid_json"},
		{"trailing data", `{"surface":"codex"} {}`, 400, "invalid_json"},
		{"empty", ``, 400, "invalid_json"},
		{"wrong type", `{"surface": 7}`, 400, "invalid_field"},
		{"wrong hints type", `{"surface": "codex", "hints": {"local_state": "yes"}}`, 400, "invalid_field"},
		{"no surface", `{}`, 400, "invalid_surface"},
		{"unknown surface", `{"surface":"vim"}`, 400, "invalid_surface"},
		{"console without name", `{"surface":"console_"}`, 400, "invalid_surface"},
		{"over-long id", map[string]any{"session_id": long, "surface": "codex"}, 400, "invalid_field"},
		{"bad id chars", map[string]any{"session_id": "a b", "surface": "codex"}, 400, "invalid_field"},
		{"reserved soft_sticky", `{"surface":"codex","runtime_mode":"soft_sticky"}`, 400, "reserved_runtime_mode"},
		{"reserved pinned", `{"surface":"codex","runtime_mode":"pinned"}`, 400, "reserved_runtime_mode"},
		{"reserved hybrid", `{"surface":"codex","runtime_mode":"hybrid"}`, 400, "reserved_runtime_mode"},
		{"unknown mode", `{"surface":"codex","runtime_mode":"roaming"}`, 400, "invalid_runtime_mode"},
		{"oversized body", `{"surface":"codex","client_id":"` + strings.Repeat("x", 20000) + `"}`, 413, "payload_too_large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, r := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, tt.body)
			if st != tt.status || errCode(r) != tt.code {
				t.Fatalf("got %d %v, want %d %s", st, r, tt.status, tt.code)
			}
			if msg, _ := r["error"].(map[string]any)["message"].(string); msg == "" {
				t.Errorf("error without message: %v", r)
			}
		})
	}
	// Nothing was stored by any of them.
	sessions, err := h.Store.ListSessions(t.Context(), sessionstore.SessionFilter{}, time.Now())
	if err != nil || len(sessions) != 0 {
		t.Fatalf("bad registrations left %d sessions (%v)", len(sessions), err)
	}
	if st, _ := call(t, "GET", h.URL+"/healthz", "", nil); st != 200 {
		t.Fatalf("hub unhealthy after bad input: %d", st)
	}
}

func TestCredentials(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	a := register(t, h, "alice", "claude_code")
	body := map[string]any{"surface": "codex"}
	for name, cred := range map[string]string{
		"missing":       "",
		"unknown key":   "mak_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
		"session token": a.Token,
		"admin token":   h.AdminToken,
	} {
		if st, r := call(t, "POST", h.URL+"/v1/sessions", cred, body); st != 401 || errCode(r) != "unauthorized" {
			t.Errorf("register with %s: %d %v, want 401 unauthorized", name, st, r)
		}
	}
	for name, cred := range map[string]string{"missing": "", "api key": h.APIKey, "admin token": h.AdminToken, "garbage": "xyz"} {
		if st, r := call(t, "POST", h.URL+"/v1/heartbeat", cred, nil); st != 401 || errCode(r) != "unauthorized" {
			t.Errorf("heartbeat with %s: %d %v, want 401", name, st, r)
		}
	}
	for name, cred := range map[string]string{"missing": "", "api key": h.APIKey, "session token": a.Token, "wrong admin": "madm_nope"} {
		if st, r := call(t, "GET", h.URL+"/v1/ops/route_state", cred, nil); st != 401 || errCode(r) != "unauthorized" {
			t.Errorf("ops with %s: %d %v, want 401", name, st, r)
		}
	}
	// A well-formed token of no session: 410.
	if st, r := call(t, "POST", h.URL+"/v1/heartbeat", "mst_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", nil); st != 410 || errCode(r) != "session_expired" {
		t.Errorf("unknown session token: %d %v, want 410", st, r)
	}
}

func TestHeartbeatExtendsAndExpiryGives410(t *testing.T) {
	clock := hubtest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	h := hubtest.Start(t, hubtest.Options{Now: clock.Now})
	a := register(t, h, "alice", "claude_code")
	clock.Advance(50 * time.Minute)
	st, r := call(t, "POST", h.URL+"/v1/heartbeat", a.Token, nil)
	if st != 200 || r["route_state"] != "route_without_queue" || r["session_id"] != "alice" {
		t.Fatalf("heartbeat: %d %v", st, r)
	}
	if want := clock.Now().Add(time.Hour).Format(time.RFC3339); r["expires_at"] != want {
		t.Errorf("expires_at = %v, want %s", r["expires_at"], want)
	}
	clock.Advance(59 * time.Minute) // within the extended TTL
	if st, _ := call(t, "POST", h.URL+"/v1/heartbeat", a.Token, nil); st != 200 {
		t.Fatalf("heartbeat within TTL: %d", st)
	}
	clock.Advance(61 * time.Minute)
	if st, r := call(t, "POST", h.URL+"/v1/heartbeat", a.Token, nil); st != 410 || errCode(r) != "session_expired" {
		t.Fatalf("heartbeat after TTL: %d %v", st, r)
	}
	// The id is free again.
	register(t, h, "alice", "claude_code")
}

func TestDeregister(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	a := register(t, h, "alice", "claude_code")
	c, _ := dial(t, h, a)
	req, _ := http.NewRequest("DELETE", h.URL+"/v1/session", nil)
	req.Header.Set("Authorization", "Bearer "+a.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 204 {
		t.Fatalf("delete: %v %v", resp, err)
	}
	resp.Body.Close()
	_, _, err = c.Read(t.Context())
	if code := closeStatus(err); code != 4410 {
		t.Fatalf("websocket closed with %d (%v), want 4410", code, err)
	}
	if st, _ := call(t, "POST", h.URL+"/v1/heartbeat", a.Token, nil); st != 410 {
		t.Fatalf("heartbeat after delete: %d, want 410", st)
	}
	if rs := routeState(t, h, "alice"); rs["route_state"] != "not_registered" {
		t.Fatalf("route_state after delete: %v", rs["route_state"])
	}
}

func TestOpsCreateAPIKey(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	st, r := call(t, "POST", h.URL+"/v1/ops/api_keys", h.AdminToken, map[string]any{"tenant_id": "t2", "project_id": "p9"})
	if st != 201 {
		t.Fatalf("create key: %d %v", st, r)
	}
	key := r["api_key"].(string)
	st, reg := call(t, "POST", h.URL+"/v1/sessions", key, map[string]any{"surface": "codex"})
	if st != 201 || reg["tenant_id"] != "t2" || reg["project_id"] != "p9" {
		t.Fatalf("register with new key: %d %v", st, reg)
	}
	if st, r := call(t, "POST", h.URL+"/v1/ops/api_keys", h.AdminToken, map[string]any{"tenant_id": "t2"}); st != 400 || errCode(r) != "invalid_field" {
		t.Fatalf("create key without project: %d %v", st, r)
	}
}

func TestHealthAndReady(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	if st, _ := call(t, "GET", h.URL+"/readyz", "", nil); st != 200 {
		t.Fatalf("readyz: %d", st)
	}
	h.Server.SetDraining()
	if st, r := call(t, "GET", h.URL+"/readyz", "", nil); st != 503 || errCode(r) != "draining" {
		t.Fatalf("readyz draining: %d %v", st, r)
	}
	if st, _ := call(t, "GET", h.URL+"/healthz", "", nil); st != 200 {
		t.Fatalf("healthz draining: %d", st)
	}
	if st, r := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"surface": "codex"}); st != 503 || errCode(r) != "draining" {
		t.Fatalf("register while draining: %d %v", st, r)
	}
}

// TestRegisterAnswerIsTheWireType: the answer to a registration has exactly
// the fields of marconi.SessionAnswer, the type the Go client reads it
// with, so that neither side has a field the other does not know.
func TestRegisterAnswerIsTheWireType(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	st, r := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": "alice", "surface": "claude_code", "runtime_mode": "sticky"})
	if st != http.StatusCreated {
		t.Fatalf("register: %d %v", st, r)
	}
	raw, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var a marconi.SessionAnswer
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		t.Fatalf("the answer %s is not a marconi.SessionAnswer: %v", raw, err)
	}
	back, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(back, &fields); err != nil {
		t.Fatal(err)
	}
	for f := range fields {
		if _, ok := r[f]; !ok {
			t.Errorf("the answer lacks %s, which marconi.SessionAnswer names: %s", f, raw)
		}
	}
	if a.SessionID != "alice" || a.Token == "" || a.Surface != marconi.SurfaceClaudeCode || a.RuntimeMode != marconi.RuntimeSticky || a.HeartbeatIntervalSeconds <= 0 {
		t.Errorf("answer read as %+v", a)
	}
}

// TestHeartbeatAnswersTheExpiryStored: the expires_at a heartbeat answers is
// the one the store keeps (read back by the operators' route state), to the
// microsecond the stores keep, not the clock's nanoseconds.
func TestHeartbeatAnswersTheExpiryStored(t *testing.T) {
	for name, open := range bothStores() {
		t.Run(name, func(t *testing.T) {
			clock := hubtest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 123456789, time.UTC))
			h := hubtest.Start(t, hubtest.Options{Store: open(t), Now: clock.Now})
			a := register(t, h, "alice", "codex")
			clock.Advance(time.Minute)
			st, r := call(t, "POST", h.URL+"/v1/heartbeat", a.Token, nil)
			if st != 200 {
				t.Fatalf("heartbeat: %d %v", st, r)
			}
			stored, _ := routeState(t, h, "alice")["store"].(map[string]any)
			if stored == nil || r["expires_at"] != stored["expires_at"] {
				t.Fatalf("heartbeat answered expires_at %v, the store keeps %v", r["expires_at"], stored["expires_at"])
			}
		})
	}
}
