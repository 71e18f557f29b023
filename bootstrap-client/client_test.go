package bootstrap

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestNewClientConfig(t *testing.T) {
	ok := Config{HubURL: "http://127.0.0.1:8080/", APIKey: "k", Surface: "claude_code"}
	c, err := newClient(ok)
	if err != nil {
		t.Fatal(err)
	}
	defer c.cancel()
	if u, _ := c.hub(); u != "http://127.0.0.1:8080" {
		t.Errorf("hub URL = %q, want the trailing slash trimmed", u)
	}
	if c.backoff.base != 250*time.Millisecond || c.backoff.max != 15*time.Second {
		t.Errorf("default backoff %v..%v, want 250ms..15s", c.backoff.base, c.backoff.max)
	}
	if c.cfg.ReconnectRestartMaxDelay != 4*time.Second {
		t.Errorf("default restart cap %v, want 4s", c.cfg.ReconnectRestartMaxDelay)
	}
	if c.log == nil {
		t.Error("nil logger not replaced by a discard logger")
	}
	if got := c.transport.MaxIdleConnsPerHost; got != 16 {
		t.Errorf("own transport keeps %d idle connections per host, want 16", got)
	}

	bad := map[string]Config{
		"no URL":               {APIKey: "k", Surface: "claude_code"},
		"ws scheme":            {HubURL: "ws://h", APIKey: "k", Surface: "claude_code"},
		"no key":               {HubURL: "http://h", Surface: "claude_code"},
		"no surface":           {HubURL: "http://h", APIKey: "k"},
		"negative":             {HubURL: "http://h", APIKey: "k", Surface: "codex", ReconnectBaseDelay: -1},
		"negative restart cap": {HubURL: "http://h", APIKey: "k", Surface: "codex", ReconnectRestartMaxDelay: -1},
		"max below base":       {HubURL: "http://h", APIKey: "k", Surface: "codex", ReconnectBaseDelay: time.Second, ReconnectMaxDelay: time.Millisecond},
		"negative idle conns":  {HubURL: "http://h", APIKey: "k", Surface: "codex", IdleConnsPerHost: -1},
	}
	for name, cfg := range bad {
		if _, err := newClient(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	big, err := newClient(Config{HubURL: "http://h", APIKey: "k", Surface: "codex", ReconnectBaseDelay: time.Minute})
	if err != nil {
		t.Fatalf("base above the default cap with no cap set: %v", err)
	}
	defer big.cancel()
	if big.backoff.max != time.Minute {
		t.Errorf("cap = %v, want raised to the base", big.backoff.max)
	}
	if big.cfg.ReconnectRestartMaxDelay != time.Minute {
		t.Errorf("restart cap = %v, want raised to the base", big.cfg.ReconnectRestartMaxDelay)
	}
	low, err := newClient(Config{HubURL: "http://h", APIKey: "k", Surface: "codex", ReconnectMaxDelay: time.Second, ReconnectRestartMaxDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer low.cancel()
	if low.cfg.ReconnectRestartMaxDelay != time.Second {
		t.Errorf("restart cap = %v, want never above ReconnectMaxDelay (1s)", low.cfg.ReconnectRestartMaxDelay)
	}
}

// Many sends of one connection generation reporting sender_route_stale at
// once request one reconnect; a late report about a former generation none.
func TestRequestSelfHealOncePerGeneration(t *testing.T) {
	c, err := newClient(Config{HubURL: "http://h", APIKey: "k", Surface: "claude_code"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.cancel()
	c.gen = 3
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.requestSelfHeal(3)
		}()
	}
	wg.Wait()
	if got := c.Stats().SelfHealReconnects; got != 1 {
		t.Fatalf("SelfHealReconnects = %d after 50 concurrent reports, want 1", got)
	}
	if len(c.heal) != 1 || !c.immediate || c.healFor != 3 {
		t.Fatalf("wake-ups pending %d, immediate %v, healFor %d; want 1, true, 3", len(c.heal), c.immediate, c.healFor)
	}
	<-c.heal

	c.gen = 4 // the reconnect happened
	c.requestSelfHeal(3)
	if got := c.Stats().SelfHealReconnects; got != 1 || len(c.heal) != 0 {
		t.Errorf("a report about generation 3 after generation 4 attached caused a reconnect")
	}
	c.requestSelfHeal(4)
	if got := c.Stats().SelfHealReconnects; got != 2 {
		t.Errorf("SelfHealReconnects = %d, want 2: the new connection may be healed too", got)
	}

	c.stopped = true
	c.gen = 5
	c.requestSelfHeal(5)
	if got := c.Stats().SelfHealReconnects; got != 2 {
		t.Error("a stopped client (replaced by a newer connection) reconnected: it must not fight")
	}
}

// Sends made concurrently keep their connections: the client's own
// transport does not close all but two after each burst and dial them
// again for the next. The stand-in answers the sends of a burst only once
// all of them are in flight, so each burst holds that many connections at
// once; a Send returns after its answer's last byte, when its connection
// is back among the idle ones, so the next burst finds them all.
func TestConcurrentSendsReuseTheirConnections(t *testing.T) {
	const senders, bursts = 8, 5
	h := newBurstHub(t, newBurst(senders))
	c, err := Dial(t.Context(), Config{HubURL: h.url, APIKey: "k", Surface: "headless_cc", PingInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range bursts {
		before := h.opened()
		// A send that fails lets the others of its burst go.
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		for range senders {
			wg.Go(func() {
				if _, err := c.Send(ctx, "r", "k", "p"); err != nil {
					t.Error(err)
					cancel()
				}
			})
		}
		wg.Wait()
		cancel()
		if t.Failed() {
			return
		}
		if opened := h.opened() - before; i > 0 && opened > 0 {
			t.Errorf("burst %d of %d concurrent sends opened %d connections, want none: the first burst's are kept", i+1, senders, opened)
		}
	}
}
