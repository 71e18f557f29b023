package bootstrap_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// These tests run the client against real hubs on Postgres. They skip
// without MARCONI_TEST_DATABASE_URL and fail without it when
// MARCONI_TEST_REQUIRE_POSTGRES=1 (internal/pgtest).

// pgStore opens a pgstore on a fresh schema of its own (or on url when given:
// several hubs sharing one schema each open their own pool, as processes do).
func pgStore(t *testing.T, url string) *pgstore.Store {
	t.Helper()
	if url == "" {
		url = pgtest.Schema(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := pgstore.Open(ctx, url, pgstore.WithMaxConns(4))
	if err != nil {
		t.Fatalf("open pgstore: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// forwarder is a TCP forwarder whose target can change, so that a client's
// HubURL stays the same across a hub restarted at a new address. It can be
// taken down (live connections cut, new ones refused), and it can refuse the
// connections whose first request starts with a given prefix.
type forwarder struct {
	ln net.Listener
	wg sync.WaitGroup

	mu     sync.Mutex
	target string // host:port
	down   bool
	refuse []byte // first bytes of a connection refused; nil: none
	conns  map[net.Conn]struct{}
}

func newForwarder(t *testing.T, targetURL string) *forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{ln: ln, conns: map[net.Conn]struct{}{}}
	f.retarget(targetURL)
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

// URL is the forwarder's base URL, to use as Config.HubURL.
func (f *forwarder) URL() string { return "http://" + f.ln.Addr().String() }

// retarget sends new connections to targetURL (http://host:port).
func (f *forwarder) retarget(targetURL string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.target = targetURL[len("http://"):]
}

// setDown cuts every live connection and refuses new ones (true), or lets
// them through again (false).
func (f *forwarder) setDown(down bool) {
	f.mu.Lock()
	f.down = down
	var cut []net.Conn
	if down {
		for c := range f.conns {
			cut = append(cut, c)
		}
	}
	f.mu.Unlock()
	for _, c := range cut {
		_ = c.Close()
	}
}

// refusePrefix makes the forwarder close every new connection whose first
// bytes are prefix (nil: none). Connections kept alive by the client are not
// looked at again: take the forwarder down first to flush them.
func (f *forwarder) refusePrefix(prefix string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refuse = []byte(prefix)
}

func (f *forwarder) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.wg.Add(1)
		go f.serve(c)
	}
}

// track records c as live; false (and c closed) when the forwarder is down.
func (f *forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		_ = c.Close()
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *forwarder) untrack(cs ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range cs {
		delete(f.conns, c)
		_ = c.Close()
	}
}

func (f *forwarder) serve(client net.Conn) {
	defer f.wg.Done()
	if !f.track(client) {
		return
	}
	f.mu.Lock()
	target, refuse := f.target, f.refuse
	f.mu.Unlock()
	var first []byte
	if len(refuse) > 0 {
		first = make([]byte, len(refuse))
		if _, err := io.ReadFull(client, first); err != nil || bytes.Equal(first, refuse) {
			f.untrack(client)
			return
		}
	}
	up, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil || !f.track(up) {
		f.untrack(client)
		if up != nil {
			_ = up.Close()
		}
		return
	}
	defer f.untrack(client, up)
	if _, err := up.Write(first); err != nil {
		return
	}
	done := make(chan struct{})
	go func() { // owned by serve, which waits for it below
		defer close(done)
		_, _ = io.Copy(client, up)
		_ = client.Close()
	}()
	_, _ = io.Copy(up, client)
	_ = up.Close()
	<-done
}

func (f *forwarder) close() {
	_ = f.ln.Close()
	f.setDown(true)
	f.wg.Wait()
}

// logRecorder is a slog.Handler that keeps every record, to assert on what
// the client logged.
type logRecorder struct {
	mu      sync.Mutex
	records []logged
}

type logged struct {
	level slog.Level
	msg   string
	attrs map[string]any
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	l := logged{level: rec.Level, msg: rec.Message, attrs: map[string]any{}}
	rec.Attrs(func(a slog.Attr) bool {
		l.attrs[a.Key] = a.Value.Resolve().Any()
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, l)
	return nil
}

// find returns the records whose message is msg.
func (r *logRecorder) find(msg string) []logged {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []logged
	for _, l := range r.records {
		if l.msg == msg {
			out = append(out, l)
		}
	}
	return out
}

func dialConfig(t *testing.T, cfg bootstrap.Config) *bootstrap.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg.Surface = "claude_code"
	cfg.ReconnectBaseDelay, cfg.ReconnectMaxDelay = 5*time.Millisecond, 50*time.Millisecond
	c, err := bootstrap.Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("Dial %s: %v", cfg.SessionID, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// wantPayloads fails unless in received exactly the signals with payloads
// 1..n, once each, in seq order.
func wantPayloads(t *testing.T, what string, in *inbox, n int) {
	t.Helper()
	in.mu.Lock()
	defer in.mu.Unlock()
	var got []int
	for i, s := range in.sigs {
		var p int
		_ = json.Unmarshal(s.Payload, &p)
		got = append(got, p)
		if i > 0 && s.Seq <= in.sigs[i-1].Seq {
			t.Fatalf("%s: seq %d after %d", what, s.Seq, in.sigs[i-1].Seq)
		}
	}
	want := make([]int, n)
	for i := range want {
		want[i] = i + 1
	}
	if !slices.Equal(got, want) {
		t.Fatalf("%s: OnSignal got payloads %v, want %v once each in order", what, got, want)
	}
}

// sendN sends payloads from..to from c to session to.
func sendN(t *testing.T, c *bootstrap.Client, to string, from, upTo int) {
	t.Helper()
	for i := from; i <= upTo; i++ {
		send(t, c, to, i)
	}
}

// A Postgres-backed hub restarted with the same instance id at a new
// address: the clients redial (same HubURL through a forwarder), resume
// their sessions and the recipient gets what was sent while it was away,
// exactly once, in order.
func TestPGHubRestartResumesSession(t *testing.T) {
	t.Parallel()
	store := pgStore(t, "")
	h1 := hubtest.Start(t, hubtest.Options{Store: store})
	fwdA, fwdB := newForwarder(t, h1.URL), newForwarder(t, h1.URL)
	logA := &logRecorder{}
	var inB inbox
	a := dialConfig(t, bootstrap.Config{HubURL: fwdA.URL(), APIKey: h1.APIKey, SessionID: "agent-a", Logger: slog.New(logA)})
	b := dialConfig(t, bootstrap.Config{HubURL: fwdB.URL(), APIKey: h1.APIKey, SessionID: "agent-b", OnSignal: inB.on})

	sendN(t, a, "agent-b", 1, 3)
	waitFor(t, "b to get 1..3 live", func() bool { return inB.len() == 3 })

	// b loses its hub and cannot come back; a sends on, then the hub goes.
	fwdB.setDown(true)
	sendN(t, a, "agent-b", 4, 6)
	h1.Close()
	waitFor(t, "a's WebSocket to end with 1012", func() bool {
		for _, l := range logA.find("marconi: WebSocket ended, reconnecting") {
			if l.attrs["status"] == int64(1012) {
				return true
			}
		}
		return false
	})

	// A new hub on the same store and instance id, at a new address.
	h2 := hubtest.Start(t, hubtest.Options{Store: store, Config: hub.Config{
		APIKeys:    map[string]hub.TenantProject{h1.APIKey: {TenantID: "t1", ProjectID: "p1"}},
		AdminToken: h1.AdminToken,
		InstanceID: "test-1",
	}})
	if h2.URL == h1.URL {
		t.Fatalf("the new hub reuses %s; the test wants a new address", h1.URL)
	}
	fwdA.retarget(h2.URL)
	fwdB.retarget(h2.URL)
	fwdB.setDown(false)

	waitFor(t, "b to get 4..6 after the restart", func() bool { return inB.len() >= 6 })
	waitFor(t, "a to reattach", func() bool { return a.Stats().Reconnects >= 1 })
	sendN(t, a, "agent-b", 7, 7)
	waitFor(t, "b to get 7 live", func() bool { return inB.len() >= 7 })
	wantPayloads(t, "b across the restart", &inB, 7)
	for _, c := range []*bootstrap.Client{a, b} {
		if st := c.Stats(); st.Reregistrations != 0 || st.Reconnects < 1 {
			t.Errorf("%s stats %+v, want reconnected without re-registration", c.SessionID(), st)
		}
	}
	if a.SessionID() != "agent-a" || b.SessionID() != "agent-b" {
		t.Errorf("session ids %q %q after the restart", a.SessionID(), b.SessionID())
	}
	// The hub says b is attached on the new hub with nothing left pending.
	waitFor(t, "b's pending signals acknowledged", func() bool {
		rs := opsRouteState(t, h2, "agent-b")
		return rs["route_state"] == "attached" && rs["pending_signals"] == float64(0)
	})
}

// opsRouteState reads one session's route_state through the ops API.
func opsRouteState(t *testing.T, h *hubtest.Hub, session string) map[string]any {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.URL+"/v1/ops/route_state/t1/p1/"+session, nil)
	req.Header.Set("Authorization", "Bearer "+h.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("route_state %s: %v", session, err)
	}
	defer resp.Body.Close()
	var rs map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&rs); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("route_state %s: %d %v", session, resp.StatusCode, err)
	}
	return rs
}

// stickyCluster is two hubs, hub-a and hub-b, on one Postgres schema with one
// clock; their fabric loops tick only when the test says so, so an
// instance's death is decided by the clock (as in hub/fabric_test.go).
type stickyCluster struct {
	clock  *hubtest.Clock
	a, b   *hubtest.Hub
	apiKey string
}

func startStickyCluster(t *testing.T, policy string) *stickyCluster {
	t.Helper()
	url := pgtest.Schema(t)
	c := &stickyCluster{clock: hubtest.NewClock(time.Now().UTC().Truncate(time.Second)), apiKey: hub.NewAPIKey()}
	admin := hub.NewAdminToken()
	start := func(id string) *hubtest.Hub {
		cfg := hub.Config{
			InstanceID: id, AdminToken: admin, StoreTimeout: 2 * time.Second,
			APIKeys: map[string]hub.TenantProject{c.apiKey: {TenantID: "t1", ProjectID: "p1"}},
		}
		cfg.Fabric.HeartbeatEvery = time.Hour
		cfg.Fabric.DisconnectPolicy = policy
		st := pgStore(t, url)
		// The wake-up bus carries a send on one hub to a queue on the other.
		h := hubtest.Start(t, hubtest.Options{Config: cfg, Store: st, Bus: pgstore.NewBus(st, nil), Now: c.clock.Now})
		c.tick(t, h)
		return h
	}
	c.a, c.b = start("hub-a"), start("hub-b")
	c.tick(t, c.a) // a sees b
	for _, h := range []*hubtest.Hub{c.a, c.b} {
		waitFor(t, h.Server.InstanceID()+"'s wake-up listener", func() bool {
			return counter(t, h, "marconi_wake_listener_connects_total") >= 1
		})
	}
	return c
}

// counter reads an unlabelled counter of h's registry.
func counter(t *testing.T, h *hubtest.Hub, name string) float64 {
	t.Helper()
	mfs, err := h.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("counter %s not found", name)
	return 0
}

func (c *stickyCluster) tick(t *testing.T, h *hubtest.Hub) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.Server.Fabric().Tick(ctx); err != nil {
		t.Fatalf("tick %s: %v", h.Server.InstanceID(), err)
	}
}

// stickyTakeover runs the sticky scenario: the recipient dials hub-b, which
// is not its assigned instance, follows wrong_instance to hub-a, and gets
// 1..2 live; hub-a dies while 3..5 are sent; hub-b takes the session over.
// It returns the recipient's client, inbox, reset count and log.
func stickyTakeover(t *testing.T, policy string) (*stickyCluster, *bootstrap.Client, *bootstrap.Client, *inbox, *atomic.Int64, *logRecorder) {
	t.Helper()
	c := startStickyCluster(t, policy)
	// The sender is sticky too and registers first: ties go home, so it is
	// placed on hub-b, and the recipient on the emptier hub-a.
	sender := dialConfig(t, bootstrap.Config{HubURL: c.b.URL, APIKey: c.apiKey, SessionID: "sender", RuntimeMode: "sticky"})
	fwd := newForwarder(t, c.b.URL) // the recipient's HubURL: hub-b
	var inR inbox
	var resets atomic.Int64
	logR := &logRecorder{}
	r := dialConfig(t, bootstrap.Config{
		HubURL: fwd.URL(), APIKey: c.apiKey, SessionID: "recipient", RuntimeMode: "sticky",
		OnSignal: inR.on, OnAffinityReset: func() { resets.Add(1) }, Logger: slog.New(logR),
	})
	if rs := opsRouteState(t, c.b, "recipient"); rs["store"].(map[string]any)["runtime_mode"] != "sticky" ||
		rs["queue"].(map[string]any)["instance_id"] != "hub-a" {
		t.Fatalf("recipient after Dial: %v, want sticky and attached on hub-a", rs)
	}
	follows := logR.find("marconi: following wrong_instance")
	if len(follows) != 1 || follows[0].attrs["instance_url"] != c.a.URL {
		t.Fatalf("the client followed %v, want one wrong_instance to %s", follows, c.a.URL)
	}
	sendN(t, sender, "recipient", 1, 2)
	waitFor(t, "1..2 live on hub-a and acknowledged", func() bool {
		return inR.len() == 2 && opsRouteState(t, c.b, "recipient")["pending_signals"] == float64(0)
	})

	// The recipient's way to hub-b is cut, so that it cannot drain what
	// follows over HTTP: 3..5 must come as the takeover's replay.
	fwd.setDown(true)
	c.a.Close() // 1012; hub-a heartbeats no more
	sendN(t, sender, "recipient", 3, 5)
	c.clock.Advance(11 * time.Second) // past the dead-after window
	c.tick(t, c.b)
	fwd.refusePrefix("GET /v1/signals")
	fwd.setDown(false)
	waitFor(t, "the takeover by hub-b", func() bool { return r.Stats().Reconnects == 1 })
	return c, sender, r, &inR, &resets, logR
}

// Sticky session, disconnect policy retain: the client follows
// wrong_instance; when its instance dies, its next attach through HubURL
// lands on the survivor, which takes the session over: OnAffinityReset once,
// the retained signals replayed, same session, no re-registration.
func TestPGStickyFallsBackToHubURLWhenInstanceDies(t *testing.T) {
	t.Parallel()
	c, sender, r, inR, resets, logR := stickyTakeover(t, fabric.PolicyRetain)
	waitFor(t, "3..5 replayed", func() bool { return inR.len() >= 5 })
	sendN(t, sender, "recipient", 6, 6)
	waitFor(t, "6 live on hub-b", func() bool { return inR.len() >= 6 })
	wantPayloads(t, "recipient across the takeover", inR, 6)
	if n := resets.Load(); n != 1 {
		t.Errorf("OnAffinityReset called %d times, want 1", n)
	}
	var takeover []logged
	for _, l := range logR.find("marconi: attached") {
		if l.attrs["affinity_reset"] == true {
			takeover = append(takeover, l)
		}
	}
	if len(takeover) != 1 || takeover[0].attrs["instance_id"] != "hub-b" || takeover[0].attrs["replayed"] != int64(3) {
		t.Errorf("attachments with affinity_reset: %v, want one on hub-b replaying 3", takeover)
	}
	if st := r.Stats(); st.Reregistrations != 0 || st.DroppedAtReset != 0 || r.SessionID() != "recipient" {
		t.Errorf("recipient %s stats %+v, want no re-registration, nothing dropped", r.SessionID(), st)
	}
	if rs := opsRouteState(t, c.b, "recipient"); rs["store"].(map[string]any)["assigned_instance"] != "hub-b" {
		t.Errorf("recipient's assignment after the takeover: %v", rs["store"])
	}
}

// Disconnect policy drop: the signals pending at the takeover are gone; the
// welcome's "dropped" is logged at warn level and counted in
// Stats.DroppedAtReset.
func TestPGStickyDropPolicyReportsDropped(t *testing.T) {
	t.Parallel()
	_, sender, r, inR, resets, logR := stickyTakeover(t, fabric.PolicyDrop)
	sendN(t, sender, "recipient", 6, 6)
	waitFor(t, "6 live on hub-b", func() bool { return inR.len() >= 3 })
	ids := inR.ids()
	inR.mu.Lock()
	var got []string
	for _, s := range inR.sigs {
		got = append(got, string(s.Payload))
	}
	inR.mu.Unlock()
	if !slices.Equal(got, []string{"1", "2", "6"}) {
		t.Fatalf("recipient got payloads %v (%v), want 1, 2, 6: 3..5 dropped at the reset", got, ids)
	}
	if n := resets.Load(); n != 1 {
		t.Errorf("OnAffinityReset called %d times, want 1", n)
	}
	if st := r.Stats(); st.DroppedAtReset != 3 || st.Reregistrations != 0 {
		t.Errorf("recipient stats %+v, want DroppedAtReset 3, no re-registration", st)
	}
	warns := logR.find("marconi: the hub dropped pending signals at the affinity reset (disconnect policy drop)")
	if len(warns) != 1 || warns[0].level != slog.LevelWarn || warns[0].attrs["dropped"] != int64(3) ||
		warns[0].attrs["instance_id"] != "hub-b" {
		t.Errorf("drop warnings %v, want one at warn level with dropped=3 from hub-b", warns)
	}
}
