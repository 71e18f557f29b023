package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/migrations"
)

// runCLI runs `marconi args...` in-process with the environment kv and
// returns its exit code, stdout and stderr.
func runCLI(t *testing.T, kv map[string]string, stdin string, terminal bool, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	c := cli{
		getenv: env(kv),
		environ: func() []string {
			var out []string
			for k, v := range kv {
				out = append(out, k+"="+v)
			}
			return out
		},
		stdin: strings.NewReader(stdin), terminal: terminal,
		stdout: &stdout, stderr: &stderr,
	}
	code := c.run(context.Background(), args)
	return code, stdout.String(), stderr.String()
}

// closedPortAddr is a loopback port nothing should listen on (port 1, tcpmux).
const closedPortAddr = "127.0.0.1:1"

func TestCLIExitCodesAndMessages(t *testing.T) {
	tests := []struct {
		args       []string
		code       int
		stdout     string // a substring, or "" for empty output
		stderr     string // a substring, or "" for no output
		oneLineErr bool
	}{
		{[]string{"-h"}, 0, "usage: marconi <command>", "", false},
		{[]string{"help"}, 0, "migrate", "", false},
		{[]string{"serve", "-h"}, 0, "-selfheal-freshness-seconds seconds", "", false},
		{[]string{"--help"}, 0, "healthcheck", "", false},
		{[]string{"serve", "--no-such-flag"}, 2, "", "flag provided but not defined: -no-such-flag", true},
		{[]string{"--no-such-flag"}, 2, "", "flag provided but not defined", true},
		{[]string{"serve", "extra"}, 2, "", "unexpected arguments", true},
		{[]string{"frobnicate"}, 2, "", `unknown command "frobnicate"`, true},
		{[]string{"serv"}, 2, "", `did you mean "serve"?`, true},
		{[]string{"serve", "--ws-ping-seconds", "zero"}, 2, "", "MARCONI_WS_PING_SECONDS", true},
		{[]string{"version", "x"}, 2, "", "takes no arguments", true},
		{[]string{"migrate"}, 2, "", "usage: marconi migrate", true},
		{[]string{"migrate", "sideways"}, 2, "", `unknown migrate command "sideways"`, true},
		{[]string{"migrate", "up"}, 2, "", "no database", true},
		{[]string{"config", "check", "--mode", "prod"}, 2, "", "MARCONI_MODE", true},
		{[]string{"demo", "now"}, 2, "", "usage: marconi demo", true},
		{[]string{"attach"}, 2, "", "usage: marconi attach HUB_URL SESSION_TOKEN", true},
		{[]string{"healthcheck"}, 2, "", "usage: marconi healthcheck URL", true},
		{[]string{"healthcheck", "http://" + closedPortAddr}, 1, "", "connection refused", true},
	}
	for _, tt := range tests {
		code, stdout, stderr := runCLI(t, nil, "", false, tt.args...)
		if code != tt.code {
			t.Errorf("%v: exit %d, want %d (stderr %q)", tt.args, code, tt.code, stderr)
		}
		if tt.stdout != "" && !strings.Contains(stdout, tt.stdout) {
			t.Errorf("%v: stdout lacks %q:\n%s", tt.args, tt.stdout, stdout)
		}
		if tt.stderr == "" && stderr != "" {
			t.Errorf("%v: unexpected stderr %q", tt.args, stderr)
		}
		if tt.stderr != "" && !strings.Contains(stderr, tt.stderr) {
			t.Errorf("%v: stderr %q lacks %q", tt.args, stderr, tt.stderr)
		}
		if tt.oneLineErr && strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: error is not one line: %q", tt.args, stderr)
		}
	}
}

