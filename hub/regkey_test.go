package hub_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
)

// A registration whose answer was lost is retried with its Idempotency-Key:
// the retry gets the registration's answer with a new token, the lost token
// stops working, and nothing else (another key, no key, after a resume, past
// the window, another project) gets more than the 403 it always got.
func TestRegisterRetryAfterLostAnswer(t *testing.T) {
	clock := hubtest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	apiKey, other := hub.NewAPIKey(), hub.NewAPIKey()
	h := hubtest.Start(t, hubtest.Options{Now: clock.Now, Config: hub.Config{
		SessionTTL: 48 * time.Hour, // outlives the 24 h window
		APIKeys:    map[string]hub.TenantProject{apiKey: {TenantID: "t1", ProjectID: "p1"}, other: {TenantID: "t2", ProjectID: "p2"}},
	}})
	reg := func(key string, hdr ...string) (int, map[string]any) {
		t.Helper()
		if key != "" {
			hdr = append(hdr, "Idempotency-Key", key)
		}
		return call(t, "POST", h.URL+"/v1/sessions", apiKey, map[string]any{"session_id": "alice", "surface": "claude_code"}, hdr...)
	}
	st, first := reg("k-1")
	if st != http.StatusCreated {
		t.Fatalf("register: %d %v", st, first)
	}
	lost := first["token"].(string) // the answer the client never read

	clock.Advance(time.Minute)
	st, retry := reg("k-1")
	if st != http.StatusCreated || retry["token"] == lost || retry["token"] == "" {
		t.Fatalf("retry with the same key: %d %v, want 201 with a new token", st, retry)
	}
	for _, f := range []string{"session_id", "surface", "runtime_mode", "runtime_mode_source", "registered_at"} {
		if retry[f] != first[f] {
			t.Errorf("retry %s = %v, want the registration's %v", f, retry[f], first[f])
		}
	}
	if st, r := call(t, "POST", h.URL+"/v1/heartbeat", lost, nil); st != http.StatusGone {
		t.Errorf("lost token after the retry: %d %v, want 410", st, r)
	}
	// The retry's answer may be lost too: the same key retries again.
	st, again := reg("k-1")
	if st != http.StatusCreated || again["token"] == retry["token"] {
		t.Fatalf("second retry: %d %v", st, again)
	}
	current := again["token"].(string)
	if st, r := call(t, "POST", h.URL+"/v1/heartbeat", retry["token"].(string), nil); st != http.StatusGone {
		t.Errorf("first retry's token after the second: %d %v, want 410", st, r)
	}

	// No hijack: another key, no key, a wrong token with another key.
	for name, hdr := range map[string][]string{
		"another key":               {"Idempotency-Key", "k-2"},
		"no key":                    nil,
		"wrong token, another key":  {"X-Marconi-Session-Token", "mst_wrong", "Idempotency-Key", "k-2"},
		"the key with another case": {"Idempotency-Key", "K-1"},
	} {
		if st, r := reg("", hdr...); st != http.StatusForbidden || errCode(r) != "forbidden" {
			t.Errorf("%s: %d %v, want 403 forbidden", name, st, r)
		}
	}
	// The same key under another project's API key is another session.
	st, r := call(t, "POST", h.URL+"/v1/sessions", other, map[string]any{"session_id": "alice", "surface": "claude_code"}, "Idempotency-Key", "k-1")
	if st != http.StatusCreated || r["tenant_id"] != "t2" {
		t.Fatalf("same id and key in another project: %d %v", st, r)
	}
	if st, r := call(t, "POST", h.URL+"/v1/heartbeat", current, nil); st != http.StatusOK {
		t.Fatalf("current token after the refusals: %d %v", st, r)
	}
	if got := metric(t, h, "marconi_registrations_total", "result", "retried"); got != 2 {
		t.Errorf("retried registrations = %v, want 2", got)
	}

	// Past the window the key no longer retries.
	clock.Advance(24 * time.Hour)
	if st, r := call(t, "POST", h.URL+"/v1/heartbeat", current, nil); st != http.StatusOK {
		t.Fatalf("heartbeat: %d %v", st, r)
	}
	if st, r := reg("k-1"); st != http.StatusForbidden {
		t.Errorf("retry past the window: %d %v, want 403", st, r)
	}

	// A resume makes the token: the registration's key no longer retries.
	st, r = reg("k-3", "X-Marconi-Session-Token", current)
	if st != http.StatusOK {
		t.Fatalf("resume: %d %v", st, r)
	}
	st, r = call(t, "POST", h.URL+"/v1/sessions", apiKey, map[string]any{"session_id": "bob", "surface": "claude_code"}, "Idempotency-Key", "k-b")
	if st != http.StatusCreated {
		t.Fatalf("register bob: %d %v", st, r)
	}
	if st, r := call(t, "POST", h.URL+"/v1/sessions", apiKey, map[string]any{"session_id": "bob", "surface": "claude_code"},
		"X-Marconi-Session-Token", r["token"].(string)); st != http.StatusOK {
		t.Fatalf("resume bob: %d %v", st, r)
	}
	if st, r := call(t, "POST", h.URL+"/v1/sessions", apiKey, map[string]any{"session_id": "bob", "surface": "claude_code"}, "Idempotency-Key", "k-b"); st != http.StatusForbidden {
		t.Errorf("retry after a resume: %d %v, want 403", st, r)
	}
}

func TestRegisterIdempotencyKeyBadInput(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	for name, key := range map[string]string{
		"257 bytes":         strings.Repeat("k", 257),
		"control character": "a\tb",
	} {
		st, r := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": "alice", "surface": "codex"}, "Idempotency-Key", key)
		if st != http.StatusBadRequest || errCode(r) != "invalid_field" || !strings.Contains(r["error"].(map[string]any)["message"].(string), "Idempotency-Key") {
			t.Errorf("%s: %d %v, want 400 invalid_field naming Idempotency-Key", name, st, r)
		}
	}
	st, r := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": "alice", "surface": "codex"}, "Idempotency-Key", strings.Repeat("k", 256))
	if st != http.StatusCreated {
		t.Fatalf("256-byte key: %d %v", st, r)
	}
}

// TestIdempotencyWindowIsConfigurable: MARCONI_IDEMPOTENCY_WINDOW_SECONDS
// bounds the registration retry (and the send's key, signals.Config).
func TestIdempotencyWindowIsConfigurable(t *testing.T) {
	clock := hubtest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	h := hubtest.Start(t, hubtest.Options{Now: clock.Now, Config: hub.Config{IdempotencyWindow: time.Hour, SessionTTL: 48 * time.Hour}})
	reg := func(id string) (int, map[string]any) {
		t.Helper()
		return call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": id, "surface": "claude_code"}, "Idempotency-Key", "k-"+id)
	}
	for _, id := range []string{"within", "past"} {
		if st, r := reg(id); st != http.StatusCreated {
			t.Fatalf("register %s: %d %v", id, st, r)
		}
	}
	clock.Advance(30 * time.Minute)
	if st, r := reg("within"); st != http.StatusCreated {
		t.Errorf("retry 30 min later with a 1 h window: %d %v, want 201", st, r)
	}
	clock.Advance(time.Hour)
	if st, r := reg("past"); st != http.StatusForbidden {
		t.Errorf("retry 90 min later with a 1 h window: %d %v, want 403", st, r)
	}
}
