package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/marconihub/marconi/internal/testlog"
)

// startMain runs the hub in-process on a free port, as `go run ./cmd/marconi` would.
func startMain(t *testing.T, kv map[string]string) (*Main, *testlog.Buffer) {
	t.Helper()
	if kv == nil {
		kv = map[string]string{}
	}
	if kv["MARCONI_ADDR"] == "" {
		kv["MARCONI_ADDR"] = "127.0.0.1:0"
	}
	kv["MARCONI_LOG_LEVEL"] = "error"
	cfg, err := LoadConfig(nil, env(kv), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	out := &testlog.Buffer{}
	m := NewMain(cfg, out)
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return m, out
}

func TestServePrintsCredentialsAndServes(t *testing.T) {
	m, out := startMain(t, nil)
	text := out.String()
	key := regexp.MustCompile(`dev API key \(tenant dev, project dev\): (\S+)`).FindStringSubmatch(text)
	admin := regexp.MustCompile(`admin token: (\S+)`).FindStringSubmatch(text)
	if key == nil || admin == nil || !strings.Contains(text, m.URL()) {
		t.Fatalf("start-up lines lack the URL, the dev API key or the admin token:\n%s", text)
	}
	body := strings.NewReader(`{"session_id":"alice","surface":"claude_code"}`)
	req, _ := http.NewRequest("POST", m.URL()+"/v1/sessions", body)
	req.Header.Set("Authorization", "Bearer "+key[1])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var reg map[string]any
	json.NewDecoder(resp.Body).Decode(&reg)
	if resp.StatusCode != 201 || reg["tenant_id"] != "dev" {
		t.Fatalf("register with the printed key: %d %v", resp.StatusCode, reg)
	}
	req, _ = http.NewRequest("GET", m.URL()+"/v1/ops/route_state/dev/dev/alice", nil)
	req.Header.Set("Authorization", "Bearer "+admin[1])
	resp2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != 200 {
		t.Fatalf("ops with the printed admin token: %d", resp2.StatusCode)
	}
}

func TestRunBadConfigExitsNonZero(t *testing.T) {
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"serve"}, env(map[string]string{"MARCONI_WS_PING_SECONDS": "zero"}), &bytes.Buffer{}, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), "MARCONI_WS_PING_SECONDS") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
}
