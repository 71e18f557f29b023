package mcpbridge_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/marconihub/marconi/hub/hubtest"
)

// A host that lost its state directory comes back under its name with
// --takeover: it gets the session's pending signals, and the former holder's
// server is told (an error log message) that its client stopped for good.
func TestTakeoverByAHostWithoutItsToken(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	alice := startAgent(t, "alice", h.URL, h.APIKey)
	old := startAgent(t, "bob", h.URL, h.APIKey)
	alice.send("bob", "waiting", nil)
	eventually(t, "the first bob holds the signal", func() bool {
		var me whoami
		old.ok("whoami", nil, &me)
		return me.Pending == 1
	})

	bob := startAgent(t, "bob", h.URL, h.APIKey, "--takeover") // a fresh state directory
	var got []signal
	bob.readUntil(1, &got)
	if tx := texts(t, got); !slices.Equal(tx, []string{"waiting"}) {
		t.Fatalf("the new bob read %v", tx)
	}
	eventually(t, "the former holder told it stopped", func() bool { return old.hasLog("another connection took this session over") })
	if code, _ := old.toolErr("send_signal", map[string]any{"to": "alice", "text": "I am the old bob"}); code != "replaced" {
		t.Fatalf("the former holder's send: %s, want replaced", code)
	}
}

// A host that starts the server twice for one agent (the same --session and
// state directory): the second resumes the session with the kept token and
// the first is replaced. The first then answers every tool with the error
// `replaced`, saying to stop one of the two, rather than a hub error about
// an expired session; it hands out none of the signals it still held, which
// the second gets: each signal reaches one agent.
func TestTheSameAgentStartedTwice(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	stateDir := "--state-dir=" + t.TempDir()
	alice := startAgent(t, "alice", h.URL, h.APIKey)
	first := startAgent(t, "bob", h.URL, h.APIKey, stateDir)
	alice.send("bob", "held", nil)
	eventually(t, "the first bob holds the signal", func() bool {
		var me whoami
		first.ok("whoami", nil, &me)
		return me.Pending == 1
	})

	second := startAgent(t, "bob", h.URL, h.APIKey, stateDir)
	eventually(t, "the first bob told it was replaced", func() bool { return first.hasLog("Stop one of the two") })
	for _, tool := range []string{"read_signals", "whoami"} {
		if code, msg := first.toolErr(tool, nil); code != "replaced" || !strings.Contains(msg, "--session") {
			t.Errorf("the first bob's %s: %s %q, want replaced, naming --session", tool, code, msg)
		}
	}
	if code, _ := first.toolErr("send_signal", map[string]any{"to": "alice", "text": "me too"}); code != "replaced" {
		t.Errorf("the first bob's send_signal: %s, want replaced", code)
	}
	if res, err := first.session.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: "marconi://inbox"}); err == nil ||
		!strings.Contains(err.Error(), "replaced") {
		t.Errorf("the first bob's marconi://inbox: %v, %v; want an error saying it was replaced, not the signal it held", res, err)
	}
	var got []signal
	second.readUntil(1, &got)
	if tx := texts(t, got); !slices.Equal(tx, []string{"held"}) {
		t.Fatalf("the second bob read %v", tx)
	}
}
