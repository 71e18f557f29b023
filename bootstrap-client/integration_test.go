package bootstrap_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/testwait"
	"github.com/marconihub/marconi/internal/wsproxy"
)

// inbox records what OnSignal received, in order.
type inbox struct {
	mu   sync.Mutex
	sigs []bootstrap.Signal
	// gate, when set, is waited on before each signal is recorded.
	gate func(bootstrap.Signal)
}

func (in *inbox) on(s bootstrap.Signal) {
	if in.gate != nil {
		in.gate(s)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.sigs = append(in.sigs, s)
}

func (in *inbox) ids() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	ids := make([]string, len(in.sigs))
	for i, s := range in.sigs {
		ids[i] = s.ID
	}
	return ids
}

func (in *inbox) len() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.sigs)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.For(t, what, 10*time.Second, cond)
}

func dial(t *testing.T, url, apiKey, id string, in *inbox) *bootstrap.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := bootstrap.Config{
		HubURL: url, APIKey: apiKey, SessionID: id, Surface: "claude_code",
		ReconnectBaseDelay: 5 * time.Millisecond, ReconnectMaxDelay: 50 * time.Millisecond,
	}
	if in != nil {
		cfg.OnSignal = in.on
	}
	c, err := bootstrap.Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("Dial %s: %v", id, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func send(t *testing.T, c *bootstrap.Client, to string, payload any) bootstrap.SendResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.Send(ctx, to, "test", payload)
	if err != nil {
		t.Fatalf("Send to %s: %v", to, err)
	}
	return res
}

func TestTwoClientsExchangeSignals(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	var inA, inB inbox
	a := dial(t, h.URL, h.APIKey, "agent-a", &inA)
	b := dial(t, h.URL, h.APIKey, "agent-b", &inB)

	var sent []string
	for i := range 10 {
		res := send(t, a, b.SessionID(), map[string]int{"n": i})
		if res.Delivery != "pushed_to_ws" || res.RecipientRouteState != "attached" || res.Seq != int64(i+1) {
			t.Fatalf("send %d = %+v, want pushed_to_ws to an attached recipient, seq %d", i, res, i+1)
		}
		sent = append(sent, res.SignalID)
	}
	waitFor(t, "b to receive ten signals", func() bool { return inB.len() == 10 })
	if got := inB.ids(); !slices.Equal(got, sent) {
		t.Errorf("b received %v, want %v in order", got, sent)
	}
	inB.mu.Lock()
	first := inB.sigs[0]
	inB.mu.Unlock()
	var p struct{ N int }
	if err := json.Unmarshal(first.Payload, &p); err != nil || p.N != 0 || first.FromSession != "agent-a" ||
		first.ToSession != "agent-b" || first.Kind != "test" || first.CreatedAt.IsZero() {
		t.Errorf("first signal = %+v (payload %s)", first, first.Payload)
	}

	res := send(t, b, a.SessionID(), "pong")
	waitFor(t, "a to receive the reply", func() bool { return inA.len() == 1 })
	if got := inA.ids(); got[0] != res.SignalID {
		t.Errorf("a received %v, want [%s]", got, res.SignalID)
	}
	for _, c := range []*bootstrap.Client{a, b} {
		if st := routeStats(c); st != (bootstrap.Stats{}) {
			t.Errorf("%s stats %+v on a healthy hub, want zero", c.SessionID(), st)
		}
	}
}

// A WebSocket that dies while signals are in flight: the hub replays what was
// not acknowledged on the reattach, and the handler still sees each id once,
// in order.
func TestNoDuplicatesAcrossReconnects(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	p := wsproxy.New(t, h.URL)
	a := dial(t, h.URL, h.APIKey, "sender", nil)

	// b's handler blocks on its third signal until the connection has been cut.
	release := make(chan struct{})
	var once sync.Once
	inB := &inbox{}
	inB.gate = func(s bootstrap.Signal) {
		if s.Seq == 3 {
			once.Do(func() { <-release })
		}
	}
	b := dial(t, p.URL(), h.APIKey, "receiver", inB)

	var sent []string
	for i := range 6 {
		sent = append(sent, send(t, a, "receiver", i).SignalID)
	}
	waitFor(t, "b to hold its third signal", func() bool { return inB.len() == 2 })
	p.Sever() // signals 3..6 are pushed but not acknowledged
	close(release)
	waitFor(t, "b to reconnect", func() bool { return b.Stats().Reconnects >= 1 })
	for i := range 4 {
		sent = append(sent, send(t, a, "receiver", 100+i).SignalID)
	}
	waitFor(t, "b to receive every signal", func() bool { return inB.len() >= len(sent) })
	// A duplicate of a replayed signal would have come before the last new one.
	if got := inB.ids(); !slices.Equal(got, sent) {
		t.Errorf("b received %v\nwant exactly %v", got, sent)
	}
	if st := b.Stats(); st.SelfHealReconnects != 0 || st.Reregistrations != 0 {
		t.Errorf("b stats %+v", st)
	}
}

