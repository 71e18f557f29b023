package main

import (
	"strings"
	"testing"

	"github.com/marconihub/marconi/internal/pgtest"
)

// TestEveryCommandHasHelp: -h, --help and help CMD exit 0 on every command
// and subcommand and print that command's own usage on stdout.
func TestEveryCommandHasHelp(t *testing.T) {
	tests := []struct {
		args  []string
		usage string // the usage line's start
		also  string // a word of that command's own text
	}{
		{[]string{"-h"}, "usage: marconi <command>", "healthcheck"},
		{[]string{"--help"}, "usage: marconi <command>", "healthcheck"},
		{[]string{"help"}, "usage: marconi <command>", "healthcheck"},
		{[]string{"serve", "-h"}, "usage: marconi serve [flags]", "-database-url"},
		{[]string{"serve", "--help"}, "usage: marconi serve [flags]", "-database-url"},
		{[]string{"migrate", "-h"}, "usage: marconi migrate up | down", "'down -h'"},
		{[]string{"migrate", "--help"}, "usage: marconi migrate up | down", "'down -h'"},
		{[]string{"migrate", "up", "-h"}, "usage: marconi migrate up [--database-url URL]", "printing each step"},
		{[]string{"migrate", "down", "--help"}, "usage: marconi migrate down [N | --all]", "MARCONI_INSTANCE_DEAD_AFTER_SECONDS"},
		{[]string{"migrate", "down", "2", "-h"}, "usage: marconi migrate down [N | --all]", "-force"},
		{[]string{"migrate", "version", "-h"}, "usage: marconi migrate version", "dirty"},
		{[]string{"config", "-h"}, "usage: marconi config [check] [flags]", "secrets\nmasked"},
		{[]string{"config", "--help"}, "usage: marconi config [check] [flags]", "-ws-queue-size"},
		{[]string{"config", "check", "-h"}, "usage: marconi config check [flags]", "two swapped"},
		{[]string{"version", "-h"}, "usage: marconi version", "VCS revision"},
		{[]string{"version", "--help"}, "usage: marconi version", "VCS revision"},
		{[]string{"demo", "-h"}, "usage: marconi demo", "SPEC-168"},
		{[]string{"demo", "--help"}, "usage: marconi demo", "SPEC-168"},
		{[]string{"attach", "-h"}, "usage: marconi attach HUB_URL SESSION_TOKEN", "acks"},
		{[]string{"attach", "http://x", "--help"}, "usage: marconi attach HUB_URL SESSION_TOKEN", "acks"},
		{[]string{"healthcheck", "-h"}, "usage: marconi healthcheck URL", "exits 0"},
		{[]string{"buskey", "-h"}, "usage: marconi buskey show|rotate [HUB_URL]", "MARCONI_BUS_KEY_GRACE_SECONDS"},
		{[]string{"help", "buskey"}, "usage: marconi buskey show|rotate [HUB_URL]", "never shown"},
		{[]string{"route", "-h"}, "usage: marconi route [HUB_URL] T/P/S [--json]", "proof of life"},
		{[]string{"help", "sessions"}, "usage: marconi sessions [HUB_URL]", "-state string"},
		{[]string{"signals", "--help"}, "usage: marconi signals [HUB_URL] T/P/S", "unacknowledged"},
		{[]string{"help", "disconnect"}, "usage: marconi disconnect [HUB_URL] T/P/S [--follow]", "-follow"},
		{[]string{"deregister", "-h"}, "usage: marconi deregister [HUB_URL] T/P/S [--yes]", "without one"},
		{[]string{"fabric", "-h"}, "usage: marconi fabric [HUB_URL] [--json]", "bus key version"},
		{[]string{"help", "apikey"}, "usage: marconi apikey create", "never the command line"},
		{[]string{"apikey", "revoke", "-h"}, "usage: marconi apikey create", "MARCONI_ADMIN_TOKEN only"},
		{[]string{"help", "migrate"}, "usage: marconi migrate up | down", "'down -h'"},
		{[]string{"help", "demo"}, "usage: marconi demo", "SPEC-168"},
		{[]string{"help", "migrate", "down"}, "usage: marconi migrate down [N | --all]", "-force"},
		{[]string{"help", "config", "check"}, "usage: marconi config check [flags]", "two swapped"},
	}
	for _, tt := range tests {
		code, stdout, stderr := runCLI(t, nil, "", false, tt.args...)
		if code != 0 || stderr != "" {
			t.Errorf("%v: exit %d, stderr %q; want 0 and none", tt.args, code, stderr)
		}
		if !strings.HasPrefix(stdout, tt.usage) || !strings.Contains(strings.ToLower(stdout), strings.ToLower(tt.also)) {
			t.Errorf("%v: stdout does not start with %q or lacks %q:\n%s", tt.args, tt.usage, tt.also, stdout)
		}
	}
}