func TestHelpShowsTypedFlags(t *testing.T) {
	_, stdout, _ := runCLI(t, nil, "", false, "serve", "-h")
	for _, want := range []string{"-selfheal", "-max-payload-bytes bytes", "-ws-queue-size int", "-send-rate-per-second int",
		"-database-url url", "-mode string", "-session-ttl-seconds seconds"} {
		if !regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(want) + `\b`).MatchString(stdout) {
			t.Errorf("serve -h lacks %q", want)
		}
	}
	if strings.Contains(stdout, "-selfheal string") || strings.Contains(stdout, "-selfheal bool") {
		t.Error("--selfheal should be a bare boolean flag")
	}
	// The type reads once, in the parentheses, not as the help's first word.
	if !strings.Contains(stdout, "address to listen on (default: 127.0.0.1:8080 in development, :8080 in lan and cloud) (string; env MARCONI_ADDR") ||
		strings.Contains(stdout, "\tstring ") || strings.Contains(stdout, "\tseconds ") {
		t.Errorf("serve -h help text:\n%s", stdout)
	}
	// A boolean flag stands alone.
	c, err := LoadConfig([]string{"--selfheal", "--mode", "lan", "--admin-token", "0123456789abcdef"}, env(nil), &bytes.Buffer{})
	if err != nil || !c.Hub.SelfHeal.Enabled {
		t.Fatalf("--selfheal alone: enabled %v, err %v", c.Hub.SelfHeal.Enabled, err)
	}
}

func TestVersionPrintsBuildInfo(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, stdout, _ := runCLI(t, nil, "", false, args...)
		if code != 0 || !regexp.MustCompile(`^marconi \S+ \(revision \S+, go1\.\d+`).MatchString(stdout) {
			t.Errorf("%v: exit %d, %q", args, code, stdout)
		}
	}
}

func TestUnknownVariablesAreWarnedAbout(t *testing.T) {
	kv := map[string]string{
		"MARCONI_SELFHEAL_FRESHNES_SECONDS": "30", // a typo
		"MARCONI_FROBNICATE":                "1",  // nothing close
		"MARCONI_TEST_DATABASE_URL":         "x",  // read by tests, not the hub
		"MARCONI_MODE":                      "development",
	}
	code, _, stderr := runCLI(t, kv, "", false, "config")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	want := []string{
		"marconi config: warning: unknown variable MARCONI_FROBNICATE is ignored\n",
		"marconi config: warning: unknown variable MARCONI_SELFHEAL_FRESHNES_SECONDS is ignored (did you mean MARCONI_SELFHEAL_FRESHNESS_SECONDS?)\n",
	}
	if stderr != strings.Join(want, "") {
		t.Errorf("warnings:\n%s\nwant:\n%s", stderr, strings.Join(want, ""))
	}
}

func TestConfigPrintsEffectiveValuesMasked(t *testing.T) {
	kv := map[string]string{
		"MARCONI_MODE":         "lan",
		"MARCONI_API_KEYS":     "key-secretsecret0001=acme/web",
		"MARCONI_ADMIN_TOKEN":  "admin-secret-0123456789",
		"MARCONI_DATABASE_URL": "postgres://marconi:hunter2hunter2@db.internal:5432/marconi",
		"MARCONI_PUBLIC_URL":   "http://hub-a:8080",
	}
	code, stdout, stderr := runCLI(t, kv, "", false, "config", "--ws-queue-size", "64")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, secret := range []string{"key-secretsecret0001", "admin-secret-0123456789", "hunter2hunter2"} {
		if strings.Contains(stdout, secret) {
			t.Errorf("config printed a secret %q:\n%s", secret, stdout)
		}
	}
	for _, want := range []string{
		"MARCONI_API_KEYS=****=acme/web\t# env",
		"MARCONI_ADMIN_TOKEN=****\t# env",
		"MARCONI_DATABASE_URL=postgres://marconi:xxxxx@db.internal:5432/marconi\t# env",
		"MARCONI_WS_QUEUE_SIZE=64\t# flag",
		"MARCONI_SESSION_TTL_SECONDS=3600\t# default",
		"MARCONI_ADDR=:8080\t# default",
		"# effective: self-heal false, public URL http://hub-a:8080",
	} {
		if !strings.Contains(stdout, want+"\n") {
			t.Errorf("config lacks %q:\n%s", want, stdout)
		}
	}
}

