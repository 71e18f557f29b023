package mcpbridge_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/marconihub/marconi/hub/hubtest"
)

// The host killed with its server and started again resumes the session from
// the state directory and finds every signal it had not read: those sent
// before, and those sent while it was gone. A signal an answer returned is
// acknowledged and does not come again.
func TestHostRestartResumesFromStateDir(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	state := t.TempDir()
	alice := startAgent(t, "alice", h.URL, h.APIKey)
	bob := startAgent(t, "bob", h.URL, h.APIKey, "--state-dir", state)

	for _, s := range []string{"one", "two", "three"} {
		alice.send("bob", s, nil)
	}
	eventually(t, "bob's bridge holds three signals", func() bool {
		var me whoami
		bob.ok("whoami", nil, &me)
		return me.Pending == 3
	})
	var first readResult
	bob.ok("read_signals", map[string]any{"max": 1}, &first)
	if tx := texts(t, first.Signals); !slices.Equal(tx, []string{"one"}) {
		t.Fatalf("first read %v", tx)
	}
	// The answer was written: "one" is acknowledged; two and three, held by
	// the bridge but never returned, are not.
	eventually(t, "the hub holds two unacknowledged signals for bob", func() bool {
		var p struct{ Total int }
		opsGet(t, h.URL, h.AdminToken, "/v1/ops/sessions/t1/p1/bob/signals", &p)
		return p.Total == 2
	})
	info, err := os.Stat(filepath.Join(state, "bob.json"))
	if err != nil {
		t.Fatalf("the token is not kept in the state directory: %v", err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode %v, want 0600", info.Mode().Perm())
	}

	bob.kill()
	alice.send("bob", "four", nil)

	bob = startAgent(t, "bob", h.URL, h.APIKey, "--state-dir", state)
	var got []signal
	bob.readUntil(3, &got)
	if tx := texts(t, got); !slices.Equal(tx, []string{"two", "three", "four"}) {
		t.Fatalf("after the restart bob read %v", tx)
	}
	var me whoami
	bob.ok("whoami", nil, &me)
	if me.SessionID != "bob" || me.RouteState != "attached" {
		t.Fatalf("whoami after restart: %+v", me)
	}
	// The same session, resumed: alice's signals kept their seqs.
	if got[2].Seq != 4 {
		t.Fatalf("four has seq %d, want 4 (the session was registered anew)", got[2].Seq)
	}
}

// A server whose host closed stdin does not deregister: the session lives,
// a host without its token is refused it (403 at start, exit 1), and the
// host with the state directory resumes it; --deregister-on-exit ends it.
func TestExitKeepsSessionUnlessDeregisterOnExit(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	state := t.TempDir()
	alice := startAgent(t, "alice", h.URL, h.APIKey)
	bob := startAgent(t, "bob", h.URL, h.APIKey, "--state-dir", state)
	alice.send("bob", "kept", nil)
	bob.stop()
	if st, _ := routeState(t, h.URL, h.AdminToken, "bob"); st == "not_registered" {
		t.Fatal("closing the host deregistered the session")
	}

	cmd := exec.Command(marconiBin, "mcp", "--hub", h.URL, "--api-key", h.APIKey, "--session", "bob", "--state-dir", t.TempDir())
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "403 forbidden") {
		t.Fatalf("a host without the token: %v\n%s", err, out)
	}

	bob = startAgent(t, "bob", h.URL, h.APIKey, "--state-dir", state, "--deregister-on-exit")
	var got []signal
	bob.readUntil(1, &got)
	if tx := texts(t, got); !slices.Equal(tx, []string{"kept"}) {
		t.Fatalf("after the restart bob read %v", tx)
	}
	bob.stop()
	t.Cleanup(func() { // what the bridge said of its exit, should it not deregister
		if t.Failed() {
			t.Logf("bob's stderr:\n%s", bob.stderr.String())
		}
	})
	eventually(t, "bob deregistered on exit", func() bool {
		st, _ := routeState(t, h.URL, h.AdminToken, "bob")
		return st == "not_registered"
	})
}