// TestUnknownFlagSuggestsTheNearest: a misspelt flag, or subcommand, is a
// usage error that names the one it was probably meant to be, on every command.
func TestUnknownFlagSuggestsTheNearest(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--databse-url", "postgres://x"}, "(did you mean --database-url?)"},
		{[]string{"--ws-queue-sise", "3"}, "(did you mean --ws-queue-size?)"},
		{[]string{"config", "--mdoe", "lan"}, "(did you mean --mode?)"},
		{[]string{"config", "check", "--admin-tokn", "x"}, "(did you mean --admin-token?)"},
		{[]string{"migrate", "down", "--frce"}, "(did you mean --force?)"},
		{[]string{"migrate", "up", "--database-ur", "x"}, "(did you mean --database-url?)"},
		{[]string{"version", "--verbose"}, "takes no flags"},
		{[]string{"demo", "--fast"}, "takes no flags"},
		{[]string{"config", "chek"}, `unknown config command "chek" (did you mean "check"?)`},
		{[]string{"buskey", "rotat", "http://127.0.0.1:1"}, `unknown buskey command "rotat" (did you mean "rotate"?)`},
		{[]string{"buskey", "shw"}, `(did you mean "show"?)`},
	}
	for _, tt := range tests {
		code, _, stderr := runCLI(t, nil, "", false, tt.args...)
		if code != 2 || !strings.Contains(stderr, tt.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line with %q", tt.args, code, stderr, tt.want)
		}
	}
	// Far from every flag: no guess.
	if _, _, stderr := runCLI(t, nil, "", false, "serve", "--frobnicate"); strings.Contains(stderr, "did you mean") {
		t.Errorf("a guess for a flag near nothing: %q", stderr)
	}
}

// TestMigrateNamesAMalformedDatabaseURL: a database URL pgx would not
// connect with is a usage error naming where it came from (the flag or the
// variable), without quoting the value, which may hold a password.
func TestMigrateNamesAMalformedDatabaseURL(t *testing.T) {
	tests := []struct {
		kv   map[string]string
		args []string
		want string
	}{
		{nil, []string{"migrate", "up", "--database-url", "postgres://u:hunter2@[bad/x"}, "--database-url: want a postgres:// URL"},
		{nil, []string{"migrate", "version", "--database-url", "host=/tmp port=hunter2"}, "--database-url: want a postgres:// URL"},
		{map[string]string{"MARCONI_DATABASE_URL": "mysql://u:hunter2@h/x"}, []string{"migrate", "up"}, "MARCONI_DATABASE_URL: want a postgres:// URL"},
		// The flag wins over the variable, and is the one named.
		{map[string]string{"MARCONI_DATABASE_URL": "postgres://u@h/x"}, []string{"migrate", "down", "1", "--database-url", "x://hunter2"}, "--database-url: want"},
	}
	for _, tt := range tests {
		code, _, stderr := runCLI(t, tt.kv, "", false, tt.args...)
		if code != 2 || !strings.Contains(stderr, tt.want) || strings.Contains(stderr, "hunter2") {
			t.Errorf("%v %v: exit %d, stderr %q; want 2 and %q, no secret", tt.kv, tt.args, code, stderr, tt.want)
		}
	}
}