// TestConfigSaysWhatEmptyDefaultsResolveTo: a setting left empty whose
// default is worked out at start (the instance id from the host name, the
// development credentials' file, self-heal by mode, the public URL from the
// address) says in `marconi config` what it resolves to.
func TestConfigSaysWhatEmptyDefaultsResolveTo(t *testing.T) {
	state := t.TempDir()
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "marconi"
	}
	code, stdout, stderr := runCLI(t, map[string]string{"XDG_STATE_HOME": state, "MARCONI_ADDR": "127.0.0.1:9123"}, "", false, "config")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"MARCONI_INSTANCE_ID=\t# default: " + host,
		"MARCONI_PUBLIC_URL=\t# default: http://127.0.0.1:9123",
		"MARCONI_SELFHEAL=\t# default: on",
		"MARCONI_DEV_CREDENTIALS_FILE=\t# default: " + filepath.Join(state, "marconi", "dev-credentials"),
	} {
		if !strings.Contains(stdout, want+"\n") {
			t.Errorf("config lacks %q:\n%s", want, stdout)
		}
	}
}

func TestDevelopmentBindsLoopback(t *testing.T) {
	c, err := LoadConfig(nil, env(nil), &bytes.Buffer{})
	if err != nil || c.Addr != "127.0.0.1:8080" {
		t.Fatalf("development addr %q, err %v", c.Addr, err)
	}
	c, err = LoadConfig(nil, env(map[string]string{"MARCONI_MODE": "lan", "MARCONI_ADMIN_TOKEN": "0123456789abcdef"}), &bytes.Buffer{})
	if err != nil || c.Addr != ":8080" {
		t.Fatalf("lan addr %q, err %v", c.Addr, err)
	}
	c, err = LoadConfig(nil, env(map[string]string{"MARCONI_ADDR": ":9999"}), &bytes.Buffer{})
	if err != nil || c.Addr != ":9999" {
		t.Fatalf("MARCONI_ADDR ignored: %q, err %v", c.Addr, err)
	}
	_, out := startMain(t, nil)
	if !strings.Contains(out.String(), "listening on loopback only (development mode)") {
		t.Errorf("the banner does not say it listens on loopback only:\n%s", out.String())
	}
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestStoreUnreachableNamesTheCause: with the database URL on a closed port,
// the banner, /readyz and `config check` say "connection refused at
// host:port", not "migrations pending" nor a bare "store postgres".
func TestStoreUnreachableNamesTheCause(t *testing.T) {
	addr := closedPort(t)
	dbURL := "postgres://postgres@" + addr + "/marconi?sslmode=disable&connect_timeout=2"
	m, out := startMain(t, map[string]string{"MARCONI_DATABASE_URL": dbURL, "MARCONI_STORE_TIMEOUT_SECONDS": "2"})
	want := "connection refused at " + addr
	if banner := out.String(); !strings.Contains(banner, "store postgres, NOT READY: "+want) {
		t.Errorf("banner does not name the cause:\n%s", banner)
	}
	// The address goes to the banner, the log and an operator holding the
	// admin token; anyone else reads the class of failure.
	admin := adminToken(t, out.String())
	if st, body := readyz(t, m.URL(), admin); st != 503 || !strings.Contains(body, want) || strings.Contains(body, "migrations pending") {
		t.Errorf("readyz with the admin token: %d %s", st, body)
	}
	for _, cred := range []string{"", "not-the-admin-token"} {
		st, body := readyz(t, m.URL(), cred)
		if st != 503 || !strings.Contains(body, "(connection refused)") || strings.Contains(body, addr) {
			t.Errorf("readyz with credential %q: %d %s; want the class without the address", cred, st, body)
		}
	}
	if st, body := postBody(t, m.URL()+"/v1/sessions", `{"surface":"claude_code"}`); st != 503 || strings.Contains(body, addr) || !strings.Contains(body, "connection refused") {
		t.Errorf("a 503 answer names the database's address: %d %s", st, body)
	}
	code, _, stderr := runCLI(t, map[string]string{"MARCONI_DATABASE_URL": dbURL}, "", false, "config", "check")
	if code != 1 || !strings.Contains(stderr, "MARCONI_DATABASE_URL: "+want) {
		t.Errorf("config check: exit %d, %q", code, stderr)
	}
}

func TestStoreCauseAuthAndMissingDatabase(t *testing.T) {
	base := pgtest.DatabaseURL(t)
	for _, tt := range []struct{ mutate, want string }{
		{"user", `authentication failed for user "no_such_role_ops"`},
		{"db", `database "no_such_db_ops" does not exist`},
	} {
		u := base
		switch tt.mutate {
		case "user":
			u = strings.Replace(base, "postgres://postgres@", "postgres://no_such_role_ops@", 1)
		case "db":
			u = regexp.MustCompile(`/[^/?]+(\?|$)`).ReplaceAllString(base, "/no_such_db_ops$1")
		}
		code, _, stderr := runCLI(t, map[string]string{"MARCONI_DATABASE_URL": u}, "", false, "config", "check")
		if code != 1 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%s: exit %d, %q, want %q", tt.mutate, code, stderr, tt.want)
		}
	}
}

