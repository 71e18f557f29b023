package hub_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
)

// Queues the hub must not believe in: one recorded by an earlier process of
// an instance that restarted with the same id, and WebSockets of a session
// incarnation that was deregistered, replaced or re-registered elsewhere.

// noClearStore loses every ClearQueue, as a process that crashes before it
// records its queues' detach does: the store keeps saying it holds them.
type noClearStore struct{ sessionstore.Store }

func (noClearStore) ClearQueue(context.Context, sessionstore.Key, string, time.Time, time.Time) (bool, error) {
	return false, nil
}

// connEnd is how a client WebSocket ended: the frames it read first and
// the error that ended it (its close status says who closed it, and why).
type connEnd struct {
	frames []map[string]any
	err    error
}

// drainUntilClosed reads c until it ends, so that a server-side close
// completes at once, and reports what it read when c ends. The reader ends
// with c (the test's cleanup closes it at the latest).
func drainUntilClosed(c *websocket.Conn) <-chan connEnd {
	end := make(chan connEnd, 1)
	go func() {
		var e connEnd
		for {
			_, data, err := c.Read(context.Background())
			if err != nil {
				e.err = err
				end <- e
				return
			}
			var f map[string]any
			_ = json.Unmarshal(data, &f)
			e.frames = append(e.frames, f)
		}
	}()
	return end
}

// TestRestartedInstanceHoldsNoQueueOfItsPredecessor: bob's queue is on
// hub-b; hub-b crashes (its detach never reaches the store) and starts again
// with the same id. hub-a must not take the recorded queue for a live one:
// bob has a route without a queue, and the send says recipient_route_stale.
// The reconnect grace window runs from the restart, so once it has passed an
// attach elsewhere is a new placement, not a resume (nor wrong_instance).
func TestRestartedInstanceHoldsNoQueueOfItsPredecessor(t *testing.T) {
	t.Parallel()
	c := newFabCluster(t, true, hub.Config{})
	a := c.start("hub-a", nil)
	b := c.start("hub-b", noClearStore{c.openStore("")})
	c.tick("hub-a", "hub-b")

	sender, _ := fabRegister(t, a, "sender", nil)
	bob, _ := fabRegister(t, a, "bob", nil)
	stick, _ := fabRegister(t, b, "stick", map[string]any{"runtime_mode": "sticky"})
	if got := assignedOf(t, a, "stick"); got != "hub-b" {
		t.Fatalf("stick is assigned to %q, want hub-b", got)
	}
	bobWS, _ := mustAttach(t, b, bob)
	stickWS, _ := mustAttach(t, b, stick)
	r := send(t, a, sender, "bob", "before the crash")
	checkDelivery(t, "bob attached on a live hub-b", r, "pushed_to_ws", "attached")

	// hub-b dies; its closes reach the clients but its detaches never reach
	// the store.
	bobDone, stickDone := drainUntilClosed(bobWS), drainUntilClosed(stickWS)
	b.Close()
	<-bobDone
	<-stickDone
	c.clock.Advance(5 * time.Second)
	c.start("hub-b", nil) // same id, a later StartedAt
	c.tick("hub-a")       // hub-a sees the new process

	rs := routeState(t, a, "bob")
	q := rs["queue"].(map[string]any)
	if rs["route_state"] != "route_without_queue" || q["attached"] != false || q["instance_id"] != "hub-b" || q["instance_healthy"] != true {
		t.Fatalf("bob's route on hub-a after hub-b restarted: %v, want route_without_queue, its old queue on a healthy hub-b not attached", rs)
	}
	if ex, _ := rs["explanation"].(string); !strings.Contains(ex, "hub-b, which has restarted since") {
		t.Errorf("explanation %q does not say that hub-b restarted", ex)
	}
	r = send(t, a, sender, "bob", "after the restart")
	checkDelivery(t, "bob's queue died with hub-b's old process", r, "queued_offline", "route_without_queue")
	if r["recipient_route_stale"] != true {
		t.Fatalf("send to bob: recipient_route_stale = %v, want true (%v)", r["recipient_route_stale"], r)
	}

	// The grace window started at the restart; let it pass with both
	// instances healthy.
	c.clock.Advance(61 * time.Second)
	c.tick("hub-a", "hub-b")
	c.tick("hub-a")
	_, w := mustAttach(t, a, bob)
	wantWelcome(t, "bob on hub-a, grace passed since hub-b restarted", w, false, false, 2)
	ws, w, st, body := tryDial(t, a, stick)
	if ws == nil {
		t.Fatalf("stick on hub-a after grace: %d %v, want a takeover (its queue on hub-b died at the restart)", st, body)
	}
	wantWelcome(t, "stick taken over after grace", w, false, true, 0)
	if ev := events(summary(t, a)); len(ev) != 1 || ev[0]["reason"] != "grace_expired" || ev[0]["from_instance"] != "hub-b" {
		t.Fatalf("fallback events %v, want one grace_expired from hub-b", ev)
	}
}