// TestConfigMasksWhatIsDeclaredSecret: masking follows each setting's
// declaration, not its name: the token cache's size prints, and the secret
// settings are exactly the credentials.
func TestConfigMasksWhatIsDeclaredSecret(t *testing.T) {
	kv := map[string]string{"MARCONI_TOKEN_CACHE_SIZE": "512", "MARCONI_ADMIN_TOKEN": "admin-secret-0123456789"}
	code, stdout, stderr := runCLI(t, kv, "", false, "config")
	if code != 0 || !strings.Contains(stdout, "MARCONI_TOKEN_CACHE_SIZE=512\t# env\n") ||
		!strings.Contains(stdout, "MARCONI_ADMIN_TOKEN=****\t# env\n") || strings.Contains(stdout, "admin-secret") {
		t.Errorf("exit %d %s:\n%s", code, stderr, stdout)
	}
	var c Config
	var secrets []string
	for _, s := range settings(&c) {
		if s.visibility == secret {
			secrets = append(secrets, s.env)
		}
	}
	// MARCONI_BUS_URL, like the database URL, may carry a user and password.
	if strings.Join(secrets, " ") != "MARCONI_DATABASE_URL MARCONI_BUS_URL MARCONI_API_KEYS MARCONI_ADMIN_TOKEN" {
		t.Errorf("secret settings: %v", secrets)
	}
}

// TestConfigCheckFailsOnWhatWouldBite: config check fails, naming each
// problem, where the hub would start but not work as meant.
func TestConfigCheckFailsOnWhatWouldBite(t *testing.T) {
	const admin, key = "admin-secret-0123456789", "key-secretsecret0001=acme/web"
	tests := []struct {
		name   string
		kv     map[string]string
		code   int
		stderr []string // substrings; none when empty
	}{
		{"cloud with nothing", map[string]string{"MARCONI_MODE": "cloud"}, 2,
			[]string{"2 problems", "MARCONI_ADMIN_TOKEN: empty in cloud mode", "MARCONI_API_KEYS: empty in cloud mode"}},
		{"lan without API keys", map[string]string{"MARCONI_MODE": "lan", "MARCONI_ADMIN_TOKEN": admin}, 2,
			[]string{"MARCONI_API_KEYS: empty in lan mode and the in-memory store starts with none: no agent can register"}},
		{"lan without admin token", map[string]string{"MARCONI_MODE": "lan", "MARCONI_API_KEYS": key}, 2,
			[]string{"MARCONI_ADMIN_TOKEN: empty in lan mode"}},
		{"lan with both", map[string]string{"MARCONI_MODE": "lan", "MARCONI_API_KEYS": key, "MARCONI_ADMIN_TOKEN": admin}, 0, nil},
		{"development generates both", map[string]string{}, 0, nil},
		{"a typo one letter off", map[string]string{"MARCONI_DATABSE_URL": "postgres://db/marconi"}, 2,
			[]string{"MARCONI_DATABSE_URL is not a setting: did you mean MARCONI_DATABASE_URL?"}},
		{"a name far from any", map[string]string{"MARCONI_FROBNICATE": "1"}, 0,
			[]string{"warning: unknown variable MARCONI_FROBNICATE is ignored"}},
		{"cloud publishing plain http", map[string]string{"MARCONI_MODE": "cloud", "MARCONI_API_KEYS": key, "MARCONI_ADMIN_TOKEN": admin,
			"MARCONI_PUBLIC_URL": "http://hub-1.example.com:8080"}, 2,
			[]string{"MARCONI_PUBLIC_URL: http://hub-1.example.com:8080 is plain http in cloud mode", "publish an https:// URL"}},
		{"cloud publishing https", map[string]string{"MARCONI_MODE": "cloud", "MARCONI_API_KEYS": key, "MARCONI_ADMIN_TOKEN": admin,
			"MARCONI_PUBLIC_URL": "https://hub-1.example.com"}, 0, nil},
		{"cloud publishing loopback http", map[string]string{"MARCONI_MODE": "cloud", "MARCONI_API_KEYS": key, "MARCONI_ADMIN_TOKEN": admin,
			"MARCONI_PUBLIC_URL": "http://127.0.0.1:8080"}, 0, nil},
		{"lan publishing plain http", map[string]string{"MARCONI_MODE": "lan", "MARCONI_API_KEYS": key, "MARCONI_ADMIN_TOKEN": admin,
			"MARCONI_PUBLIC_URL": "http://hub-1.lan:8080"}, 0, nil},
	}
	for _, tt := range tests {
		code, stdout, stderr := runCLI(t, tt.kv, "", false, "config", "check")
		if code != tt.code {
			t.Errorf("%s: exit %d, want %d (stderr %q)", tt.name, code, tt.code, stderr)
		}
		if (code == 0) != strings.Contains(stdout, "configuration ok") {
			t.Errorf("%s: exit %d with stdout %q", tt.name, code, stdout)
		}
		if len(tt.stderr) == 0 && stderr != "" {
			t.Errorf("%s: stderr %q", tt.name, stderr)
		}
		for _, want := range tt.stderr {
			if !strings.Contains(stderr, want) {
				t.Errorf("%s: stderr %q lacks %q", tt.name, stderr, want)
			}
		}
		if strings.Contains(stderr, "secret") {
			t.Errorf("%s: a secret on stderr: %q", tt.name, stderr)
		}
	}
}

