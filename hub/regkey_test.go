package hub_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
)

// regKey returns a registration Idempotency-Key of 128 bits' length
// (docs/api.md): 22 base64url characters, named by tag.
func regKey(tag string) string {
	return tag + strings.Repeat("x", max(0, 22-len(tag)))
}

// TestRegisterRetryAfterLostAnswer: a registration whose answer was lost is
// retried with its Idempotency-Key by the same API key: the retry gets the
// registration's answer with a new token, the lost token stops working,
// and nothing else (another key, no key, another API key of the same
// project, after a resume, past MARCONI_REGISTRATION_RETRY_SECONDS,
// another project) gets more than the 403 it always got. On the memory
// store and on Postgres.
func TestRegisterRetryAfterLostAnswer(t *testing.T) {
	for name, open := range bothStores() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testRetryAfterLostAnswer(t, open(t))
		})
	}
}

func testRetryAfterLostAnswer(t *testing.T, store sessionstore.Store) {
	clock := hubtest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	apiKey, sibling, other := hub.NewAPIKey(), hub.NewAPIKey(), hub.NewAPIKey()
	h := hubtest.Start(t, hubtest.Options{Store: store, Now: clock.Now, Config: hub.Config{
		APIKeys: map[string]hub.TenantProject{
			apiKey:  {TenantID: "t1", ProjectID: "p1"},
			sibling: {TenantID: "t1", ProjectID: "p1"}, // another key of the same project
			other:   {TenantID: "t2", ProjectID: "p2"},
		},
	}})
	reg := func(cred, key string, hdr ...string) (int, map[string]any) {
		t.Helper()
		if key != "" {
			hdr = append(hdr, "Idempotency-Key", key)
		}
		return call(t, "POST", h.URL+"/v1/sessions", cred, map[string]any{"session_id": "alice", "surface": "claude_code"}, hdr...)
	}
	k1 := regKey("k1")
	st, first := reg(apiKey, k1)
	if st != http.StatusCreated {
		t.Fatalf("register: %d %v", st, first)
	}
	lost := first["token"].(string) // the answer the client never read

	clock.Advance(time.Minute)
	st, retry := reg(apiKey, k1)
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
	st, again := reg(apiKey, k1)
	if st != http.StatusCreated || again["token"] == retry["token"] {
		t.Fatalf("second retry: %d %v", st, again)
	}

	// No hijack: another key, no key, a wrong token with another key, the
	// key in another case, the key from another API key of the project.
	for name, try := range map[string]func() (int, map[string]any){
		"another key":                  func() (int, map[string]any) { return reg(apiKey, regKey("k2")) },
		"no key":                       func() (int, map[string]any) { return reg(apiKey, "") },
		"wrong token, another key":     func() (int, map[string]any) { return reg(apiKey, regKey("k2"), "X-Marconi-Session-Token", "mst_wrong") },
		"the key with another case":    func() (int, map[string]any) { return reg(apiKey, strings.ToUpper(k1)) },
		"another API key, same key":    func() (int, map[string]any) { return reg(sibling, k1) },
		"another API key, wrong token": func() (int, map[string]any) { return reg(sibling, k1, "X-Marconi-Session-Token", "mst_wrong") },
	} {
		if st, r := try(); st != http.StatusForbidden || errCode(r) != "forbidden" {
			t.Errorf("%s: %d %v, want 403 forbidden", name, st, r)
		}
	}
	// The same key under another project's API key is another session.
	st, r := reg(other, k1)
	if st != http.StatusCreated || r["tenant_id"] != "t2" {
		t.Fatalf("same id and key in another project: %d %v", st, r)
	}
	if got := metric(t, h, "marconi_registrations_total", "result", "retried"); got != 2 {
		t.Errorf("retried registrations = %v, want 2", got)
	}

	// Past MARCONI_REGISTRATION_RETRY_SECONDS (300 by default) the key no
	// longer retries, even though its token was never used.
	st, r = call(t, "POST", h.URL+"/v1/sessions", apiKey, map[string]any{"session_id": "bob", "surface": "claude_code"}, "Idempotency-Key", regKey("kb"))
	if st != http.StatusCreated {
		t.Fatalf("register bob: %d %v", st, r)
	}
	clock.Advance(5*time.Minute + time.Second)
	if st, r := call(t, "POST", h.URL+"/v1/sessions", apiKey, map[string]any{"session_id": "bob", "surface": "claude_code"}, "Idempotency-Key", regKey("kb")); st != http.StatusForbidden {
		t.Errorf("retry past the retry window: %d %v, want 403", st, r)
	}

	// A resume makes the token: the registration's key no longer retries.
	st, r = call(t, "POST", h.URL+"/v1/sessions", apiKey, map[string]any{"session_id": "carol", "surface": "claude_code"}, "Idempotency-Key", regKey("kc"))
	if st != http.StatusCreated {
		t.Fatalf("register carol: %d %v", st, r)
	}
	if st, r := call(t, "POST", h.URL+"/v1/sessions", apiKey, map[string]any{"session_id": "carol", "surface": "claude_code"},
		"X-Marconi-Session-Token", r["token"].(string)); st != http.StatusOK {
		t.Fatalf("resume carol: %d %v", st, r)
	}
	if st, r := call(t, "POST", h.URL+"/v1/sessions", apiKey, map[string]any{"session_id": "carol", "surface": "claude_code"}, "Idempotency-Key", regKey("kc")); st != http.StatusForbidden {
		t.Errorf("retry after a resume: %d %v, want 403", st, r)
	}
}

