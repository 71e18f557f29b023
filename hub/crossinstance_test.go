package hub_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/internal/testproxy"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// noSweep is a pending-sweep interval no test outlives: a signal that
// arrives under it came by a wake-up.
const noSweep = time.Hour

// pair is two hub instances, "a" and "b", on one Postgres schema, each with
// its own pool and wake-up bus, as two processes would be.
type pair struct {
	url            string
	a, b           *hubtest.Hub
	busA, busB     *pgstore.Bus
	storeA, storeB *pgstore.Store
	dropA          *dropBus // a's bus, which a test may make lose wake-ups
}

type pairOptions struct {
	sweepB time.Duration
	url    string // the schema's URL; default a fresh one
	// busURLB is how b's wake-up listener reaches the same schema (e.g.
	// through a proxy); default url.
	busURLB string
	// storeA and storeB are more options of each instance's store.
	storeA, storeB []pgstore.Option
}

func startPair(t *testing.T, o pairOptions) *pair {
	t.Helper()
	if o.url == "" {
		o.url = pgtest.Schema(t)
	}
	p := &pair{url: o.url}
	if o.busURLB == "" {
		o.busURLB = p.url
	}
	open := func(u string, opts ...pgstore.Option) *pgstore.Store {
		st, err := pgstore.Open(context.Background(), u, append(opts, pgstore.WithMaxConns(4))...)
		if err != nil {
			t.Fatalf("open pgstore: %v", err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}
	p.storeA, p.storeB = open(p.url, o.storeA...), open(p.url, o.storeB...)
	p.busA, p.busB = pgstore.NewBus(p.storeA, nil), pgstore.NewBus(p.storeB, nil)
	if o.busURLB != p.url {
		p.busB = pgstore.NewBus(open(o.busURLB), nil)
	}
	p.dropA = &dropBus{Bus: p.busA}
	key, admin := hub.NewAPIKey(), hub.NewAdminToken()
	cfg := func(id string, sweep time.Duration) hub.Config {
		return hub.Config{
			InstanceID:   id,
			APIKeys:      map[string]hub.TenantProject{key: {TenantID: "t1", ProjectID: "p1"}},
			AdminToken:   admin,
			PendingSweep: sweep,
		}
	}
	p.a = hubtest.Start(t, hubtest.Options{Store: p.storeA, Bus: p.dropA, BusKeys: p.storeA, Config: cfg("a", noSweep)})
	p.b = hubtest.Start(t, hubtest.Options{Store: p.storeB, Bus: p.busB, BusKeys: p.storeB, Config: cfg("b", o.sweepB)})
	// b listens before anyone sends to it.
	waitFor(t, "b's wake-up listener", func() bool { return metric(t, p.b, "marconi_wake_listener_connects_total") >= 1 })
	return p
}

// dropBus loses every wake-up while drop is set, as a lost NOTIFY would.
type dropBus struct {
	fabric.Bus
	drop    atomic.Bool
	dropOdd atomic.Bool // lose the wake-ups of odd seqs only
	dropped atomic.Int64
}

func (d *dropBus) Publish(ctx context.Context, instance string, w sessionstore.Wake) error {
	if d.drop.Load() || (d.dropOdd.Load() && w.Seq%2 == 1) {
		d.dropped.Add(1)
		return nil
	}
	return d.Bus.Publish(ctx, instance, w)
}

// xiSignals reads n frames and returns their seqs and payloads, failing
// unless each is a signal.
func xiSignals(t *testing.T, c *websocket.Conn, n int) (seqs []int64, payloads []any) {
	t.Helper()
	for range n {
		f := readFrame(t, c)
		seq, ok := f["seq"].(float64)
		if f["type"] != "signal" || !ok {
			t.Fatalf("frame %v, want a signal", f)
		}
		seqs, payloads = append(seqs, int64(seq)), append(payloads, f["payload"])
	}
	return seqs, payloads
}

func xiWantSeqs(t *testing.T, what string, got []int64, from int64) {
	t.Helper()
	for i, s := range got {
		if s != from+int64(i) {
			t.Fatalf("%s: seqs %v, want %d.. in order", what, got, from)
		}
	}
}

func TestCrossInstanceSignalsArriveInOrder(t *testing.T) {
	t.Parallel()
	p := startPair(t, pairOptions{sweepB: noSweep})
	alice := register(t, p.a, "alice", "claude_code")
	bob := register(t, p.a, "bob", "claude_code")
	c, _ := dial(t, p.b, bob) // bob's queue is on b

	const n = 20
	for i := 1; i <= n; i++ {
		send(t, p.a, alice, "bob", i)
	}
	seqs, payloads := xiSignals(t, c, n)
	xiWantSeqs(t, "signals sent through a", seqs, 1)
	for i, pl := range payloads {
		if pl != float64(i+1) {
			t.Fatalf("signal %d carries %v", i+1, pl)
		}
	}
	if got := metric(t, p.a, "marconi_wakeups_total", "result", "published"); got != n {
		t.Errorf("a published %v wake-ups, want %d", got, n)
	}
	if got := metric(t, p.b, "marconi_wakeups_total", "result", "received"); got < 1 {
		t.Errorf("b received %v wake-ups", got)
	}
	// A send on b itself needs no bus.
	send(t, p.b, alice, "bob", "local")
	seqs, payloads = xiSignals(t, c, 1)
	if seqs[0] != n+1 || payloads[0] != "local" {
		t.Fatalf("local send: seq %d payload %v", seqs[0], payloads[0])
	}
}

func TestCrossInstanceLostWakeupHealedBySweep(t *testing.T) {
	t.Parallel()
	p := startPair(t, pairOptions{sweepB: 100 * time.Millisecond})
	alice := register(t, p.a, "alice", "claude_code")
	bob := register(t, p.a, "bob", "claude_code")
	c, _ := dial(t, p.b, bob)

	send(t, p.a, alice, "bob", 1)
	// Read 1 before 2 is sent: otherwise 1's wake-up can deliver both,
	// and 2 would arrive without the sweep this test is about.
	seqs, _ := xiSignals(t, c, 1)
	xiWantSeqs(t, "before the lost wake-up", seqs, 1)
	p.dropA.drop.Store(true)
	send(t, p.a, alice, "bob", 2) // its wake-up is lost
	p.dropA.drop.Store(false)
	if p.dropA.dropped.Load() != 1 {
		t.Fatalf("dropped %d wake-ups, want 1", p.dropA.dropped.Load())
	}
	seqs, _ = xiSignals(t, c, 1)
	xiWantSeqs(t, "with a lost wake-up", seqs, 2)
	if metric(t, p.b, "marconi_pending_sweeps_total") < 1 {
		t.Fatal("no pending sweep ran on b")
	}
	send(t, p.a, alice, "bob", 3)
	seqs, _ = xiSignals(t, c, 1)
	xiWantSeqs(t, "after the lost wake-up", seqs, 3)
}

// TestCrossInstanceListenerSurvivesTerminatedBackend is not parallel, so
// that it can check that the hubs' goroutines end.
func TestCrossInstanceListenerSurvivesTerminatedBackend(t *testing.T) {
	pgtest.DatabaseURL(t)
	leaks := goleak.IgnoreCurrent()
	p := startPair(t, pairOptions{sweepB: noSweep})
	alice := register(t, p.a, "alice", "claude_code")
	bob := register(t, p.a, "bob", "claude_code")
	c, _ := dial(t, p.b, bob)

	ctx := context.Background()
	ch, err := p.busB.Channel(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, p.url)
	if err != nil {
		t.Fatal(err)
	}
	var killed int
	err = conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1 AND query LIKE 'LISTEN %' || $2 || '%'`, pgstore.ListenerApplicationName, ch).Scan(&killed)
	conn.Close(ctx)
	if err != nil || killed != 1 {
		t.Fatalf("terminated %d listener backends (%v), want 1", killed, err)
	}
	waitFor(t, "b's listener to reconnect", func() bool { return metric(t, p.b, "marconi_wake_listener_connects_total") >= 2 })
	send(t, p.a, alice, "bob", "after")
	seqs, payloads := xiSignals(t, c, 1)
	if seqs[0] != 1 || payloads[0] != "after" {
		t.Fatalf("after the reconnect: seq %d payload %v", seqs[0], payloads[0])
	}

	// Shutdown stops the listener, the sweep and everything else.
	c.CloseNow()
	p.a.Close()
	p.b.Close()
	p.storeA.Close()
	p.storeB.Close()
	http.DefaultClient.CloseIdleConnections()
	goleak.VerifyNone(t, leaks)
}

// TestCrossInstanceResyncAfterReconnect: wake-ups published while b's
// listener is cut off are lost; when it reconnects, b wakes every local
// queue, so the signals arrive without waiting for the sweep.
func TestCrossInstanceResyncAfterReconnect(t *testing.T) {
	t.Parallel()
	base := pgtest.Schema(t)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testproxy.Start(t, u.Host)
	p := startPair(t, pairOptions{sweepB: noSweep, url: base, busURLB: viaProxy(u, proxy.Addr())})
	alice := register(t, p.a, "alice", "claude_code")
	bob := register(t, p.a, "bob", "claude_code")
	c, _ := dial(t, p.b, bob)
	// The listener must be connected before the cut, or its first connect
	// (not a reconnect) is what delivers the signals.
	waitFor(t, "b's listener to connect", func() bool { return metric(t, p.b, "marconi_wake_listener_connects_total") >= 1 })

	proxy.Cut() // b's listener loses its connection and cannot reconnect
	send(t, p.a, alice, "bob", 1)
	send(t, p.a, alice, "bob", 2)
	proxy.Restore()
	seqs, _ := xiSignals(t, c, 2)
	xiWantSeqs(t, "sent while b was not listening", seqs, 1)
	if got := metric(t, p.b, "marconi_wake_listener_connects_total"); got < 2 {
		t.Fatalf("b's listener connected %v times, want a reconnect", got)
	}
}

// viaProxy is u with its host replaced by addr.
func viaProxy(u *url.URL, addr string) string {
	v := *u
	v.Host = addr
	return v.String()
}

// A cross-instance signal travels with its wake-up: b queues the carried
// signal for bob's connection (counted as carried) and pushes it, with no
// pending sweep to fall back on.
func TestCrossInstanceWakeupCarriesTheSignal(t *testing.T) {
	t.Parallel()
	p := startPair(t, pairOptions{sweepB: noSweep})
	alice := register(t, p.a, "alice", "claude_code")
	bob := register(t, p.a, "bob", "claude_code")
	c, _ := dial(t, p.b, bob)
	for i := 1; i <= 3; i++ {
		send(t, p.a, alice, "bob", map[string]any{"n": i, "text": "carried"})
	}
	seqs, payloads := xiSignals(t, c, 3)
	xiWantSeqs(t, "carried signals", seqs, 1)
	for i, pl := range payloads {
		if m, ok := pl.(map[string]any); !ok || m["n"] != float64(i+1) || m["text"] != "carried" {
			t.Fatalf("signal %d payload %v", i+1, pl)
		}
	}
	if got := metric(t, p.b, "marconi_wakeups_total", "result", "carried"); got < 1 {
		t.Fatalf("b counted %v carried wake-ups, want at least 1", got)
	}
}

// Wake-ups lost on purpose, one in two, with concurrent senders: the ones
// that arrive carry signals past the next one the connection expects, so
// b reads the store for those, and the pending sweep delivers the rest.
// Every signal arrives once, in seq order.
func TestCrossInstanceDroppedWakeupsDeliveredInOrder(t *testing.T) {
	t.Parallel()
	p := startPair(t, pairOptions{sweepB: 100 * time.Millisecond})
	p.dropA.dropOdd.Store(true)
	alice := register(t, p.a, "alice", "claude_code")
	bob := register(t, p.a, "bob", "claude_code")
	c, _ := dial(t, p.b, bob)
	const senders, each = 4, 10
	var wg sync.WaitGroup
	errs := make(chan error, senders*each)
	for range senders {
		wg.Go(func() {
			for range each {
				st, body, err := postSend(context.Background(), p.a, alice, map[string]any{"to_session": "bob", "payload": "x"})
				if err != nil || st != http.StatusOK {
					errs <- fmt.Errorf("send: %d %v %v", st, body, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seqs, _ := xiSignals(t, c, senders*each)
	xiWantSeqs(t, "with half the wake-ups lost", seqs, 1)
	if p.dropA.dropped.Load() == 0 {
		t.Fatal("no wake-up was dropped")
	}
}

// The instance holding bob's queue dies while cross-instance sends and their
// wake-ups are in flight: its listener's connection is cut (the wake-ups to
// it are lost) and bob's WebSocket to it breaks. Every send answered 200
// reaches bob once he attaches to the other instance, in seq order, none
// missing.
func TestCrossInstanceOwnerKilledMidFlightLosesNothing(t *testing.T) {
	t.Parallel()
	base := pgtest.Schema(t)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testproxy.Start(t, u.Host)
	p := startPair(t, pairOptions{sweepB: noSweep, url: base, busURLB: viaProxy(u, proxy.Addr())})
	alice := register(t, p.a, "alice", "claude_code")
	bob := register(t, p.a, "bob", "claude_code")
	c, _ := dial(t, p.b, bob)

	const senders, each = 4, 25
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		answered []int64
	)
	for range senders {
		wg.Go(func() {
			for range each {
				st, body, err := postSend(context.Background(), p.a, alice, map[string]any{"to_session": "bob", "payload": "x"})
				if err == nil && st == http.StatusOK {
					if seq, ok := body["seq"].(float64); ok {
						mu.Lock()
						answered = append(answered, int64(seq))
						mu.Unlock()
					}
				}
			}
		})
	}
	// Kill b once signals flow through it.
	seqs, _ := xiSignals(t, c, 5)
	xiWantSeqs(t, "before the kill", seqs, 1)
	proxy.Cut()
	c.CloseNow()
	p.b.Close()
	wg.Wait()
	if len(answered) != senders*each {
		t.Fatalf("%d of %d sends answered 200", len(answered), senders*each)
	}

	c2, welcome := dial(t, p.a, bob)
	_ = welcome
	var got []int64
	for int64(len(got)) < int64(len(answered)) {
		f := readFrame(t, c2)
		if f["type"] != "signal" {
			continue
		}
		got = append(got, int64(f["seq"].(float64)))
	}
	xiWantSeqs(t, "after the owner died", got, 1)
}

// TestSendAnswerNamesTheRecipientsInstance: a send's answer carries the
// public URL of the instance holding the recipient's queue, whichever
// instance answers, and none while the recipient has no queue.
func TestSendAnswerNamesTheRecipientsInstance(t *testing.T) {
	t.Parallel()
	p := startPair(t, pairOptions{sweepB: noSweep})
	alice := register(t, p.a, "alice", "claude_code")
	bob := register(t, p.a, "bob", "claude_code")

	if got, ok := send(t, p.a, alice, "bob", 0)["recipient_instance_url"]; ok {
		t.Fatalf("bob has no queue, yet the answer names %v", got)
	}
	c, _ := dial(t, p.b, bob) // bob's queue is on b
	// a learns b's URL from the instances table on its next membership read.
	waitFor(t, "a's answer to name b", func() bool {
		return send(t, p.a, alice, "bob", 1)["recipient_instance_url"] == p.b.URL
	})
	if got := send(t, p.b, alice, "bob", 2)["recipient_instance_url"]; got != p.b.URL {
		t.Fatalf("b's own answer names %v, want %s", got, p.b.URL)
	}
	_ = c.Close(websocket.StatusNormalClosure, "")
	waitFor(t, "the hint to go with bob's queue", func() bool {
		_, ok := send(t, p.a, alice, "bob", 3)["recipient_instance_url"]
		return !ok
	})
}
