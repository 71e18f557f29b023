package hub_test

import (
	"testing"

	"github.com/marconihub/marconi/hub/hubtest"
)

// One instance without a bus has no other instance to save a hop to: its
// answers name none, even with the recipient attached to it.
func TestSendAnswerNamesNoInstanceWithoutPeers(t *testing.T) {
	t.Parallel()
	h := hubtest.Start(t, hubtest.Options{})
	alice := register(t, h, "alice", "claude_code")
	bob := register(t, h, "bob", "claude_code")
	_, _ = dial(t, h, bob)
	ans := send(t, h, alice, "bob", 1)
	if ans["recipient_route_state"] != "attached" {
		t.Fatalf("bob is not attached: %v", ans)
	}
	if got, ok := ans["recipient_instance_url"]; ok {
		t.Fatalf("a lone instance names %v", got)
	}
}