// SPEC-168 AC-4: the hub lost the sender's queue while the client believes it
// is attached; concurrent sends all report sender_route_stale; the client
// reconnects once, and signals reach it on the WebSocket again.
func TestSenderRouteStaleReconnectsOnce(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	p := wsproxy.New(t, h.URL)
	var inA inbox
	a := dial(t, p.URL(), h.APIKey, "stale-sender", &inA)
	b := dial(t, h.URL, h.APIKey, "peer", nil)
	p.Zombify()
	// The hub notices the cut hub side and detaches a's queue.
	waitFor(t, "the hub to detach a's queue", func() bool {
		return send(t, b, "stale-sender", "probe").RecipientRouteState != "attached"
	})

	var wg sync.WaitGroup
	results := make(chan bootstrap.SendResult, 10)
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := a.Send(context.Background(), "peer", "", i)
			if err != nil {
				t.Errorf("Send: %v", err)
				return
			}
			results <- res
		}()
	}
	wg.Wait()
	close(results)
	stale := 0
	for res := range results {
		if res.SenderRouteStale {
			stale++
		}
	}
	if stale == 0 {
		t.Fatal("no send reported sender_route_stale: the test did not reproduce the asymmetry")
	}
	waitFor(t, "a to reattach", func() bool { return a.Stats().Reconnects == 1 })
	if st := a.Stats(); st.SelfHealReconnects != 1 {
		t.Errorf("a stats %+v after %d stale answers, want exactly one self-heal reconnect", st, stale)
	}
	// The probes b sent while a was cut off are replayed; live ones follow.
	res := send(t, b, "stale-sender", "after repair")
	if res.Delivery != "pushed_to_ws" {
		t.Errorf("send to the healed session: delivery %q, want pushed_to_ws", res.Delivery)
	}
	waitFor(t, "a to receive the live signal", func() bool { return slices.Contains(inA.ids(), res.SignalID) })
	if st := a.Stats(); st.Reconnects != 1 || st.SelfHealReconnects != 1 {
		t.Errorf("a stats %+v at the end, want one reconnect", st)
	}
}

// recipient_route_stale alone is the recipient's problem: the sender logs it
// and changes nothing. The recipient repairs on its own next send.
func TestRecipientRouteStaleAloneCausesNoReconnect(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	p := wsproxy.New(t, h.URL)
	a := dial(t, h.URL, h.APIKey, "healthy", nil)
	var inB inbox
	b := dial(t, p.URL(), h.APIKey, "cut-off", &inB)
	p.Zombify()

	var stale bootstrap.SendResult
	var sent []string // sends before the hub noticed went to the dead socket; all must arrive
	waitFor(t, "recipient_route_stale", func() bool {
		stale = send(t, a, "cut-off", "hello")
		sent = append(sent, stale.SignalID)
		return stale.RecipientRouteStale
	})
	if stale.SenderRouteStale || stale.Delivery != "queued_offline" || stale.SelfhealOutcome != "attempted" {
		t.Errorf("send to a cut-off recipient = %+v", stale)
	}
	if st := routeStats(a); st != (bootstrap.Stats{}) {
		t.Errorf("sender stats %+v: recipient_route_stale alone must cause no reconnect", st)
	}

	// The recipient's own send tells it its route is stale; it reconnects and
	// gets what was queued.
	if res := send(t, b, "healthy", "I am here"); !res.SenderRouteStale {
		t.Fatalf("recipient's own send = %+v, want sender_route_stale", res)
	}
	// The queued signal comes as piggyback on that answer or in the replay.
	waitFor(t, "the recipient to get the queued signal", func() bool { return slices.Contains(inB.ids(), stale.SignalID) })
	waitFor(t, "the recipient to reattach", func() bool { return b.Stats().Reconnects == 1 })
	live := send(t, a, "cut-off", "live again")
	if live.Delivery != "pushed_to_ws" || live.RecipientRouteStale {
		t.Errorf("send to the repaired recipient = %+v, want pushed_to_ws", live)
	}
	sent = append(sent, live.SignalID)
	waitFor(t, "the live signal", func() bool { return slices.Contains(inB.ids(), live.SignalID) })
	if got := inB.ids(); !slices.Equal(got, sent) {
		t.Errorf("recipient received %v, want %v: each once, in order", got, sent)
	}
	if st := b.Stats(); st.SelfHealReconnects != 1 || st.Reconnects != 1 {
		t.Errorf("recipient stats %+v, want one self-heal reconnect", st)
	}
	if st := routeStats(a); st != (bootstrap.Stats{}) {
		t.Errorf("sender stats %+v at the end", st)
	}
}

