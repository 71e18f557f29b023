package natsbus_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/marconihub/marconi/fabric/natsbus"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/metrictest"
	"github.com/marconihub/marconi/internal/natstest"
	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/internal/testproxy"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// TestMain fails the package when a goroutine outlives its tests: the
// buses, hubs and NATS connections are all closed by then.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// noSweep is a pending-sweep interval no test outlives: a signal that
// arrives under it came by a wake-up.
const noSweep = time.Hour

// instance is one hub of a pair with its NATS bus and that bus's metrics.
type instance struct {
	hub   *hubtest.Hub
	store *pgstore.Store
	bus   *natsbus.Bus
	reg   *prometheus.Registry
}

// pair is two hub instances, "a" and "b", on one Postgres schema, waking
// each other through NATS, each with its own pool and bus as two processes
// would be.
type pair struct{ a, b *instance }

type pairOptions struct {
	sweepB     time.Duration
	natsA      string // how a reaches NATS; default the test server
	natsB      string // how b reaches NATS; default the test server
	pgURL      string
	key, admin string
	// store is more options of both instances' stores.
	store []pgstore.Option
}

func startPair(t *testing.T, o pairOptions) *pair {
	t.Helper()
	if o.pgURL == "" {
		o.pgURL = pgtest.Schema(t)
	}
	server := natstest.URL(t)
	if o.natsA == "" {
		o.natsA = server
	}
	if o.natsB == "" {
		o.natsB = server
	}
	o.key, o.admin = hub.NewAPIKey(), hub.NewAdminToken()
	p := &pair{a: startInstance(t, o, "a", o.natsA, noSweep), b: startInstance(t, o, "b", o.natsB, o.sweepB)}
	// b listens before anyone sends to it.
	hubtest.WaitFor(t, "b's wake-up listener", func() bool {
		return metric(t, p.b.hub.Registry, "marconi_wake_listener_connects_total") >= 2 // Postgres and NATS
	})
	return p
}