// waitEnd waits for a drained connection to end and fails unless it was
// closed with code after reading no signal.
func waitEnd(t *testing.T, what string, end <-chan connEnd, code int) {
	t.Helper()
	select {
	case e := <-end:
		if got := closeStatus(e.err); got != code {
			t.Fatalf("%s: connection ended with %d (%v), want %d", what, got, e.err, code)
		}
		for _, f := range e.frames {
			if f["type"] == "signal" {
				t.Fatalf("%s: the connection got %v before it closed; it must get nothing", what, f)
			}
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the connection is still open after 10 s, want it closed with %d", what, code)
	}
}

// deregister deletes a's session through h.
func deregister(t *testing.T, h *hubtest.Hub, a agent) {
	t.Helper()
	if st, body := call(t, "DELETE", h.URL+"/v1/session", a.Token, nil); st != http.StatusNoContent {
		t.Fatalf("deregister %s on %s: %d %v", a.ID, h.Server.InstanceID(), st, body)
	}
}

// TestDeregisterElsewhereClosesConnection: bob's WebSocket is on b; bob
// deregisters through a. b's pending sweep finds the session gone and closes
// the connection with 4410.
func TestDeregisterElsewhereClosesConnection(t *testing.T) {
	t.Parallel()
	p := startPair(t, pairOptions{sweepB: 50 * time.Millisecond})
	bob := register(t, p.a, "bob", "claude_code")
	c, _ := dial(t, p.b, bob)
	end := drainUntilClosed(c)
	deregister(t, p.a, bob)
	waitEnd(t, "bob's connection on b after a deregistered bob", end, 4410)
}

// TestKeepaliveFindsSessionGone: with the pending sweep off, the ping loop's
// proof-of-life write is what finds a session deregistered on another
// instance: the connection is closed with 4410.
func TestKeepaliveFindsSessionGone(t *testing.T) {
	t.Parallel()
	c := fabStartDurable(t, hub.Config{PendingSweep: noSweep, WSPingInterval: 50 * time.Millisecond}, "hub-a", "hub-b")
	bob, _ := fabRegister(t, c.hubs["hub-a"], "bob", nil)
	ws, _ := mustAttach(t, c.hubs["hub-b"], bob)
	end := drainUntilClosed(ws)
	deregister(t, c.hubs["hub-a"], bob)
	waitEnd(t, "bob's connection on hub-b after hub-a deregistered bob", end, 4410)
}

// TestReregisteredSessionIsNotAnOldConnectionsBusiness: bob's WebSocket is
// on b; bob deregisters through a and registers again there. a's check
// wake-ups to b are lost and b's pending sweep is off, so the old connection
// lingers: whatever reaches it (an ack
// it sends, a wake-up, a send through b) must not hand it the new session's
// signals nor let it ack them. It is closed with 4410 instead, and the new
// session gets every signal when it attaches.
func TestReregisteredSessionIsNotAnOldConnectionsBusiness(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// poke reaches the old connection after the new session has
		// signals 1 and 2 and before the old connection is closed.
		poke func(t *testing.T, p *pair, old *websocket.Conn, alice agent)
	}{
		{"ack from the old connection", func(t *testing.T, _ *pair, old *websocket.Conn, _ agent) {
			writeFrame(t, old, map[string]any{"type": "ack", "up_to_seq": 2})
		}},
		{"wake-up on b", func(t *testing.T, p *pair, _ *websocket.Conn, _ agent) {
			p.b.Server.WakeLocal(sessionstore.Wake{Key: sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}, Seq: 1})
		}},
		{"send through b", func(t *testing.T, p *pair, _ *websocket.Conn, alice agent) {
			r := send(t, p.b, alice, "bob", 3)
			checkDelivery(t, "send through b to the new bob", r, "queued_offline", "route_without_queue")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := startPair(t, pairOptions{sweepB: noSweep})
			alice := register(t, p.a, "alice", "claude_code")
			bob := register(t, p.a, "bob", "claude_code")
			old, _ := dial(t, p.b, bob)

			// Without this, a's check wake-up would close the old
			// connection before the poke (an ack write then fails).
			p.dropA.drop.Store(true)
			deregister(t, p.a, bob)
			bob2 := register(t, p.a, "bob", "claude_code")
			for i := 1; i <= 2; i++ {
				r := send(t, p.a, alice, "bob", i)
				checkDelivery(t, "send through a to the new bob", r, "queued_offline", "route_without_queue")
			}
			end := drainUntilClosed(old)
			tc.poke(t, p, old, alice)
			waitEnd(t, "the old bob's connection", end, 4410)

			want := 2
			if tc.name == "send through b" {
				want = 3
			}
			if n := routeState(t, p.a, "bob")["pending_signals"]; n != float64(want) {
				t.Fatalf("the new bob has %v pending signals, want %d: none acked", n, want)
			}
			c, w := dial(t, p.a, bob2)
			if w["replayed"] != float64(want) {
				t.Fatalf("the new bob's welcome %v, want replayed %d", w, want)
			}
			seqs, _ := xiSignals(t, c, want)
			xiWantSeqs(t, "the new bob's signals", seqs, 1)
		})
	}
}

// TestReconnectElsewhereClosesOldConnection: bob's WebSocket is on b and bob
// attaches again on a while it lingers (a half-open connection). b's pending
// sweep sees the newer queue on a and closes its own with 4409; bob's
// signals go to a.
func TestReconnectElsewhereClosesOldConnection(t *testing.T) {
	t.Parallel()
	p := startPair(t, pairOptions{sweepB: 50 * time.Millisecond})
	alice := register(t, p.a, "alice", "claude_code")
	bob := register(t, p.a, "bob", "claude_code")
	old, _ := dial(t, p.b, bob)
	end := drainUntilClosed(old)
	c, _ := dial(t, p.a, bob)
	waitEnd(t, "bob's old connection on b", end, 4409)
	// b's view of the instances may predate a's first heartbeat (both
	// started at once): refresh it until it holds a healthy.
	waitFor(t, "b to see a healthy", func() bool {
		return p.b.Server.Fabric().Members.Refresh(context.Background()) == nil && p.b.Server.Fabric().Members.Healthy(context.Background(), "a")
	})
	r := send(t, p.b, alice, "bob", "to the new connection")
	checkDelivery(t, "send through b to bob attached on a", r, "pushed_to_ws", "attached")
	if seqs, _ := xiSignals(t, c, 1); seqs[0] != 1 {
		t.Fatalf("bob's new connection got seq %d, want 1", seqs[0])
	}
}