func TestMigrateDownStepsAndConfirms(t *testing.T) {
	dbURL := pgtest.Schema(t)
	latest := migrations.Latest()
	all := migrations.All()
	if v, _, err := migrations.Version(dbURL); err != nil || v != latest || len(all) < 4 {
		t.Fatalf("version %d of %d, %v", v, latest, err)
	}
	kv := map[string]string{"MARCONI_DATABASE_URL": dbURL}
	step := func(want uint, args ...string) string {
		t.Helper()
		code, stdout, stderr := runCLI(t, kv, "", false, args...)
		if code != 0 || !strings.HasSuffix(stdout, fmt.Sprintf("schema version %d (dirty false)\n", want)) {
			t.Fatalf("%v: exit %d, %q %q; want version %d", args, code, stdout, stderr, want)
		}
		return stdout
	}
	// back(k) is the migration k steps before the latest (a version number
	// may be skipped: branches reserve theirs).
	back := func(k int) migrations.Migration { return all[len(all)-1-k] }
	out := step(back(1).Version, "migrate", "down", "--yes")
	if !strings.Contains(out, "reverted "+back(0).String()+"\n") || strings.Contains(out, "reverted "+back(1).String()) {
		t.Errorf("down prints each step reverted, and only those:\n%s", out)
	}
	out = step(back(3).Version, "migrate", "down", "2", "--yes")
	if !strings.Contains(out, "from schema version "+fmt.Sprint(back(1).Version)+" to "+fmt.Sprint(back(3).Version)) ||
		!strings.Contains(out, "reverted "+back(1).String()+"\nreverted "+back(2).String()+"\n") {
		t.Errorf("down 2 output:\n%s", out)
	}
	out = step(latest, "migrate", "up")
	for k := 2; k >= 0; k-- {
		if !strings.Contains(out, "applied "+back(k).String()+"\n") {
			t.Errorf("up does not print %s applied:\n%s", back(k), out)
		}
	}
	if strings.Contains(out, "applied "+back(3).String()) {
		t.Errorf("up printed a step it did not apply:\n%s", out)
	}

	for _, bad := range [][]string{{"migrate", "down", "0"}, {"migrate", "down", "x"}, {"migrate", "down", "--all"},
		{"migrate", "down", "--all", "2", "--yes"}, {"migrate", "down"}, {"migrate", "up", "--yes"}} {
		if code, _, stderr := runCLI(t, kv, "", false, bad...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", bad, code, stderr)
		}
	}
	if code, _, stderr := runCLI(t, kv, "", false, "migrate", "down", fmt.Sprint(len(all)+1), "--yes"); code != 1 || !strings.Contains(stderr, "only") {
		t.Errorf("stepping back past zero: exit %d %q", code, stderr)
	}
	// On a terminal, anything but "yes" keeps the schema.
	if code, _, _ := runCLI(t, kv, "no\n", true, "migrate", "down", "--all"); code != 1 {
		t.Errorf("unconfirmed down --all: exit %d, want 1", code)
	}
	if v, _, _ := migrations.Version(dbURL); v != latest {
		t.Fatalf("unconfirmed down --all changed the schema: version %d", v)
	}
	step(0, "migrate", "down", "--all", "--yes")
	step(latest, "migrate", "up")
	code, stdout, _ := runCLI(t, kv, "yes\n", true, "migrate", "down", "--all")
	if code != 0 || !strings.Contains(stdout, `Type "yes"`) || !strings.HasSuffix(stdout, "schema version 0 (dirty false)\n") {
		t.Errorf("confirmed down --all: exit %d, %q", code, stdout)
	}
}

