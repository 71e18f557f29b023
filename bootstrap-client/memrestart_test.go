package bootstrap_test

import (
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
)

// TestMemHubRestartReregisters: a hub on the in-memory store restarts and
// forgets every session. Each client's reattach is answered 410, it registers
// the same session id again (counted in Reregistrations), reattaches, and
// signals flow again.
func TestMemHubRestartReregisters(t *testing.T) {
	h1 := hubtest.Start(t, hubtest.Options{})
	fwdA, fwdB := newForwarder(t, h1.URL), newForwarder(t, h1.URL)
	var inB inbox
	a := dialConfig(t, bootstrap.Config{HubURL: fwdA.URL(), APIKey: h1.APIKey, SessionID: "agent-a"})
	b := dialConfig(t, bootstrap.Config{HubURL: fwdB.URL(), APIKey: h1.APIKey, SessionID: "agent-b", OnSignal: inB.on})
	sendN(t, a, "agent-b", 1, 2)
	waitFor(t, "b to get 1..2", func() bool { return inB.len() == 2 })

	h1.Close()
	h2 := hubtest.Start(t, hubtest.Options{Config: hub.Config{
		APIKeys:    map[string]hub.TenantProject{h1.APIKey: {TenantID: "t1", ProjectID: "p1"}},
		AdminToken: h1.AdminToken,
	}})
	fwdA.retarget(h2.URL)
	fwdB.retarget(h2.URL)

	for _, c := range []*bootstrap.Client{a, b} {
		waitFor(t, c.SessionID()+" to re-register and reattach", func() bool {
			st := c.Stats()
			return st.Reregistrations == 1 && st.Reconnects >= 1
		})
	}
	waitFor(t, "b attached on the new hub", func() bool { return opsRouteState(t, h2, "agent-b")["route_state"] == "attached" })
	res, err := a.Send(t.Context(), "agent-b", "chat", map[string]any{"n": 3})
	if err != nil {
		t.Fatalf("send after the restart: %v", err)
	}
	if res.Seq != 1 || res.Delivery != "pushed_to_ws" {
		t.Fatalf("send after the restart: %+v, want seq 1 (a new session) pushed_to_ws", res)
	}
	waitFor(t, "b to receive after the restart", func() bool { return inB.len() == 3 })
	if a.SessionID() != "agent-a" || b.SessionID() != "agent-b" {
		t.Errorf("session ids %q %q, want the same ids re-registered", a.SessionID(), b.SessionID())
	}
}

// TestKeptTokenOfALostSessionRegistersAnew: an agent that keeps its token
// stops, the hub on the in-memory store restarts meanwhile, and the agent
// starts again. Its resume finds no session: the id is registered anew, and
// the agent is told what a restart cannot hide, that what was sent to the
// old session is gone: a warning, OnAffinityReset once, and
// Stats().Reregistrations.
func TestKeptTokenOfALostSessionRegistersAnew(t *testing.T) {
	h1 := hubtest.Start(t, hubtest.Options{})
	store := bootstrap.FileTokenStore(filepath.Join(t.TempDir(), "token.json"))
	first := dialConfig(t, bootstrap.Config{HubURL: h1.URL, APIKey: h1.APIKey, SessionID: "lost", TokenStore: store})
	_ = first.Close()
	h1.Close()
	h2 := hubtest.Start(t, hubtest.Options{Config: hub.Config{
		APIKeys:    map[string]hub.TenantProject{h1.APIKey: {TenantID: "t1", ProjectID: "p1"}},
		AdminToken: h1.AdminToken,
	}})

	var logs logRecorder
	var resets atomic.Int32
	again := dialConfig(t, bootstrap.Config{HubURL: h2.URL, APIKey: h1.APIKey, SessionID: "lost", TokenStore: store,
		Logger: slog.New(&logs), OnAffinityReset: func() { resets.Add(1) }})
	waitFor(t, "OnAffinityReset", func() bool { return resets.Load() == 1 })
	if st := again.Stats(); st.Reregistrations != 1 || st.Takeovers != 0 {
		t.Errorf("stats %+v, want one re-registration", st)
	}
	gone := logs.find("marconi: the kept token's session is gone (expired, deregistered, or a hub on the in-memory store restarted); registered the id anew, and what was sent to the old session is not delivered")
	if len(gone) != 1 || gone[0].level != slog.LevelWarn {
		t.Errorf("logged %+v, want one warning that the kept session is gone", gone)
	}
}
