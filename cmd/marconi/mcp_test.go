package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/mcpbridge"
)

// marconi mcp's settings: a flag wins over its variable, booleans and sizes
// are checked and named, the state directory has its default, and -h never
// prints a variable's value.
func TestMCPConfig(t *testing.T) {
	env := map[string]string{
		"MARCONI_HUB_URL": "http://a:8080, http://b:8080", "MARCONI_API_KEY": "mak_secret",
		"MARCONI_SESSION_ID": "from-env", "HOME": "/home/agent",
	}
	getenv := func(k string) string { return env[k] }
	c := cli{getenv: getenv, stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}

	cfg, err := c.loadMCPConfig([]string{"--session", "alice", "--takeover", "--surface", "codex"})
	if err != nil {
		t.Fatal(err)
	}
	want := mcpbridge.Config{HubURLs: []string{"http://a:8080", "http://b:8080"}, APIKey: "mak_secret",
		SessionID: "alice", Surface: "codex", Takeover: true,
		StateDir: filepath.Join("/home/agent", ".local", "state", "marconi", "mcp")}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("config\n got %+v\nwant %+v", cfg, want)
	}

	for _, bad := range []struct {
		args []string
		env  map[string]string
		says string
	}{
		{[]string{"--inbox-size", "0"}, nil, "MARCONI_MCP_INBOX_SIZE"},
		{nil, map[string]string{"MARCONI_DEREGISTER_ON_EXIT": "maybe"}, "MARCONI_DEREGISTER_ON_EXIT"},
		{[]string{"--runtime-mode", "pinned"}, nil, "MARCONI_RUNTIME_MODE"},
		{[]string{"--session", ".."}, nil, "MARCONI_SESSION_ID"},
		{[]string{"--hub", ""}, map[string]string{"MARCONI_HUB_URL": ""}, "MARCONI_HUB_URL"},
		{[]string{"--hub", "127.0.0.1:8080"}, nil, "--hub (MARCONI_HUB_URL) \"127.0.0.1:8080\": want an http:// or https:// URL"},
		{nil, map[string]string{"MARCONI_HUB_URL": "http://a:8080,ws://b:8080"}, "\"ws://b:8080\""},
		{[]string{"--hub", "http://"}, nil, "MARCONI_HUB_URL"},
		{[]string{"extra"}, nil, "unexpected arguments"},
	} {
		e := map[string]string{}
		for k, v := range env {
			e[k] = v
		}
		for k, v := range bad.env {
			e[k] = v
		}
		c := cli{getenv: func(k string) string { return e[k] }, stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
		_, err := c.loadMCPConfig(bad.args)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("%v %v: %v, want a usage error naming %s", bad.args, bad.env, err, bad.says)
		}
	}

	var out bytes.Buffer
	c.stdout = &out
	if _, err := c.loadMCPConfig([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	if !strings.Contains(out.String(), "MARCONI_STATE_DIR") || strings.Contains(out.String(), "mak_secret") {
		t.Fatalf("-h lists the settings without values:\n%s", out.String())
	}
	if code := c.run(context.Background(), []string{"mcp", "--surface", "nope"}); code != 2 {
		t.Fatalf("a bad setting exits %d, want 2", code)
	}
}

// --state-dir none keeps nothing; without a session there is no default.
func TestMCPStateDir(t *testing.T) {
	getenv := func(k string) string { return map[string]string{"XDG_STATE_HOME": "/state", "HOME": "/home/a"}[k] }
	for _, c := range []struct{ given, session, want string }{
		{"", "alice", "/state/marconi/mcp"},
		{"none", "alice", ""},
		{"/tmp/s", "alice", "/tmp/s"},
		{"", "", ""},
	} {
		if got := stateDir(c.given, c.session, getenv); got != c.want {
			t.Errorf("stateDir(%q, %q) = %q, want %q", c.given, c.session, got, c.want)
		}
	}
}

// TestMCPJoinRefusalSaysWhatToDo: no hub at --hub, or a hub refusing the
// server at start (a key it does not know, a live session this host holds
// no token for, or one whose kept token another server replaced) stops it
// with exit 1 and says what to do, in the server's flags, not the hub's
// HTTP terms.
func TestMCPJoinRefusalSaysWhatToDo(t *testing.T) {
	m, out := startMain(t, nil)
	key := devKey(t, out.String())
	if a := post(t, m.URL()+"/v1/sessions", key, `{"session_id":"alice","surface":"claude_code"}`); a.status != 201 {
		t.Fatalf("register alice: %+v", a)
	}
	stateDir := t.TempDir()
	deadURL := "http://" + closedPort(t)
	// carol's token kept in the state directory, which another server for
	// carol, started with the same file, then resumed the session with.
	keptCarol := keptThenResumed(t, m.URL(), key, "carol", filepath.Join(stateDir, "carol.json"))
	for _, tt := range []struct {
		name, key, session string
		says               []string
	}{
		{"no hub", key, "dave", []string{"no answer from the hub", "no hub answers at " + deadURL + ": start it (marconi serve)"}},
		{"unknown key", "mak_not-a-key-of-this-hub", "bob", []string{"401 unauthorized", "--api-key (MARCONI_API_KEY) is not a key of this hub"}},
		{"live session", key, "alice", []string{"403 forbidden", `another host holds session "alice"`,
			"its state directory " + stateDir + " holds no token", "--takeover (MARCONI_TAKEOVER=true)"}},
		// The kept token is no longer current: another server resumed the
		// session with it (a host that started the server twice).
		{"kept token replaced", key, "carol", []string{"403 forbidden",
			`session "carol" is live under a newer token than the one kept in ` + keptCarol,
			"another marconi mcp with this --session", "--takeover (MARCONI_TAKEOVER=true)"}},
	} {
		hub := m.URL()
		if tt.name == "no hub" {
			hub = deadURL
		}
		code, _, stderr := runCLI(t, map[string]string{"MARCONI_API_KEY": tt.key}, "", false,
			"mcp", "--hub", hub, "--session", tt.session, "--state-dir", stateDir)
		if code != 1 {
			t.Errorf("%s: exit %d, want 1 (stderr %q)", tt.name, code, stderr)
		}
		for _, want := range tt.says {
			if !strings.Contains(stderr, want) {
				t.Errorf("%s: stderr lacks %q:\n%s", tt.name, want, stderr)
			}
		}
		// The Go client's own advice (its Config fields) means nothing to
		// the user of a host: the server says it in its flags only.
		if strings.Contains(stderr, "Config.") {
			t.Errorf("%s: stderr speaks of the Go client's Config:\n%s", tt.name, stderr)
		}
	}
}

// keptThenResumed registers session id with its token kept in file, then
// resumes it elsewhere with that token, and leaves file holding the token
// the resume replaced, as a server finds it when another one resumed the
// session before it. It returns file.
func keptThenResumed(t *testing.T, hubURL, key, id, file string) string {
	t.Helper()
	dial := func() *bootstrap.Client {
		c, err := bootstrap.DialPiggyback(t.Context(), bootstrap.Config{HubURL: hubURL, APIKey: key, SessionID: id,
			Surface: "codex", TokenStore: bootstrap.FileTokenStore(file), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatalf("dial %s: %v", id, err)
		}
		return c
	}
	_ = dial().Close()
	old, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	_ = dial().Close() // resumes with the kept token: it stops working
	if err := os.WriteFile(file, old, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}