// TestMigrateDownSaysWhatItDropsAndWaitsForTheHubs: with a hub running on
// the schema, `migrate down` lists what each step drops and refuses; the
// list is printed before any refusal, and nothing changes until --force.
func TestMigrateDownSaysWhatItDropsAndWaitsForTheHubs(t *testing.T) {
	dbURL := pgtest.Schema(t)
	latest := migrations.Latest()
	m, _ := startMain(t, map[string]string{"MARCONI_DATABASE_URL": dbURL, "MARCONI_INSTANCE_ID": "hub-live"})
	pollUntil(t, "the hub to be ready", func() bool { return get(t, m.URL()+"/readyz") == 200 })
	kv := map[string]string{"MARCONI_DATABASE_URL": dbURL}
	all := migrations.All()
	n := fmt.Sprint(len(all) - 1) // down to 0001: the signals table (0002) goes too
	code, stdout, stderr := runCLI(t, kv, "", false, "migrate", "down", n, "--yes")
	if code != 1 || !strings.Contains(stderr, "hub-live (") || !strings.Contains(stderr, "--force") {
		t.Errorf("down with a hub running: exit %d, stderr %q", code, stderr)
	}
	if !strings.Contains(stdout, "0002_signals drops: table signals\n") ||
		!strings.Contains(stdout, "0004_signals_payload_json drops: column signals.payload converted to jsonb\n") {
		t.Errorf("down does not list what each step drops:\n%s", stdout)
	}
	// Not on a terminal and no --yes: refused even with --force.
	if code, _, stderr := runCLI(t, kv, "", false, "migrate", "down", "--force"); code != 2 || !strings.Contains(stderr, "--yes") {
		t.Errorf("down --force without a terminal: exit %d %q", code, stderr)
	}
	if v, _, _ := migrations.Version(dbURL); v != latest {
		t.Fatalf("a refused down changed the schema: version %d", v)
	}
	if code, _, stderr := runCLI(t, kv, "", false, "migrate", "down", "--yes", "--force"); code != 0 {
		t.Fatalf("down --force: exit %d %q", code, stderr)
	}
	prev := all[len(all)-2].Version
	if v, _, _ := migrations.Version(dbURL); v != prev {
		t.Fatalf("down --force: version %d, want %d", v, prev)
	}
}

func TestDevCredentialsKeptInTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state", "dev-credentials")
	kv := map[string]string{"MARCONI_DATABASE_URL": "postgres://x@127.0.0.1:1/x", "XDG_STATE_HOME": dir}
	load := func() Config {
		t.Helper()
		c, err := LoadConfig(nil, env(kv), &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if err := keepDevCredentials(&c, env(kv)); err != nil {
			t.Fatal(err)
		}
		return c
	}
	kv["MARCONI_DEV_CREDENTIALS_FILE"] = path
	a, b := load(), load()
	if a.generatedAPIKey == "" || a.generatedAPIKey != b.generatedAPIKey || a.generatedAdminToken != b.generatedAdminToken ||
		b.Hub.AdminToken != a.generatedAdminToken || b.Hub.APIKeys[a.generatedAPIKey].TenantID != "dev" || b.devCredentialsFile != path {
		t.Fatalf("credentials changed between starts: %q/%q then %q/%q", a.generatedAPIKey, a.generatedAdminToken, b.generatedAPIKey, b.generatedAdminToken)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("credentials file mode %v, err %v", st.Mode().Perm(), err)
	}
	// The default path is under XDG_STATE_HOME.
	delete(kv, "MARCONI_DEV_CREDENTIALS_FILE")
	if c := load(); c.devCredentialsFile != filepath.Join(dir, "marconi", "dev-credentials") {
		t.Errorf("default path %q", c.devCredentialsFile)
	}
	// A file others can read is refused, not used.
	kv["MARCONI_DEV_CREDENTIALS_FILE"] = path
	os.Chmod(path, 0o644)
	c, _ := LoadConfig(nil, env(kv), &bytes.Buffer{})
	if err := keepDevCredentials(&c, env(kv)); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a world-readable credentials file: err %v", err)
	}
	// Configured credentials write nothing, on either store.
	other := filepath.Join(dir, "other")
	for _, db := range []string{"", "postgres://x@127.0.0.1:1/x"} {
		kv2 := map[string]string{"MARCONI_DATABASE_URL": db, "MARCONI_DEV_CREDENTIALS_FILE": other,
			"MARCONI_API_KEYS": "key-aaaaaaaaaaaaaaaa=t/p", "MARCONI_ADMIN_TOKEN": "0123456789abcdef"}
		c, _ := LoadConfig(nil, env(kv2), &bytes.Buffer{})
		if err := keepDevCredentials(&c, env(kv2)); err != nil || c.devCredentialsFile != "" {
			t.Errorf("store %q: file %q err %v", db, c.devCredentialsFile, err)
		}
	}
	if _, err := os.Stat(other); !os.IsNotExist(err) {
		t.Errorf("a credentials file was written where none was needed: %v", err)
	}
}

