package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/internal/testproxy"
	"github.com/marconihub/marconi/internal/testwait"
)

// viaProxy returns dbURL rewritten to reach Postgres through a test proxy.
func viaProxy(t *testing.T, dbURL string) (string, *testproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	p := testproxy.Start(t, u.Host)
	u.Host = p.Addr()
	return u.String(), p
}

type answer struct {
	status int
	code   string
}

func post(t *testing.T, url, cred, body string) answer {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+cred)
	c := &http.Client{Timeout: 15 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	json.Unmarshal(raw, &e)
	return answer{resp.StatusCode, e.Error.Code}
}

func get(t *testing.T, url string) int {
	t.Helper()
	c := &http.Client{Timeout: 15 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// pollUntil polls cond until it holds; recoveries here wait on the
// store's reconnects and the breaker's probes, so it allows 30 s.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.For(t, what, 30*time.Second, cond)
}

func devKey(t *testing.T, out string) string {
	t.Helper()
	m := regexp.MustCompile(`dev API key \(tenant dev, project dev\): (\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no dev API key printed:\n%s", out)
	}
	return m[1]
}

// TestStoreUnreachableFailsClosedAndRecovers cuts Postgres under a running
// hub: every call that needs the store answers 503 registry_unavailable
// within the store timeout, /readyz fails, nothing falls back to memory, and
// the hub serves again once Postgres is back, without a restart.
func TestStoreUnreachableFailsClosedAndRecovers(t *testing.T) {
	dbURL, proxy := viaProxy(t, pgtest.Schema(t))
	m, out := startMain(t, map[string]string{"MARCONI_DATABASE_URL": dbURL, "MARCONI_STORE_TIMEOUT_SECONDS": "2"})
	key := devKey(t, out.String())

	if a := post(t, m.URL()+"/v1/sessions", key, `{"session_id":"alice","surface":"claude_code"}`); a.status != 201 {
		t.Fatalf("register with Postgres up: %+v", a)
	}
	proxy.Cut()
	start := time.Now()
	if a := post(t, m.URL()+"/v1/sessions", key, `{"session_id":"bob","surface":"claude_code"}`); a.status != 503 || a.code != "registry_unavailable" {
		t.Fatalf("register with Postgres cut: %+v, want 503 registry_unavailable", a)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("failing closed took %v; the store timeout is 2s", took)
	}
	if st := get(t, m.URL()+"/readyz"); st != 503 {
		t.Fatalf("readyz with Postgres cut: %d", st)
	}
	if st := get(t, m.URL()+"/healthz"); st != 200 {
		t.Fatalf("healthz with Postgres cut: %d (the process is up)", st)
	}
	// Still closed: the session registered during the outage does not exist
	// anywhere, not even in a memory fallback.
	if a := post(t, m.URL()+"/v1/sessions", key, `{"session_id":"bob","surface":"claude_code"}`); a.status != 503 {
		t.Fatalf("second call during the outage: %+v", a)
	}

	proxy.Restore()
	checkRecovered(t, m, key)
}

// checkRecovered waits for /readyz after an outage, then checks that bob,
// refused during it, does not exist (not even in a memory fallback) and
// alice, stored before it, still does.
func checkRecovered(t *testing.T, m *Main, key string) {
	t.Helper()
	pollUntil(t, "readyz to recover", func() bool { return get(t, m.URL()+"/readyz") == 200 })
	if a := post(t, m.URL()+"/v1/sessions", key, `{"session_id":"bob","surface":"claude_code"}`); a.status != 201 {
		t.Fatalf("register after recovery: %+v (bob must not exist from the outage)", a)
	}
	if a := post(t, m.URL()+"/v1/sessions", key, `{"session_id":"alice","surface":"claude_code"}`); a.status != 403 {
		t.Fatalf("alice after recovery: %+v, want 403 (still live)", a)
	}
}

// TestStartsWhilePostgresDown: a hub started while Postgres is unreachable
// serves fail-closed, then applies its migrations and serves once it is back.
func TestStartsWhilePostgresDown(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (waits for retries): skipped by -short")
	}
	dbURL, proxy := viaProxy(t, pgtest.EmptySchema(t))
	proxy.Cut()
	m, out := startMain(t, map[string]string{"MARCONI_DATABASE_URL": dbURL, "MARCONI_STORE_TIMEOUT_SECONDS": "2"})
	key := devKey(t, out.String())
	if st := get(t, m.URL()+"/readyz"); st != 503 {
		t.Fatalf("readyz while down: %d", st)
	}
	if a := post(t, m.URL()+"/v1/sessions", key, `{"surface":"codex"}`); a.status != 503 || a.code != "registry_unavailable" {
		t.Fatalf("register while down: %+v", a)
	}
	proxy.Restore()
	pollUntil(t, "the hub to serve after Postgres came back", func() bool {
		return post(t, m.URL()+"/v1/sessions", key, `{"surface":"codex"}`).status == 201
	})
}

// TestNotReadyUntilMigrated: with Postgres up but the schema not migrated
// (here a migration fails on a conflicting table), the hub answers 503
// registry_unavailable and /readyz fails, instead of 500s on missing tables.
func TestNotReadyUntilMigrated(t *testing.T) {
	dbURL := pgtest.EmptySchema(t)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE sessions (squatter int)`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	m, out := startMain(t, map[string]string{"MARCONI_DATABASE_URL": dbURL})
	key := devKey(t, out.String())
	if st := get(t, m.URL()+"/readyz"); st != 503 {
		t.Fatalf("readyz with migrations failing: %d, want 503", st)
	}
	if a := post(t, m.URL()+"/v1/sessions", key, `{"surface":"codex"}`); a.status != 503 || a.code != "registry_unavailable" {
		t.Fatalf("register with migrations failing: %+v, want 503 registry_unavailable", a)
	}
}