// TestRegistrationKeySpentByFirstUse (issue 19, item 2): the first
// authenticated use of the token a registration made spends its
// Idempotency-Key, whatever the use (heartbeat, send, drain, ack,
// WebSocket attach): a replay of the key afterwards, even by the same API
// key within the retry window, gets 403 and the token keeps working. On
// the memory store and on Postgres.
func TestRegistrationKeySpentByFirstUse(t *testing.T) {
	for name, open := range bothStores() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := hubtest.Start(t, hubtest.Options{Store: open(t)})
			peer := register(t, h, "peer", "claude_code")
			uses := map[string]func(token string){
				"heartbeat": func(tok string) { call(t, "POST", h.URL+"/v1/heartbeat", tok, nil) },
				"send": func(tok string) {
					call(t, "POST", h.URL+"/v1/signals", tok, map[string]any{"to_session": "peer", "payload": 1})
				},
				"drain": func(tok string) { call(t, "GET", h.URL+"/v1/signals", tok, nil) },
				"ack":   func(tok string) { call(t, "POST", h.URL+"/v1/signals/ack", tok, map[string]any{"up_to_seq": 0}) },
				"websocket attach": func(tok string) {
					c, _ := dial(t, h, agent{ID: "user", Token: tok})
					c.CloseNow()
				},
			}
			for use, do := range uses {
				id := "user-" + strings.ReplaceAll(use, " ", "-")
				key := regKey(strings.ReplaceAll(use, " ", "-"))
				body := map[string]any{"session_id": id, "surface": "claude_code"}
				st, r := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, body, "Idempotency-Key", key)
				if st != http.StatusCreated {
					t.Fatalf("%s: register: %d %v", use, st, r)
				}
				tok := r["token"].(string)
				do(tok)
				if st, r := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, body, "Idempotency-Key", key); st != http.StatusForbidden || errCode(r) != "forbidden" {
					t.Errorf("%s: replay of the key after the token's first use: %d %v, want 403", use, st, r)
				}
				if st, r := call(t, "POST", h.URL+"/v1/heartbeat", tok, nil); st != http.StatusOK {
					t.Errorf("%s: the token after the refused replay: %d %v, want 200", use, st, r)
				}
			}
			_ = peer
		})
	}
}

// TestRegisterIdempotencyKeyBadInput: a registration Idempotency-Key
// carries at least 128 bits: 22 to 256 base64url characters; anything else
// is 400 invalid_field naming the header, and nothing is stored.
func TestRegisterIdempotencyKeyBadInput(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	for name, key := range map[string]string{
		"1 character":        "1",
		"21 characters":      strings.Repeat("k", 21),
		"257 characters":     strings.Repeat("k", 257),
		"control character":  strings.Repeat("k", 22) + "\tb",
		"not base64url":      strings.Repeat("k", 22) + "+/",
		"padding":            strings.Repeat("k", 22) + "==",
		"UTF-8 beyond ASCII": strings.Repeat("é", 22),
	} {
		st, r := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": "alice", "surface": "codex"}, "Idempotency-Key", key)
		if st != http.StatusBadRequest || errCode(r) != "invalid_field" || !strings.Contains(r["error"].(map[string]any)["message"].(string), "Idempotency-Key") {
			t.Errorf("%s: %d %v, want 400 invalid_field naming Idempotency-Key", name, st, r)
		}
	}
	if st, r := routeStateStatus(t, h, "alice"); st != "not_registered" {
		t.Fatalf("a refused registration stored alice: %v %v", st, r)
	}
	for _, key := range []string{strings.Repeat("k", 22), strings.Repeat("-_", 128)} {
		st, r := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"surface": "codex"}, "Idempotency-Key", key)
		if st != http.StatusCreated {
			t.Fatalf("%d-character key: %d %v", len(key), st, r)
		}
	}
}

// routeStateStatus is the route_state of one session through the ops API.
func routeStateStatus(t *testing.T, h *hubtest.Hub, session string) (string, map[string]any) {
	t.Helper()
	rs := routeState(t, h, session)
	s, _ := rs["route_state"].(string)
	return s, rs
}

// TestRegistrationRetryIsConfigurable: MARCONI_REGISTRATION_RETRY_SECONDS
// bounds the registration retry.
func TestRegistrationRetryIsConfigurable(t *testing.T) {
	clock := hubtest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	h := hubtest.Start(t, hubtest.Options{Now: clock.Now, Config: hub.Config{RegistrationRetry: time.Hour, SessionTTL: 48 * time.Hour}})
	reg := func(id string) (int, map[string]any) {
		t.Helper()
		return call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": id, "surface": "claude_code"}, "Idempotency-Key", regKey("k-"+id))
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