// TestConfigCheckCountsTheKeysInTheStore: in lan mode on Postgres, API keys
// made through /v1/ops/api_keys count: with none configured and none in the
// store config check fails; once one is made, it passes.
func TestConfigCheckCountsTheKeysInTheStore(t *testing.T) {
	dbURL := pgtest.Schema(t)
	const admin = "admin-secret-0123456789"
	kv := map[string]string{"MARCONI_MODE": "lan", "MARCONI_ADMIN_TOKEN": admin, "MARCONI_DATABASE_URL": dbURL,
		"MARCONI_PUBLIC_URL": "http://127.0.0.1:1"}
	if code, _, stderr := runCLI(t, kv, "", false, "config", "check"); code != 2 || !strings.Contains(stderr, "and the store holds none") {
		t.Errorf("no key anywhere: exit %d %q", code, stderr)
	}
	m, _ := startMain(t, map[string]string{"MARCONI_MODE": "lan", "MARCONI_ADMIN_TOKEN": admin, "MARCONI_DATABASE_URL": dbURL,
		"MARCONI_PUBLIC_URL": "http://127.0.0.1:1"})
	pollUntil(t, "the hub to be ready", func() bool { return get(t, m.URL()+"/readyz") == 200 })
	if st := authorized(t, "POST", m.URL()+"/v1/ops/api_keys", admin, `{"tenant_id":"acme","project_id":"web"}`); st != 201 {
		t.Fatalf("make an API key: %d", st)
	}
	if code, stdout, stderr := runCLI(t, kv, "", false, "config", "check"); code != 0 || !strings.Contains(stdout, "configuration ok") {
		t.Errorf("a key in the store: exit %d %q %q", code, stdout, stderr)
	}
}

// TestBannerNamesTheNextSteps: a development hub's banner says where the
// dashboard is, how to see the demo and where the credentials are kept.
func TestBannerNamesTheNextSteps(t *testing.T) {
	creds := t.TempDir() + "/creds"
	s := serve(t, map[string]string{"MARCONI_DEV_CREDENTIALS_FILE": creds})
	banner := s.banner.String()
	port := s.url[strings.LastIndex(s.url, ":")+1:]
	for _, want := range []string{"Next steps:", "marconi demo", "dashboard: " + s.url + "/", "development credentials kept in " + creds,
		"MARCONI_ADDR=:" + port + " listens on every interface", "connect them to " + s.url + " with the API key above"} {
		if !strings.Contains(banner, want) {
			t.Errorf("the banner lacks %q:\n%s", want, banner)
		}
	}
	// Keys configured: none is printed, so none is "above".
	s = serve(t, map[string]string{"MARCONI_API_KEYS": "my-key-0123456789=acme/agents", "MARCONI_DEV_CREDENTIALS_FILE": creds})
	banner = s.banner.String()
	if strings.Contains(banner, "API key above") || !strings.Contains(banner, "with a key of MARCONI_API_KEYS") {
		t.Errorf("with MARCONI_API_KEYS set the banner points at a key it did not print:\n%s", banner)
	}
}

func TestEditDistance(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		d    int
	}{
		{"mode", "mode", 0}, {"mdoe", "mode", 1}, {"MARCONI_DATABSE_URL", "MARCONI_DATABASE_URL", 1},
		{"frce", "force", 1}, {"", "abc", 3}, {"abc", "", 3}, {"kitten", "sitting", 3}, {"ca", "abc", 3},
	} {
		if d := editDistance(tt.a, tt.b); d != tt.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.a, tt.b, d, tt.d)
		}
	}
}
