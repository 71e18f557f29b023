package main

import (
	"context"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/marconihub/marconi/internal/testlog"
)

// served is a `marconi serve` running in-process through the command line.
type served struct {
	url    string
	banner *testlog.Buffer
	stop   func() int // ends the hub as SIGTERM would and returns its exit code
}

// serve runs `marconi serve` in-process with the environment kv (on a free
// loopback port) until the hub has printed its banner.
func serve(t *testing.T, kv map[string]string) served {
	t.Helper()
	kv["MARCONI_ADDR"] = "127.0.0.1:0"
	kv["MARCONI_LOG_LEVEL"] = "error"
	out := &testlog.Buffer{}
	c := cli{getenv: env(kv), stdout: out, stderr: out}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- c.run(ctx, []string{"serve"}) }()
	var stopped bool
	var code int
	stop := func() int {
		if !stopped {
			cancel()
			code, stopped = <-done, true
		}
		return code
	}
	t.Cleanup(func() { stop() })
	re := regexp.MustCompile(`listening on (http://\S+)`)
	var url string
	pollUntil(t, "the hub to print its banner", func() bool {
		select {
		case code := <-done:
			stopped = true
			t.Fatalf("serve exited %d:\n%s", code, out.String())
		default:
		}
		if m := re.FindStringSubmatch(out.String()); m != nil && strings.Contains(out.String(), "dashboard:") {
			url = m[1]
			return true
		}
		return false
	})
	return served{url: url, banner: out, stop: stop}
}

// authorized is the status of GET url with the bearer credential.
func authorized(t *testing.T, method, url, cred, body string) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+cred)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestDevHubKeepsCredentialsAcrossRestarts: the development hub on the
// in-memory store, restarted, prints the same API key and admin token, and
// both work on the new process; the file holding them is named.
func TestDevHubKeepsCredentialsAcrossRestarts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dev-credentials")
	kv := map[string]string{"MARCONI_DEV_CREDENTIALS_FILE": path}
	creds := func(banner string) (string, string) {
		key := regexp.MustCompile(`dev API key \(tenant dev, project dev\): (\S+)`).FindStringSubmatch(banner)
		if key == nil {
			t.Fatalf("no API key printed:\n%s", banner)
		}
		return key[1], adminToken(t, banner)
	}
	first := serve(t, kv)
	key, admin := creds(first.banner.String())
	if !strings.Contains(first.banner.String(), path) {
		t.Errorf("the banner does not name the credentials file %s:\n%s", path, first.banner.String())
	}
	if st := authorized(t, "POST", first.url+"/v1/sessions", key, `{"session_id":"alice","surface":"claude_code"}`); st != 201 {
		t.Fatalf("register on the first hub: %d", st)
	}
	if code := first.stop(); code != 0 {
		t.Fatalf("first hub exited %d", code)
	}

	second := serve(t, kv)
	key2, admin2 := creds(second.banner.String())
	if key2 != key || admin2 != admin {
		t.Fatalf("credentials changed across a restart: %s/%s then %s/%s", key, admin, key2, admin2)
	}
	// The memory store forgot alice; her agent registers again with the key it holds.
	if st := authorized(t, "POST", second.url+"/v1/sessions", key, `{"session_id":"alice","surface":"claude_code"}`); st != 201 {
		t.Errorf("register with the kept API key after the restart: %d", st)
	}
	if st := authorized(t, "GET", second.url+"/v1/ops/route_state/dev/dev/alice", admin, ""); st != 200 {
		t.Errorf("ops with the kept admin token after the restart: %d", st)
	}
}