func startInstance(t *testing.T, o pairOptions, id, natsURL string, sweep time.Duration) *instance {
	t.Helper()
	reg := prometheus.NewRegistry()
	st, err := pgstore.Open(context.Background(), o.pgURL, append(o.store, pgstore.WithMaxConns(4), pgstore.WithRegisterer(reg))...)
	if err != nil {
		t.Fatalf("open pgstore: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	in := &instance{store: st, reg: reg}
	in.bus, err = natsbus.New(natsbus.Config{URL: natsURL, QueueSize: 64}, pgstore.NewBus(st, testLog), in.reg, testLog)
	if err != nil {
		t.Fatalf("natsbus.New: %v", err)
	}
	t.Cleanup(in.bus.Close) // after the hub's cleanup, which stops Listen
	in.hub = hubtest.Start(t, hubtest.Options{Store: st, Bus: in.bus, Config: hub.Config{
		InstanceID:   id,
		APIKeys:      map[string]hub.TenantProject{o.key: {TenantID: "t1", ProjectID: "p1"}},
		AdminToken:   o.admin,
		PendingSweep: sweep,
	}})
	return in
}

func TestCrossInstanceOnNATSInOrder(t *testing.T) {
	t.Parallel()
	p := startPair(t, pairOptions{sweepB: noSweep})
	alice := p.a.hub.Register(t, "alice")
	bob := p.a.hub.Register(t, "bob")
	c, _ := p.b.hub.Dial(t, bob.Token) // bob's queue is on b

	const n = 20
	for i := 1; i <= n; i++ {
		p.a.hub.Send(t, alice, "bob", i)
	}
	for i := 1; i <= n; i++ {
		f := hubtest.ReadFrame(t, c)
		if f["type"] != "signal" || f["seq"] != float64(i) || f["payload"] != float64(i) {
			t.Fatalf("frame %d: %v, want signal seq %d payload %d", i, f, i, i)
		}
	}
	if got := metric(t, p.a.hub.Registry, "marconi_wakeups_total", "result", "published"); got != n {
		t.Errorf("a published %v wake-ups, want %d", got, n)
	}
	if got := metric(t, p.b.hub.Registry, "marconi_wakeups_total", "result", "carried"); got < 1 {
		t.Errorf("b took %v carried signals from NATS, want some: the seal did not check out", got)
	}
	if got := metric(t, p.b.reg, "marconi_nats_bus_refused_total"); got != 0 {
		t.Errorf("b refused %v wake-ups", got)
	}
}

// NATS down: sends are answered 200 and delivered by the pending sweep;
// back up, the bus delivers again.
func TestCrossInstanceNATSDownFallsBackToSweep(t *testing.T) {
	t.Parallel()
	proxy := testproxy.Start(t, strings.TrimPrefix(natstest.URL(t), "nats://"))
	via := "nats://" + proxy.Addr()
	p := startPair(t, pairOptions{sweepB: 100 * time.Millisecond, natsA: via, natsB: via})
	alice := p.a.hub.Register(t, "alice")
	bob := p.a.hub.Register(t, "bob")
	c, _ := p.b.hub.Dial(t, bob.Token)
	p.a.hub.Send(t, alice, "bob", 1)
	wantSignal(t, c, 1, 1)
	// The sweep (100 ms) may push 1 before its wake-up is counted: wait for
	// the count, or it could land after the baseline read below and be
	// taken for a wake-up received while NATS was down.
	hubtest.WaitFor(t, "b to count the wake-up of 1", func() bool {
		return metric(t, p.b.hub.Registry, "marconi_wakeups_total", "result", "received") >= 1
	})

	proxy.Cut()
	hubtest.WaitFor(t, "both buses to see NATS gone", func() bool {
		return metric(t, p.a.reg, "marconi_nats_bus_connected") == 0 && metric(t, p.b.reg, "marconi_nats_bus_connected") == 0
	})
	received := metric(t, p.b.hub.Registry, "marconi_wakeups_total", "result", "received")
	sweeps := metric(t, p.b.hub.Registry, "marconi_pending_sweeps_total")
	for i := 2; i <= 4; i++ {
		p.a.hub.Send(t, alice, "bob", i) // 200, or send fails the test
	}
	for i := 2; i <= 4; i++ {
		wantSignal(t, c, i, i)
	}
	if got := metric(t, p.a.hub.Registry, "marconi_wakeups_total", "result", "publish_failed"); got < 3 {
		t.Errorf("a counted %v failed publishes while NATS was down, want 3", got)
	}
	if got := metric(t, p.b.hub.Registry, "marconi_wakeups_total", "result", "received"); got != received {
		t.Errorf("b received %v wake-ups while NATS was down", got-received)
	}
	if metric(t, p.b.hub.Registry, "marconi_pending_sweeps_total") <= sweeps {
		t.Error("no pending sweep ran on b while NATS was down")
	}

	connects := metric(t, p.b.hub.Registry, "marconi_wake_listener_connects_total")
	proxy.Restore()
	hubtest.WaitFor(t, "both buses back on NATS, b caught up", func() bool {
		return metric(t, p.a.reg, "marconi_nats_bus_connected") == 1 && metric(t, p.b.reg, "marconi_nats_bus_connected") == 1 &&
			metric(t, p.b.hub.Registry, "marconi_wake_listener_connects_total") > connects
	})
	p.a.hub.Send(t, alice, "bob", 5)
	wantSignal(t, c, 5, 5)
	hubtest.WaitFor(t, "b to receive the wake-up of 5 by NATS", func() bool {
		return metric(t, p.b.hub.Registry, "marconi_wakeups_total", "result", "received") > received
	})
	if got := metric(t, p.b.reg, "marconi_nats_bus_disconnects_total"); got < 1 {
		t.Errorf("b counted %v disconnects", got)
	}
	// NATS's reconnect is a catch-up of the listener, not a reconnect of
	// its Postgres connection (MarconiWakeListenerFlapping counts those).
	if got := metric(t, p.b.reg, "marconi_pg_listener_connects_total"); got != 1 {
		t.Errorf("b counted %v connects of its Postgres listener, want 1", got)
	}
}

// A message on an instance's subject that is not a wake-up is refused; one
// whose carried signal was altered is taken as a bare wake-up, so its
// signal is never pushed.
func TestNATSBusRefusesGarbledAndForged(t *testing.T) {
	t.Parallel()
	p := startPair(t, pairOptions{sweepB: noSweep})
	alice := p.a.hub.Register(t, "alice")
	bob := p.a.hub.Register(t, "bob")
	c, _ := p.b.hub.Dial(t, bob.Token)

	ctx := context.Background()
	raw := pgstore.NewBus(p.a.store, nil)
	ch, err := raw.Channel(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	subject := "marconi.wake." + ch
	nc, err := nats.Connect(natstest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)

	for _, garbled := range []string{"not json", `{"tenant":"t1"}`, `[]`, strings.Repeat("x", 9000)} {
		if err := nc.Publish(subject, []byte(garbled)); err != nil {
			t.Fatal(err)
		}
	}
	hubtest.WaitFor(t, "b to refuse the four garbled messages", func() bool { return metric(t, p.b.reg, "marconi_nats_bus_refused_total") == 4 })

	// A sealed wake-up for bob's next signal, its payload then altered.
	sess, err := p.a.store.GetSession(ctx, sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sig := sessionstore.Signal{ID: "forged-1", Seq: 1, To: sess.Key, FromSession: "alice", Kind: "signal",
		Payload: json.RawMessage(`"genuine"`), CreatedAt: time.Now().UTC()}
	sealed, err := raw.SealWakes(ctx, []sessionstore.Wake{{Key: sess.Key, Seq: 1, Signal: &sig, Incarnation: sess.RegisteredAt}})
	if err != nil || len(sealed) != 1 || !strings.Contains(sealed[0], `"tag"`) {
		t.Fatalf("seal: %v %q", err, sealed)
	}
	forged := strings.Replace(sealed[0], `"genuine"`, `"forged!"`, 1)
	if forged == sealed[0] {
		t.Fatalf("payload not found in %s", sealed[0])
	}
	received := metric(t, p.b.hub.Registry, "marconi_wakeups_total", "result", "received")
	if err := nc.Publish(subject, []byte(forged)); err != nil {
		t.Fatal(err)
	}
	hubtest.WaitFor(t, "b to receive the forged wake-up", func() bool {
		return metric(t, p.b.hub.Registry, "marconi_wakeups_total", "result", "received") > received
	})
	if got := metric(t, p.b.hub.Registry, "marconi_wakeups_total", "result", "carried"); got != 0 {
		t.Fatalf("b took %v carried signals from a forged wake-up", got)
	}
	p.a.hub.Send(t, alice, "bob", "real")
	wantSignal(t, c, 1, "real")
}

// TestNATSBusKeyRotation: the bus key rotated under two instances on NATS
// that read it again only when a carried signal fails to open. Sealed under
// the old key after the rotation, a signal is carried; the first sealed
// under the new one before the peer read it arrives from the store and has
// the peer read the key, and the next is carried; sealed two rotations
// back, it arrives from the store, in order.
func TestNATSBusKeyRotation(t *testing.T) {
	t.Parallel()
	p := startPair(t, pairOptions{sweepB: noSweep, store: []pgstore.Option{
		pgstore.WithBusKeyTimings(pgstore.BusKeyTimings{Refresh: time.Hour, Grace: 2 * time.Hour, Recheck: time.Millisecond})}})
	alice := p.a.hub.Register(t, "alice")
	bob := p.a.hub.Register(t, "bob")
	carol := p.a.hub.Register(t, "carol")
	cb, _ := p.b.hub.Dial(t, bob.Token)   // bob's queue is on b
	cc, _ := p.a.hub.Dial(t, carol.Token) // carol's on a
	p.b.hub.Send(t, alice, "carol", 1)    // b reads the key, version 1
	wantSignal(t, cc, 1, 1)

	ctx := t.Context()
	if v, _, err := p.a.store.RotateBusKey(ctx); err != nil || v != 2 {
		t.Fatalf("rotate: version %d, %v", v, err)
	}
	carried := func(in *instance) float64 {
		return metric(t, in.hub.Registry, "marconi_wakeups_total", "result", "carried")
	}
	before := carried(p.a)
	p.b.hub.Send(t, alice, "carol", 2) // sealed under version 1
	wantSignal(t, cc, 2, 2)
	if got := carried(p.a) - before; got != 1 {
		t.Errorf("a carried %v signals sealed under the previous key, want 1", got)
	}
	// Sealed under version 2, which b has not read: the signal comes from
	// the store, and b reads the key in the background; the next is carried.
	p.a.hub.Send(t, alice, "bob", 1)
	wantSignal(t, cb, 1, 1)
	hubtest.WaitFor(t, "b to read the rotated key", func() bool {
		return metric(t, p.b.reg, "marconi_bus_key_version") == 2
	})
	before = carried(p.b)
	p.a.hub.Send(t, alice, "bob", 2)
	wantSignal(t, cb, 2, 2)
	if got := carried(p.b) - before; got != 1 {
		t.Errorf("b carried %v signals sealed under the new key, want 1", got)
	}
	for in, want := range map[*instance]float64{p.a: 0, p.b: 1} {
		if got := metric(t, in.reg, "marconi_bus_key_opened_total", "result", "none"); got != want {
			t.Errorf("%v signals fell back to the store during the rotation, want %v", got, want)
		}
	}

	for range 2 {
		if _, _, err := p.a.store.RotateBusKey(ctx); err != nil {
			t.Fatal(err)
		}
	}
	before = carried(p.a)
	p.b.hub.Send(t, alice, "carol", 3) // sealed under version 2, two rotations back
	p.b.hub.Send(t, alice, "carol", 4)
	p.a.hub.Send(t, alice, "carol", 5) // on carol's own instance
	for i := 3; i <= 5; i++ {
		wantSignal(t, cc, i, i)
	}
	// Signal 5, pushed on a, has carol's writer catch 3 and 4 up from the
	// store, maybe before a has handled their wake-ups: wait for the count.
	hubtest.WaitFor(t, "a to count a signal sealed two rotations back as opened under no key", func() bool {
		return metric(t, p.a.reg, "marconi_bus_key_opened_total", "result", "none") >= 1
	})
	if got := carried(p.a) - before; got != 0 {
		t.Errorf("a carried %v signals sealed two rotations back, want none", got)
	}
}

// --- helpers: the hub as a client sees it ---

// wantSignal reads one frame and fails unless it is signal seq with payload.
func wantSignal(t *testing.T, c *websocket.Conn, seq int, payload any) {
	t.Helper()
	f := hubtest.ReadFrame(t, c)
	want := payload
	if n, ok := payload.(int); ok {
		want = float64(n)
	}
	if f["type"] != "signal" || f["seq"] != float64(seq) || f["payload"] != want {
		t.Fatalf("frame %v, want signal seq %d payload %v", f, seq, payload)
	}
}

// metric is the value of the first counter or gauge series named name with
// the given label pairs in g, 0 when there is none.
func metric(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, _ := metrictest.Lookup(t, g, name, labels...)
	return v
}

// testLog logs to stderr when MARCONI_TEST_LOG is set, else nowhere.
var testLog = func() *slog.Logger {
	if os.Getenv("MARCONI_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}()
