package hub_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/testlog"
)

// TestTakeover: a registration with "takeover": true and an API key of the
// session's project resumes a live session without its token (200, a new
// token, taken_over true); the old token stops working at once, the token
// cache included; the pending signals stay; it is counted and logged. On an
// id that is not live it is an ordinary registration (201), another
// project's key takes nothing over, and taken_over is false in every other
// answer. On the memory store and on Postgres.
func TestTakeover(t *testing.T) {
	for name, open := range bothStores() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var logs testlog.Buffer
			other := hub.NewAPIKey()
			h := hubtest.Start(t, hubtest.Options{Store: open(t),
				Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
				Config: hub.Config{APIKeys: map[string]hub.TenantProject{
					"mak_" + strings.Repeat("a", 43): {TenantID: "t1", ProjectID: "p1"},
					other:                            {TenantID: "t1", ProjectID: "p2"},
				}}})
			key := "mak_" + strings.Repeat("a", 43)
			body := map[string]any{"session_id": "alice", "surface": "claude_code", "takeover": true}

			st, first := call(t, "POST", h.URL+"/v1/sessions", key, body)
			if st != http.StatusCreated || first["taken_over"] != false {
				t.Fatalf("takeover of an id that is not live: %d %v, want 201 with taken_over false", st, first)
			}
			alice := agent{ID: "alice", Token: first["token"].(string)}
			st, b := call(t, "POST", h.URL+"/v1/sessions", key, map[string]any{"session_id": "bob", "surface": "claude_code"})
			if st != http.StatusCreated {
				t.Fatalf("register bob: %d %v", st, b)
			}
			bob := agent{ID: "bob", Token: b["token"].(string)}
			send(t, h, bob, "alice", 1)
			send(t, h, bob, "alice", 2)
			send(t, h, alice, "bob", "cached") // alice's token is in the send path's cache now

			st, took := call(t, "POST", h.URL+"/v1/sessions", key, body)
			if st != http.StatusOK || took["taken_over"] != true {
				t.Fatalf("takeover of live alice: %d %v, want 200 with taken_over true", st, took)
			}
			if took["token"] == alice.Token || took["registered_at"] != first["registered_at"] {
				t.Fatalf("takeover answer %v: want a new token and the session's registered_at %v", took, first["registered_at"])
			}
			for what, req := range map[string]func() (int, map[string]any){
				"heartbeat": func() (int, map[string]any) { return call(t, "POST", h.URL+"/v1/heartbeat", alice.Token, nil) },
				"send": func() (int, map[string]any) {
					return call(t, "POST", h.URL+"/v1/signals", alice.Token, map[string]any{"to_session": "bob", "payload": 3})
				},
			} {
				if st, r := req(); st != http.StatusGone || errCode(r) != "session_expired" {
					t.Errorf("%s with the token taken over: %d %v, want 410 session_expired", what, st, r)
				}
			}
			st, pending := call(t, "GET", h.URL+"/v1/signals", took["token"].(string), nil)
			if sigs, _ := pending["signals"].([]any); st != http.StatusOK || len(sigs) != 2 {
				t.Fatalf("alice's pending signals after the takeover: %d %v, want the 2 sent before", st, pending)
			}

			// Another project's key: its own session of the same name.
			st, r := call(t, "POST", h.URL+"/v1/sessions", other, body)
			if st != http.StatusCreated || r["project_id"] != "p2" || r["taken_over"] != false {
				t.Fatalf("takeover with another project's key: %d %v, want a new session in p2", st, r)
			}
			// A resume with the current token answers taken_over false.
			st, r = call(t, "POST", h.URL+"/v1/sessions", key, map[string]any{"session_id": "alice", "surface": "claude_code"},
				"X-Marconi-Session-Token", took["token"].(string))
			if st != http.StatusOK || r["taken_over"] != false {
				t.Fatalf("resume after the takeover: %d %v, want 200 with taken_over false", st, r)
			}
			if got := metric(t, h, "marconi_session_takeovers_total"); got != 1 {
				t.Errorf("marconi_session_takeovers_total = %v, want 1", got)
			}
			if text := logs.String(); !strings.Contains(text, `"msg":"session taken over by its project's API key"`) ||
				strings.Contains(text, took["token"].(string)) {
				t.Errorf("the activity log lacks the takeover, or holds its token:\n%s", text)
			}
		})
	}
}

// TestTakeoverOff: with MARCONI_ALLOW_TAKEOVER=false a takeover of a live
// id is refused as any registration of it without its token, and the
// refusal does not suggest it; with takeovers allowed, the refusal says
// what to do.
func TestTakeoverOff(t *testing.T) {
	for _, off := range []bool{false, true} {
		h := hubtest.Start(t, hubtest.Options{Config: hub.Config{NoTakeover: off}})
		alice := register(t, h, "alice", "claude_code")
		st, r := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": "alice", "surface": "claude_code", "takeover": off})
		msg, _ := r["error"].(map[string]any)["message"].(string)
		if st != http.StatusForbidden || errCode(r) != "forbidden" || !strings.Contains(msg, "X-Marconi-Session-Token") {
			t.Fatalf("takeover off %v: %d %v, want 403 forbidden naming the token header", off, st, r)
		}
		if hint := strings.Contains(msg, `"takeover": true`); hint == off {
			t.Errorf("takeover off %v: message %q; want the takeover hint only when takeovers are allowed", off, msg)
		}
		if st, r := call(t, "POST", h.URL+"/v1/heartbeat", alice.Token, nil); st != http.StatusOK {
			t.Errorf("takeover off %v: alice's token after the refusal: %d %v", off, st, r)
		}
		if got := metric(t, h, "marconi_session_takeovers_total"); got != 0 {
			t.Errorf("takeover off %v: marconi_session_takeovers_total = %v, want 0", off, got)
		}
	}
}
