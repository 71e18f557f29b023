package mcpbridge_test

import (
	"slices"
	"testing"

	"github.com/marconihub/marconi/hub/hubtest"
)

// A codex surface holds no WebSocket: its bridge reads by drain and gets
// what waits for it back with its sends (piggyback), each signal once.
func TestCodexReadsByDrainAndPiggyback(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	alice := startAgent(t, "alice", h.URL, h.APIKey)
	codex := startAgent(t, "cx", h.URL, h.APIKey, "--surface", "codex")

	var me whoami
	codex.ok("whoami", nil, &me)
	if me.Surface != "codex" || me.RouteState == "attached" {
		t.Fatalf("codex whoami: %+v", me)
	}
	r := alice.send("cx", "by drain", nil)
	if r.Delivery == "pushed_to_ws" {
		t.Fatalf("a signal to codex was pushed: %+v", r)
	}
	var got []signal
	codex.readUntil(1, &got)

	alice.send("cx", "by piggyback", nil)
	back := codex.send("alice", "hello from codex", &got)
	if back.SenderRouteStale {
		t.Fatalf("codex was told to reconnect: %+v", back)
	}
	if len(back.Received) != 1 {
		t.Fatalf("codex's send brought back %d signals, want the one waiting", len(back.Received))
	}
	var again readResult
	codex.ok("read_signals", nil, &again)
	got = append(got, again.Signals...)
	if tx := texts(t, got); !slices.Equal(tx, []string{"by drain", "by piggyback"}) {
		t.Fatalf("codex read %v", tx)
	}
	var aliceGot []signal
	alice.readUntil(1, &aliceGot)
	if tx := texts(t, aliceGot); !slices.Equal(tx, []string{"hello from codex"}) {
		t.Fatalf("alice read %v", tx)
	}
}
