package hub_test

import (
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/signals/selfheal"
)

// TestRouteStateExplanation: the one sentence an operator reads says what
// heals each kind of route_without_queue session.
func TestRouteStateExplanation(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	register(t, h, "agent", "claude_code")
	register(t, h, "batch", "codex")
	if e := routeState(t, h, "agent")["explanation"].(string); !strings.Contains(e, "sender_route_stale and its client reconnects") {
		t.Errorf("live surface: %q", e)
	}
	// An agent killed mid-stream looks the same to the hub: the sentence must
	// also say what brings that one back, or the operator waits for a send.
	if e := routeState(t, h, "agent")["explanation"].(string); !strings.Contains(e, "If its process stopped") || !strings.Contains(e, "resumes the session") {
		t.Errorf("live surface, a process that stopped: %q", e)
	}
	if e := routeState(t, h, "batch")["explanation"].(string); !strings.Contains(e, "piggyback-only") || strings.Contains(e, "sender_route_stale") {
		t.Errorf("codex: %q", e)
	}
	if e := routeState(t, h, "nobody")["explanation"].(string); !strings.Contains(e, "No live session") {
		t.Errorf("not registered: %q", e)
	}

	off := selfheal.DefaultConfig()
	off.Enabled = false
	h2 := hubtest.Start(t, hubtest.Options{Config: hub.Config{Mode: "lan", SelfHeal: off}})
	register(t, h2, "agent", "claude_code")
	if e := routeState(t, h2, "agent")["explanation"].(string); !strings.Contains(e, "Self-heal is off") || !strings.Contains(e, "If its process stopped") {
		t.Errorf("self-heal off: %q", e)
	}

	clock := hubtest.NewClock(time.Now())
	h3 := hubtest.Start(t, hubtest.Options{Now: clock.Now})
	register(t, h3, "ghost", "claude_code")
	clock.Advance(10 * time.Minute)
	if rs := routeState(t, h3, "ghost"); rs["route_state"] != "stale" || !strings.Contains(rs["explanation"].(string), "genuinely offline") {
		t.Errorf("stale: %v %q", rs["route_state"], rs["explanation"])
	}
}