func TestHubRestartIsRedialed(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	p := wsproxy.New(t, h.URL)
	var in inbox
	c := dial(t, p.URL(), h.APIKey, "survivor", &in)
	other := dial(t, h.URL, h.APIKey, "other", nil)
	p.Sever()
	waitFor(t, "the redial", func() bool { return c.Stats().Reconnects == 1 })
	res := send(t, other, "survivor", "still there")
	waitFor(t, "delivery after the redial", func() bool { return slices.Contains(in.ids(), res.SignalID) })
}

func TestSessionExpiredReregisters(t *testing.T) {
	clock := hubtest.NewClock(time.Now())
	h := hubtest.Start(t, hubtest.Options{Now: clock.Now})
	var in inbox
	c := dial(t, h.URL, h.APIKey, "phoenix", &in)
	clock.Advance(2 * time.Hour) // beyond the default TTL of one hour
	witness := dial(t, h.URL, h.APIKey, "witness", nil)

	// The send meets 410, re-registers the same id and is made again.
	res := send(t, c, "witness", "x")
	if res.SignalID == "" {
		t.Fatalf("send after expiry = %+v", res)
	}
	if st := c.Stats(); st.Reregistrations != 1 {
		t.Fatalf("stats %+v after a 410, want one re-registration", st)
	}
	if c.SessionID() != "phoenix" {
		t.Errorf("session id %q, want phoenix kept", c.SessionID())
	}
	waitFor(t, "phoenix to reattach", func() bool { return c.Stats().Reconnects == 1 })
	got := send(t, witness, "phoenix", "y")
	if got.Delivery != "pushed_to_ws" {
		t.Errorf("send to the re-registered session: %+v, want pushed_to_ws", got)
	}
	waitFor(t, "phoenix to receive", func() bool { return slices.Contains(in.ids(), got.SignalID) })
}

func TestCloseLeavesNoGoroutine(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	var in inbox
	a := dial(t, h.URL, h.APIKey, "", &in)
	b := dial(t, h.URL, h.APIKey, "", nil)
	send(t, b, a.SessionID(), "one")
	waitFor(t, "delivery", func() bool { return in.len() == 1 })
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Send(context.Background(), b.SessionID(), "", nil); err == nil {
		t.Error("Send after Close succeeded")
	}
	h.Close()
	goleak.VerifyNone(t)
}

// A handler may answer from inside OnSignal: Send never waits for the
// dispatcher that is running the handler.
func TestReplyFromInsideHandler(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	var inA inbox
	a := dial(t, h.URL, h.APIKey, "asker", &inA)
	var b *bootstrap.Client
	ready := make(chan struct{})
	replies := make(chan error, 10)
	bIn := &inbox{gate: func(s bootstrap.Signal) {
		<-ready
		_, err := b.Send(context.Background(), s.FromSession, "reply", s.Seq)
		replies <- err
	}}
	b = dial(t, h.URL, h.APIKey, "answerer", bIn)
	close(ready)
	for i := range 5 {
		send(t, a, "answerer", i)
	}
	waitFor(t, "five replies", func() bool { return inA.len() == 5 })
	for range 5 {
		if err := <-replies; err != nil {
			t.Errorf("reply from the handler: %v", err)
		}
	}
}

// Clients given one HTTPClient make their calls through it, and closing one
// of them leaves the shared pool's idle connections to the others.
func TestSharedHTTPClient(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	var dials atomic.Int64
	d := &net.Dialer{}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return d.DialContext(ctx, network, addr)
	}}
	t.Cleanup(tr.CloseIdleConnections) // runs after the clients' Close
	hc := &http.Client{Transport: tr}
	dialShared := func(id string, in *inbox) *bootstrap.Client {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := bootstrap.Dial(ctx, bootstrap.Config{
			HubURL: h.URL, APIKey: h.APIKey, SessionID: id, Surface: "claude_code", OnSignal: in.on, HTTPClient: hc,
		})
		if err != nil {
			t.Fatalf("Dial %s: %v", id, err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	var inA, inB inbox
	a := dialShared("shared-a", &inA)
	b := dialShared("shared-b", &inB)
	if dials.Load() == 0 {
		t.Fatal("no connection dialled through the shared HTTPClient")
	}
	send(t, a, b.SessionID(), "one")
	waitFor(t, "b to receive the signal", func() bool { return inB.len() == 1 })

	_ = a.Close()
	before := dials.Load()
	send(t, b, "shared-a", "two") // a's session is still registered: queued
	if got := dials.Load(); got != before {
		t.Errorf("b's send dialled %d new connections after a closed, want 0: a's Close closed the shared pool's idle connections", got-before)
	}
}

// routeStats is c's Stats without its acks, which a healthy exchange of
// signals sends: what is left counts what the client did to keep its route.
func routeStats(c *bootstrap.Client) bootstrap.Stats {
	st := c.Stats()
	st.Acks = 0
	return st
}
