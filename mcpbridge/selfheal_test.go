package mcpbridge_test

import (
	"slices"
	"testing"

	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/wsproxy"
)

// SPEC-168 AC-4 through MCP. Alice's WebSocket goes half-open (the hub's side
// cut, hers open and silent): the hub detaches her queue while her bridge
// believes it is attached. Bob's sends to her are stored (queued_offline) and
// tell him recipient_route_stale, on which his bridge does not reconnect.
// Alice's next send_signal reports sender_route_stale: her bridge reconnects,
// tells its host in a log message, delivery resumes, and she reads every
// signal, in order, nothing lost.
func TestSenderRouteStaleReconnectsThroughMCP(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	proxy := wsproxy.New(t, h.URL)
	alice := startAgent(t, "alice", proxy.URL(), h.APIKey)
	bob := startAgent(t, "bob", h.URL, h.APIKey)

	var got, bobGot []signal // bob's sends return what waits for him too
	bob.send("alice", "before", &bobGot)
	alice.readUntil(1, &got)
	_, bobAttachedAt := routeState(t, h.URL, h.AdminToken, "bob")

	proxy.Zombify()
	eventually(t, "the hub sees alice's route without a queue", func() bool {
		st, _ := routeState(t, h.URL, h.AdminToken, "alice")
		return st == "route_without_queue"
	})
	r := bob.send("alice", "during", &bobGot)
	if r.Delivery != "queued_offline" || !r.RecipientRouteStale || r.SenderRouteStale {
		t.Fatalf("bob's send to the half-open alice: %+v", r)
	}

	r = alice.send("bob", "I am here", &got)
	if !r.SenderRouteStale || r.SelfhealOutcome == nil || *r.SelfhealOutcome != "attempted" {
		t.Fatalf("alice's send over a half-open route: %+v", r)
	}
	eventually(t, "alice's bridge reconnected and the hub has her queue again", func() bool {
		st, _ := routeState(t, h.URL, h.AdminToken, "alice")
		return st == "attached"
	})
	eventually(t, "alice's host told of the self-heal in a log message", func() bool {
		return alice.hasLog("sender_route_stale") && alice.hasLog("attached")
	})

	r = bob.send("alice", "after", &bobGot)
	if r.Delivery != "pushed_to_ws" {
		t.Fatalf("bob's send after the repair: %+v", r)
	}
	alice.readUntil(3, &got)
	if tx := texts(t, got); !slices.Equal(tx, []string{"before", "during", "after"}) {
		t.Fatalf("alice read %v", tx)
	}
	// A bare recipient_route_stale made bob reconnect nothing.
	if st, at := routeState(t, h.URL, h.AdminToken, "bob"); st != "attached" || at != bobAttachedAt {
		t.Fatalf("bob's route %s attached at %s, was attached at %s: bob reconnected", st, at, bobAttachedAt)
	}
	bob.readUntil(1, &bobGot)
	if tx := texts(t, bobGot); !slices.Equal(tx, []string{"I am here"}) {
		t.Fatalf("bob read %v", tx)
	}
}