// TestFailingMigrationNamedWithoutSQL: Postgres answers but a migration
// fails (a conflicting table), leaving the schema dirty: the banner and
// /readyz say so and point at the log; the migration's own error, which may
// quote SQL, stays in the log.
func TestFailingMigrationNamedWithoutSQL(t *testing.T) {
	dbURL := pgtest.EmptySchema(t)
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), `CREATE TABLE sessions (squatter int)`); err != nil {
		t.Fatal(err)
	}
	conn.Close(t.Context())
	m, out := startMain(t, map[string]string{"MARCONI_DATABASE_URL": dbURL})
	if !strings.Contains(out.String(), "NOT READY: schema dirty at version 1: a migration failed halfway (the hub's log says why)") {
		t.Errorf("banner:\n%s", out.String())
	}
	resp, err := http.Get(m.URL() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(body.String(), "(schema dirty)") ||
		strings.Contains(strings.ToUpper(body.String()), "CREATE") || strings.Contains(body.String(), "sessions") {
		t.Errorf("readyz: %d %s", resp.StatusCode, body.String())
	}
}

// TestReadyzNamesTheCauseAfterAnOutage: a hub that was serving loses
// Postgres; /readyz names what happened (through the store breaker), not a
// bare "cannot be reached".
func TestReadyzNamesTheCauseAfterAnOutage(t *testing.T) {
	dbURL, proxy := viaProxy(t, pgtest.Schema(t))
	m, out := startMain(t, map[string]string{"MARCONI_DATABASE_URL": dbURL, "MARCONI_STORE_TIMEOUT_SECONDS": "2"})
	pollUntil(t, "the hub to be ready", func() bool { return get(t, m.URL()+"/readyz") == 200 })
	proxy.Cut()
	var st int
	var body string
	pollUntil(t, "readyz to fail and name the cause", func() bool {
		st, body = readyz(t, m.URL(), "")
		return st == 503 && strings.Contains(body, "cannot be reached (")
	})
	if strings.Contains(body, proxy.Addr()) || strings.Contains(body, "breaker") {
		t.Errorf("public readyz after the outage names the address or the breaker: %s", body)
	}
	st, body = readyz(t, m.URL(), adminToken(t, out.String()))
	if st != 503 || !strings.Contains(body, proxy.Addr()) || strings.Contains(body, "breaker") {
		t.Errorf("readyz after the outage, with the admin token: %d %s", st, body)
	}
}

// readyz is GET /readyz, with the bearer cred unless it is empty.
func readyz(t *testing.T, base, cred string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/readyz", nil)
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// postBody is POST without a credential: the answer's status and body.
func postBody(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 15 * time.Second}).Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// adminToken is the development admin token the banner printed.
func adminToken(t *testing.T, banner string) string {
	t.Helper()
	m := regexp.MustCompile(`admin token: (\S+)`).FindStringSubmatch(banner)
	if m == nil {
		t.Fatalf("no admin token printed:\n%s", banner)
	}
	return m[1]
}

// TestRedirectedStdinIsNotATerminal: `marconi migrate down </dev/null`, as a
// script, cron or `docker run` without -t starts it, must be refused for want
// of --yes (exit 2), not asked a question nobody answers. /dev/null is a
// character device, so that alone does not make a terminal.
func TestRedirectedStdinIsNotATerminal(t *testing.T) {
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	file, err := os.Create(filepath.Join(t.TempDir(), "stdin"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for _, f := range []*os.File{devNull, file, r} {
		if isTerminal(f) {
			t.Errorf("isTerminal(%s) = true: a confirmation would be asked of no one", f.Name())
		}
	}
}
