package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi/internal/pgtest"
)

// fabricCall does one JSON request and decodes the answer.
func fabricCall(t *testing.T, method, url, cred string, body any) (int, map[string]any) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, r)
	req.Header.Set("Authorization", "Bearer "+cred)
	resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

// attachOnce dials the WebSocket; it returns the welcome, or the refused
// handshake's status and error object.
func attachOnce(t *testing.T, base, token string) (welcome map[string]any, status int, errObj map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wsURL := "ws" + strings.TrimPrefix(base, "http") + "/v1/ws"
	c, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		if resp == nil {
			t.Fatalf("dial %s: %v", wsURL, err)
		}
		var body struct {
			Error map[string]any `json:"error"`
		}
		raw, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(raw, &body)
		return nil, resp.StatusCode, body.Error
	}
	defer c.CloseNow()
	_, data, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("read welcome: %v", err)
	}
	if err := json.Unmarshal(data, &welcome); err != nil {
		t.Fatalf("welcome %q: %v", data, err)
	}
	_ = c.Close(websocket.StatusNormalClosure, "bye")
	return welcome, http.StatusSwitchingProtocols, nil
}

// TestTwoInstancesOnePostgres runs two hub processes in-process on one
// database, as the README's two-process recipe does: a sticky session is
// placed on hub-a, hub-b refuses it with hub-a's public URL, and once hub-a
// shuts down (marking itself draining) hub-b takes the session over.
func TestTwoInstancesOnePostgres(t *testing.T) {
	db := pgtest.Schema(t)
	const key, admin = "e2e-key-0123456789abcdef", "e2e-admin-0123456789abcdef"
	common := func(id string) map[string]string {
		return map[string]string{
			"MARCONI_DATABASE_URL": db, "MARCONI_MODE": "lan",
			"MARCONI_API_KEYS": key + "=t/p", "MARCONI_ADMIN_TOKEN": admin,
			"MARCONI_INSTANCE_ID": id, "MARCONI_PUBLIC_URL": "http://" + id + ".example",
			// hub-b must not judge hub-a dead while both run, however
			// loaded the machine: hub-a hands s1 over by draining, not by
			// dying.
			"MARCONI_INSTANCE_HEARTBEAT_SECONDS": "1", "MARCONI_INSTANCE_DEAD_AFTER_SECONDS": "60",
		}
	}
	a, _ := startMain(t, common("hub-a"))
	b, _ := startMain(t, common("hub-b"))
	if a.Config.Hub.Fabric.HeartbeatEvery != time.Second {
		t.Fatalf("MARCONI_INSTANCE_HEARTBEAT_SECONDS not plumbed into the fabric: %v", a.Config.Hub.Fabric.HeartbeatEvery)
	}

	healthy := func(base string) map[string]bool {
		_, s := fabricCall(t, "GET", base+"/v1/ops/fabric/summary", admin, nil)
		out := map[string]bool{}
		ins, _ := s["instances"].([]any)
		for _, in := range ins {
			m := in.(map[string]any)
			out[m["instance_id"].(string)] = m["healthy"].(bool)
		}
		return out
	}
	pollUntil(t, "both instances healthy as hub-a sees them", func() bool {
		h := healthy(a.URL())
		return h["hub-a"] && h["hub-b"]
	})

	st, reg := fabricCall(t, "POST", a.URL()+"/v1/sessions", key, map[string]any{"session_id": "s1", "surface": "claude_code", "runtime_mode": "sticky"})
	if st != http.StatusCreated || reg["instance_id"] != "hub-a" || reg["instance_url"] != "http://hub-a.example" {
		t.Fatalf("register: %d %v, want 201 on hub-a at http://hub-a.example", st, reg)
	}
	token := reg["token"].(string)
	pollUntil(t, "hub-b sees hub-a", func() bool { return healthy(b.URL())["hub-a"] })
	if _, st, e := attachOnce(t, b.URL(), token); st != http.StatusConflict || e["code"] != "wrong_instance" ||
		e["instance_id"] != "hub-a" || e["instance_url"] != "http://hub-a.example" {
		t.Fatalf("attach on hub-b: %d %v, want 409 wrong_instance naming hub-a", st, e)
	}

	if err := a.Close(); err != nil {
		t.Fatalf("close hub-a: %v", err)
	}
	var w map[string]any
	pollUntil(t, "hub-b takes s1 over", func() bool {
		w, _, _ = attachOnce(t, b.URL(), token)
		return w != nil
	})
	if w["affinity_reset"] != true || w["resumed"] != false || w["instance_id"] != "hub-b" {
		t.Fatalf("welcome on hub-b: %v, want affinity_reset", w)
	}
	_, s := fabricCall(t, "GET", b.URL()+"/v1/ops/fabric/summary", admin, nil)
	if s["summary"].(map[string]any)["total_fallbacks"] != 1.0 {
		t.Fatalf("summary %v, want one fallback", s["summary"])
	}
	for _, in := range s["instances"].([]any) {
		m := in.(map[string]any)
		if m["instance_id"] == "hub-a" && (m["draining"] != true || m["healthy"] != false) {
			t.Fatalf("hub-a in the summary: %v, want draining, unhealthy", m)
		}
	}
}

// TestReservedDefaultModeRefusedAtStart: MARCONI_DEFAULT_RUNTIME_MODE is an
// entry point of the runtime-mode guard too.
func TestReservedDefaultModeRefusedAtStart(t *testing.T) {
	for _, m := range []string{"soft_sticky", "pinned", "hybrid"} {
		_, err := LoadConfig(nil, env(map[string]string{"MARCONI_DEFAULT_RUNTIME_MODE": m}), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "MARCONI_DEFAULT_RUNTIME_MODE") || !strings.Contains(err.Error(), "reserved") {
			t.Fatalf("MARCONI_DEFAULT_RUNTIME_MODE=%s: %v, want a refusal naming the variable", m, err)
		}
	}
	for _, v := range []string{"-1", "x"} {
		if _, err := LoadConfig(nil, env(map[string]string{"MARCONI_ADAPTIVE_ROLLBACK_AFTER": v}), &bytes.Buffer{}); err == nil ||
			!strings.Contains(err.Error(), "MARCONI_ADAPTIVE_ROLLBACK_AFTER") {
			t.Fatalf("MARCONI_ADAPTIVE_ROLLBACK_AFTER=%s: %v", v, err)
		}
	}
	c, err := LoadConfig(nil, env(map[string]string{"MARCONI_ADAPTIVE_ROLLBACK_AFTER": "5"}), &bytes.Buffer{})
	if err != nil || c.Hub.Fabric.Placement.RollbackAfter != 5 {
		t.Fatalf("MARCONI_ADAPTIVE_ROLLBACK_AFTER=5: %v, %d", err, c.Hub.Fabric.Placement.RollbackAfter)
	}
}
