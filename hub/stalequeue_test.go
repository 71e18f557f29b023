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
	"github.com/marconihub/marconi/sessionstore"
)

// Queues the hub must not believe in: one recorded by an earlier process of
// an instance that restarted with the same id, and WebSockets of a session
// incarnation that was deregistered, replaced or re-registered elsewhere.

// noClearStore loses every ClearQueue, as a process that crashes before it
// records its queues' detach does: the store keeps saying it holds them.
type noClearStore struct{ sessionstore.Store }

func (noClearStore) ClearQueue(context.Context, sessionstore.Key, string, time.Time) (bool, error) {
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

var _ = http.StatusOK
