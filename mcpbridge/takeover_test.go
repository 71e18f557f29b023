package mcpbridge_test

import (
	"slices"
	"testing"

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
	eventually(t, "the former holder told it stopped", func() bool { return old.hasLog("stopped for good") })
	code, _ := old.toolErr("send_signal", map[string]any{"to": "alice", "text": "I am the old bob"})
	if code != "unauthorized" && code != "session_expired" && code != "forbidden" {
		t.Fatalf("the former holder's send: %s", code)
	}
}
