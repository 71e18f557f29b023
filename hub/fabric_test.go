package hub_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/internal/testproxy"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// fabCluster is several hubs on one store schema with one clock. Their
// fabric loops tick once at start and then only when the test says so
// (tick), so instance health is decided by the clock, never by waiting.
type fabCluster struct {
	t      *testing.T
	dbURL  string // a pgtest schema; empty: one shared memstore
	mem    sessionstore.Store
	clock  *hubtest.Clock
	apiKey string
	admin  string
	base   hub.Config
	hubs   map[string]*hubtest.Hub
}

func newFabCluster(t *testing.T, durable bool, base hub.Config) *fabCluster {
	t.Helper()
	c := &fabCluster{
		t: t, clock: hubtest.NewClock(time.Now().UTC().Truncate(time.Second)),
		apiKey: hub.NewAPIKey(), admin: hub.NewAdminToken(), base: base, hubs: map[string]*hubtest.Hub{},
	}
	if durable {
		c.dbURL = pgtest.Schema(t)
	} else {
		c.mem = memstore.New()
	}
	return c
}

// openStore opens a store of its own on the cluster's schema (each hub has
// its own pool, as separate processes would), through dbURL when given.
func (c *fabCluster) openStore(dbURL string) sessionstore.Store {
	c.t.Helper()
	if c.dbURL == "" {
		return c.mem
	}
	if dbURL == "" {
		dbURL = c.dbURL
	}
	st, err := pgstore.Open(context.Background(), dbURL, pgstore.WithQueryTimeout(time.Second))
	if err != nil {
		c.t.Fatalf("pgstore.Open: %v", err)
	}
	c.t.Cleanup(func() { _ = st.Close() })
	return st
}

// start starts hub id on st (nil: a store of its own on the schema) and
// ticks it once so its heartbeat is in the store.
func (c *fabCluster) start(id string, st sessionstore.Store) *hubtest.Hub {
	c.t.Helper()
	if st == nil {
		st = c.openStore("")
	}
	cfg := c.base
	cfg.InstanceID = id
	cfg.APIKeys = map[string]hub.TenantProject{c.apiKey: {TenantID: "t1", ProjectID: "p1"}}
	cfg.AdminToken = c.admin
	cfg.Fabric.HeartbeatEvery = time.Hour
	if cfg.StoreTimeout == 0 {
		cfg.StoreTimeout = 2 * time.Second
	}
	h := hubtest.Start(c.t, hubtest.Options{Config: cfg, Store: st, Now: c.clock.Now})
	c.hubs[id] = h
	c.tickOne(h)
	return h
}

func (c *fabCluster) tickOne(h *hubtest.Hub) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.Server.Fabric().Tick(ctx); err != nil {
		c.t.Fatalf("tick %s: %v", h.Server.InstanceID(), err)
	}
}

// tick heartbeats the named hubs and refreshes their view; the others stay
// silent, as a dead process would.
func (c *fabCluster) tick(ids ...string) {
	c.t.Helper()
	for _, id := range ids {
		c.tickOne(c.hubs[id])
	}
}

// fabRegister registers a session on h with the cluster's key.
func fabRegister(t *testing.T, h *hubtest.Hub, id string, extra map[string]any) (agent, map[string]any) {
	t.Helper()
	body := map[string]any{"session_id": id, "surface": "claude_code"}
	for k, v := range extra {
		body[k] = v
	}
	st, resp := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, body)
	if st != http.StatusCreated {
		t.Fatalf("register %s on %s: %d %v", id, h.Server.InstanceID(), st, resp)
	}
	return agent{ID: resp["session_id"].(string), Token: resp["token"].(string)}, resp
}

// tryDial attaches a's WebSocket on h. On a refused handshake it returns the
// status and the decoded error body.
func tryDial(t *testing.T, h *hubtest.Hub, a agent) (*websocket.Conn, map[string]any, int, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, h.WSURL(), &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + a.Token}}})
	if err != nil {
		if resp == nil {
			t.Fatalf("dial %s on %s: %v", a.ID, h.Server.InstanceID(), err)
		}
		var body map[string]any
		if resp.Body != nil {
			raw, _ := io.ReadAll(resp.Body)
			_ = json.Unmarshal(raw, &body)
		}
		return nil, nil, resp.StatusCode, body
	}
	c.SetReadLimit(1 << 20)
	t.Cleanup(func() { c.CloseNow() })
	w := readFrame(t, c)
	if w["type"] != "welcome" {
		t.Fatalf("first frame is %v, want welcome", w)
	}
	return c, w, http.StatusSwitchingProtocols, nil
}

// mustAttach attaches and fails unless the handshake succeeds.
func mustAttach(t *testing.T, h *hubtest.Hub, a agent) (*websocket.Conn, map[string]any) {
	t.Helper()
	c, w, st, body := tryDial(t, h, a)
	if c == nil {
		t.Fatalf("attach %s on %s: %d %v", a.ID, h.Server.InstanceID(), st, body)
	}
	return c, w
}

// detach closes a client WebSocket and waits until the store records the
// detach (the grace window starts there).
func detach(t *testing.T, h *hubtest.Hub, c *websocket.Conn, a agent) {
	t.Helper()
	_ = c.Close(websocket.StatusNormalClosure, "bye")
	waitFor(t, a.ID+" detached in the store", func() bool {
		st := routeState(t, h, a.ID)["store"].(map[string]any)
		return st["queue_detached_at"] != nil && !routeState(t, h, a.ID)["queue"].(map[string]any)["attached"].(bool)
	})
}

func wantWelcome(t *testing.T, what string, w map[string]any, resumed, reset bool, replayed int) {
	t.Helper()
	if w["resumed"] != resumed || w["affinity_reset"] != reset || w["replayed"] != float64(replayed) {
		t.Fatalf("%s: welcome %v, want resumed %v, affinity_reset %v, replayed %d", what, w, resumed, reset, replayed)
	}
}

func wantWrongInstance(t *testing.T, what string, st int, body map[string]any, owner *hubtest.Hub) {
	t.Helper()
	e, _ := body["error"].(map[string]any)
	if st != http.StatusConflict || e["code"] != "wrong_instance" ||
		e["instance_id"] != owner.Server.InstanceID() || e["instance_url"] != owner.URL {
		t.Fatalf("%s: %d %v, want 409 wrong_instance naming %s at %s", what, st, body, owner.Server.InstanceID(), owner.URL)
	}
}

func summary(t *testing.T, h *hubtest.Hub) map[string]any {
	t.Helper()
	st, s := call(t, "GET", h.URL+"/v1/ops/fabric/summary", h.AdminToken, nil)
	if st != http.StatusOK {
		t.Fatalf("fabric summary: %d %v", st, s)
	}
	return s
}

func totals(s map[string]any) map[string]any { return s["summary"].(map[string]any) }

func events(s map[string]any) []map[string]any {
	var out []map[string]any
	for _, e := range s["fallback_events"].([]any) {
		out = append(out, e.(map[string]any))
	}
	return out
}

func assignedOf(t *testing.T, h *hubtest.Hub, session string) string {
	t.Helper()
	a, _ := routeState(t, h, session)["store"].(map[string]any)["assigned_instance"].(string)
	return a
}

// sendAs sends one signal from a sender session registered on h.
func sendAs(t *testing.T, h *hubtest.Hub, from agent, to string, payload any) {
	t.Helper()
	send(t, h, from, to, payload)
}

func fabStartDurable(t *testing.T, base hub.Config, ids ...string) *fabCluster {
	t.Helper()
	c := newFabCluster(t, true, base)
	for _, id := range ids {
		c.start(id, nil)
	}
	c.tick(ids...) // each sees the ones started after it
	return c
}

// --- the recovery matrix, one test per row ---

// Row "Backend instance becomes unhealthy or stops accepting sessions".
func TestMatrixInstanceUnhealthy(t *testing.T) {
	t.Parallel()
	c := fabStartDurable(t, hub.Config{}, "hub-a", "hub-b")
	a, b := c.hubs["hub-a"], c.hubs["hub-b"]

	// Least-loaded placement: the first sticky session stays on the hub it
	// registered on (ties go home), the second goes to the emptier one.
	s1, r1 := fabRegister(t, a, "s1", map[string]any{"runtime_mode": "sticky"})
	if r1["instance_id"] != "hub-a" || r1["instance_url"] != a.URL || r1["runtime_mode_source"] != "explicit" {
		t.Fatalf("s1 placement: %v, want hub-a at %s", r1, a.URL)
	}
	_, r2 := fabRegister(t, a, "s2", map[string]any{"runtime_mode": "sticky"})
	if r2["instance_id"] != "hub-b" || r2["instance_url"] != b.URL {
		t.Fatalf("s2 placement: %v, want hub-b (least loaded)", r2)
	}
	free, rf := fabRegister(t, a, "free", nil)
	if rf["runtime_mode"] != "stateless" || rf["instance_url"] != nil {
		t.Fatalf("stateless registration: %v", rf)
	}

	// Sticky: 409 while the assigned instance is healthy.
	_, _, st, body := tryDial(t, b, s1)
	wantWrongInstance(t, "s1 on hub-b while hub-a is healthy", st, body, a)
	// Stateless: any healthy instance.
	wsFree, w := mustAttach(t, b, free)
	wantWelcome(t, "stateless on hub-b", w, false, false, 0)
	detach(t, b, wsFree, free)

	// hub-a stops heartbeating (a crash); past the dead-after window hub-b
	// sees it unhealthy.
	c.clock.Advance(11 * time.Second)
	c.tick("hub-b")
	if got := metric(t, b, "marconi_instance_healthy", "instance_id", "hub-a"); got != 0 {
		t.Fatalf("marconi_instance_healthy{hub-a} on hub-b = %v, want 0", got)
	}
	_, w = mustAttach(t, b, s1)
	wantWelcome(t, "s1 taken over by hub-b", w, false, true, 0)
	if got := assignedOf(t, b, "s1"); got != "hub-b" {
		t.Fatalf("s1 assigned to %q after the takeover, want hub-b", got)
	}
	_, w = mustAttach(t, b, free)
	if w["affinity_reset"] != false {
		t.Fatalf("stateless session reset: %v", w)
	}

	s := summary(t, b)
	if tt := totals(s); tt["total_fallbacks"] != 1.0 || tt["total_reassignments"] != 0.0 {
		t.Fatalf("summary totals %v, want 1 fallback, 0 reassignments", tt)
	}
	ev := events(s)
	if len(ev) != 1 || ev[0]["session_id"] != "s1" || ev[0]["from_instance"] != "hub-a" || ev[0]["to_instance"] != "hub-b" ||
		ev[0]["reason"] != "instance_unhealthy" || ev[0]["runtime_mode"] != "sticky" || ev[0]["runtime_mode_source"] != "explicit" {
		t.Fatalf("fallback events %v", ev)
	}
	if got := metric(t, b, "marconi_fabric_fallbacks_total"); got != 1 {
		t.Fatalf("marconi_fabric_fallbacks_total = %v, want 1", got)
	}
	for _, in := range s["instances"].([]any) {
		m := in.(map[string]any)
		want := m["instance_id"] == "hub-b"
		if m["healthy"] != want {
			t.Fatalf("summary instance %v: healthy want %v", m, want)
		}
	}
}

// With MARCONI_STICKY_PLACEMENT=project, a sticky registration that lands
// on one instance (a first registration goes round robin behind the hash:
// it names no project yet) is placed where its project's agents are
// attached, so that its WebSocket meets theirs; placed by the fewest, it
// would stay on the instance it registered on. The same on Postgres as in
// memory: the project's sessions are read from the store.
func TestStickyPlacementByProject(t *testing.T) {
	t.Parallel()
	base := hub.Config{}
	base.Fabric.Placement.Sticky = fabric.StickyByProject
	c := fabStartDurable(t, base, "hub-a", "hub-b")
	a, b := c.hubs["hub-a"], c.hubs["hub-b"]

	// The project's stateless agents are attached on hub-b.
	for _, id := range []string{"free-1", "free-2"} {
		free, _ := fabRegister(t, a, id, nil)
		mustAttach(t, b, free)
	}
	s1, r1 := fabRegister(t, a, "s1", map[string]any{"runtime_mode": "sticky"})
	if r1["instance_id"] != "hub-b" || r1["instance_url"] != b.URL {
		t.Fatalf("s1 registered on hub-a: placed %v, want hub-b (where its project is) at %s", r1, b.URL)
	}
	mustAttach(t, b, s1)
	// One more sticky session follows, though hub-b now holds the only
	// sticky session: the project counts before the load.
	_, r2 := fabRegister(t, a, "s2", map[string]any{"runtime_mode": "sticky"})
	if r2["instance_id"] != "hub-b" {
		t.Fatalf("s2 registered on hub-a: placed %v, want hub-b", r2)
	}
}

// A draining instance is unhealthy to the others at once, not after the
// dead-after window.
func TestDrainingInstanceIsUnhealthyAtOnce(t *testing.T) {
	t.Parallel()
	c := fabStartDurable(t, hub.Config{}, "hub-a", "hub-b")
	a, b := c.hubs["hub-a"], c.hubs["hub-b"]
	s1, _ := fabRegister(t, a, "s1", map[string]any{"runtime_mode": "sticky"})
	a.Server.SetDraining()
	c.tick("hub-b") // no clock advance
	_, w := mustAttach(t, b, s1)
	wantWelcome(t, "s1 after hub-a drained", w, false, true, 0)
	s := summary(t, b)
	for _, in := range s["instances"].([]any) {
		m := in.(map[string]any)
		if m["instance_id"] == "hub-a" && (m["draining"] != true || m["healthy"] != false) {
			t.Fatalf("hub-a in the summary: %v, want draining and unhealthy", m)
		}
	}
}

// takeoverRace holds the first n writes of a sticky assignment (first
// placement or takeover), on whichever hub they happen, until all n have
// arrived: every racer then writes on the assignment it read before any
// other wrote. A racer that waits past its request's deadline is noted.
type takeoverRace struct {
	n        int
	released chan struct{}

	mu       sync.Mutex
	arrived  int
	timedOut bool
}

func newTakeoverRace(n int) *takeoverRace {
	return &takeoverRace{n: n, released: make(chan struct{})}
}

func (r *takeoverRace) wait(ctx context.Context) {
	r.mu.Lock()
	r.arrived++
	if r.arrived > r.n {
		r.mu.Unlock()
		return
	}
	if r.arrived == r.n {
		close(r.released)
	}
	r.mu.Unlock()
	select {
	case <-r.released:
	case <-ctx.Done():
		r.mu.Lock()
		r.timedOut = true
		r.mu.Unlock()
	}
}

// racingStore is one hub's store in a takeover race: its assignment writes
// wait for the race, and it counts the calls only a takeover's winner may
// make.
type racingStore struct {
	sessionstore.Store
	race *takeoverRace

	mu                        sync.Mutex
	dropPending, fallbackRecs int
}

func (s *racingStore) AssignInstance(ctx context.Context, k sessionstore.Key, instance string) error {
	s.race.wait(ctx)
	return s.Store.AssignInstance(ctx, k, instance)
}

func (s *racingStore) ReassignInstance(ctx context.Context, k sessionstore.Key, from, to string) (bool, error) {
	s.race.wait(ctx)
	return s.Store.ReassignInstance(ctx, k, from, to)
}

func (s *racingStore) DropPending(ctx context.Context, k sessionstore.Key, at time.Time) (int, error) {
	s.mu.Lock()
	s.dropPending++
	s.mu.Unlock()
	return s.Store.DropPending(ctx, k, at)
}

func (s *racingStore) RecordFallback(ctx context.Context, e sessionstore.FallbackEvent) error {
	s.mu.Lock()
	s.fallbackRecs++
	s.mu.Unlock()
	return s.Store.RecordFallback(ctx, e)
}

func (s *racingStore) winnerCalls() (dropPending, fallbackRecs int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropPending, s.fallbackRecs
}

// dialResult is one WebSocket handshake made off the test goroutine.
type dialResult struct {
	conn   *websocket.Conn
	status int
	body   map[string]any
	err    error
}

func dialAsync(h *hubtest.Hub, a agent) <-chan dialResult {
	out := make(chan dialResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, resp, err := websocket.Dial(ctx, h.WSURL(), &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + a.Token}}})
		r := dialResult{conn: c, status: http.StatusSwitchingProtocols}
		if err != nil {
			r = dialResult{err: err}
			if resp != nil {
				r = dialResult{status: resp.StatusCode}
				raw, _ := io.ReadAll(resp.Body)
				_ = json.Unmarshal(raw, &r.body)
			}
		}
		out <- r
	}()
	return out
}

// Two instances take over the same sticky session at once (its instance
// died, and the client's attach reached both, e.g. a retry): the
// assignment moves exactly once. One instance accepts with affinity_reset
// and records the one fallback event; the other answers wrong_instance
// naming it, records nothing and drops nothing. Sticky ownership never
// splits.
func TestConcurrentTakeoversOneWins(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (several seconds): skipped by -short")
	}
	t.Parallel()
	c := newFabCluster(t, true, hub.Config{Fabric: fabric.Config{DisconnectPolicy: fabric.PolicyDrop}})
	race := newTakeoverRace(2)
	stores := map[string]*racingStore{}
	a := c.start("hub-a", nil)
	for _, id := range []string{"hub-b", "hub-c"} {
		stores[id] = &racingStore{Store: c.openStore(""), race: race}
		c.start(id, stores[id])
	}
	c.tick("hub-a", "hub-b", "hub-c")

	s1, r1 := fabRegister(t, a, "s1", map[string]any{"runtime_mode": "sticky"})
	if r1["instance_id"] != "hub-a" {
		t.Fatalf("s1 placed on %v, want hub-a", r1["instance_id"])
	}
	sender, _ := fabRegister(t, a, "sender", nil)
	ws, _ := mustAttach(t, a, s1)
	sendAs(t, a, sender, "s1", "for the runtime on hub-a")
	readFrame(t, ws) // delivered, not acknowledged: pending

	// hub-a dies; both survivors see it unhealthy.
	c.clock.Advance(11 * time.Second)
	c.tick("hub-b", "hub-c")

	resB, resC := dialAsync(c.hubs["hub-b"], s1), dialAsync(c.hubs["hub-c"], s1)
	res := map[string]dialResult{"hub-b": <-resB, "hub-c": <-resC}
	for _, r := range res {
		if r.conn != nil {
			t.Cleanup(func() { r.conn.CloseNow() })
		}
	}
	if race.timedOut {
		t.Fatal("the two takeovers did not both reach the assignment write")
	}
	var winner, loser string
	for id, r := range res {
		switch {
		case r.err != nil:
			t.Fatalf("attach on %s: %v", id, r.err)
		case r.conn != nil && winner == "":
			winner = id
		case r.conn == nil && loser == "":
			loser = id
		default:
			t.Fatalf("attaches: hub-b %d %v, hub-c %d %v; want exactly one accepted",
				res["hub-b"].status, res["hub-b"].body, res["hub-c"].status, res["hub-c"].body)
		}
	}
	w := readFrame(t, res[winner].conn)
	wantWelcome(t, "the winner's welcome", w, false, true, 0)
	if w["dropped"] != 1.0 || w["instance_id"] != winner {
		t.Fatalf("the winner's welcome %v, want dropped 1 from %s", w, winner)
	}
	wantWrongInstance(t, "the loser's answer", res[loser].status, res[loser].body, c.hubs[winner])

	if got := assignedOf(t, a, "s1"); got != winner {
		t.Fatalf("s1 assigned to %q, want the winner %s", got, winner)
	}
	s := summary(t, c.hubs[loser])
	if tt := totals(s); tt["total_fallbacks"] != 1.0 || tt["total_reassignments"] != 0.0 {
		t.Fatalf("summary totals %v, want 1 fallback, 0 reassignments", tt)
	}
	if ev := events(s); len(ev) != 1 || ev[0]["from_instance"] != "hub-a" || ev[0]["to_instance"] != winner ||
		ev[0]["reason"] != "instance_unhealthy" {
		t.Fatalf("fallback events %v, want one hub-a -> %s", ev, winner)
	}
	for id, want := range map[string]float64{winner: 1, loser: 0} {
		if got := metric(t, c.hubs[id], "marconi_fabric_fallbacks_total"); got != want {
			t.Fatalf("marconi_fabric_fallbacks_total on %s = %v, want %v", id, got, want)
		}
		drops, recs := stores[id].winnerCalls()
		if drops != int(want) || recs != int(want) {
			t.Fatalf("%s called DropPending %d and RecordFallback %d times, want %v each", id, drops, recs, want)
		}
	}

	// The loser keeps sending the client to the winner, and the winner
	// holds the session: a signal sent now reaches the winner's WebSocket.
	_, _, st, body := tryDial(t, c.hubs[loser], s1)
	wantWrongInstance(t, "a later attach on the loser", st, body, c.hubs[winner])
	sendAs(t, c.hubs[loser], sender, "s1", "after the race")
	if f := readFrame(t, res[winner].conn); f["payload"] != "after the race" {
		t.Fatalf("the winner's WebSocket read %v", f)
	}
}

// Two attaches of one session race to take it over on the same instance:
// one records the event, and both say affinity_reset (the reset happened).
func TestConcurrentTakeoversOnOneInstance(t *testing.T) {
	t.Parallel()
	c := newFabCluster(t, true, hub.Config{})
	race := newTakeoverRace(2)
	a := c.start("hub-a", nil)
	store := &racingStore{Store: c.openStore(""), race: race}
	b := c.start("hub-b", store)
	c.tick("hub-a", "hub-b")

	s1, _ := fabRegister(t, a, "s1", map[string]any{"runtime_mode": "sticky"})
	c.clock.Advance(11 * time.Second)
	c.tick("hub-b")

	r1, r2 := dialAsync(b, s1), dialAsync(b, s1)
	for _, r := range []dialResult{<-r1, <-r2} {
		if r.conn == nil {
			t.Fatalf("attach on hub-b: %d %v %v, want accepted", r.status, r.body, r.err)
		}
		t.Cleanup(func() { r.conn.CloseNow() })
		w := readFrame(t, r.conn)
		wantWelcome(t, "a racing attach on hub-b", w, false, true, 0)
	}
	if race.timedOut {
		t.Fatal("the two takeovers did not both reach the assignment write")
	}
	if tt := totals(summary(t, b)); tt["total_fallbacks"] != 1.0 {
		t.Fatalf("summary totals %v, want 1 fallback", tt)
	}
	if _, recs := store.winnerCalls(); recs != 1 {
		t.Fatalf("RecordFallback called %d times, want 1", recs)
	}
}

// Row "Gateway process restart with durable registry".
func TestMatrixRestartWithDurableRegistry(t *testing.T) {
	t.Parallel()
	c := fabStartDurable(t, hub.Config{}, "hub-a")
	a := c.hubs["hub-a"]
	sticky, _ := fabRegister(t, a, "sticky", map[string]any{"runtime_mode": "sticky"})
	free, _ := fabRegister(t, a, "free", nil)
	sender, _ := fabRegister(t, a, "sender", nil)
	ws, _ := mustAttach(t, a, sticky)
	sendAs(t, a, sender, "sticky", "before restart")
	if f := readFrame(t, ws); f["payload"] != "before restart" {
		t.Fatalf("live signal %v", f)
	}
	// Not acked. The process stops (SIGTERM path) and starts again with the
	// same id, on the same database. The client keeps reading, so it answers
	// the 1012 close at once.
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			if _, _, err := ws.Read(context.Background()); err != nil {
				return
			}
		}
	}()
	a.Close()
	<-readerDone
	c.clock.Advance(5 * time.Second)
	a2 := c.start("hub-a", nil)

	for _, x := range []struct {
		ag                 agent
		mode, source, inst string
	}{{sticky, "sticky", "explicit", "hub-a"}, {free, "stateless", "default", "hub-a"}} {
		st, r := call(t, "POST", a2.URL+"/v1/sessions", a2.APIKey,
			map[string]any{"session_id": x.ag.ID, "surface": "claude_code", "runtime_mode": "sticky"},
			"X-Marconi-Session-Token", x.ag.Token)
		if st != http.StatusOK || r["runtime_mode"] != x.mode || r["runtime_mode_source"] != x.source || r["instance_id"] != x.inst {
			t.Fatalf("resume %s after restart: %d %v, want 200 %s/%s on %s", x.ag.ID, st, r, x.mode, x.source, x.inst)
		}
		if x.ag.ID == "sticky" {
			sticky.Token = r["token"].(string)
			if r["instance_url"] != a2.URL {
				t.Fatalf("instance_url %v, want the restarted hub's %s", r["instance_url"], a2.URL)
			}
		}
	}
	ws2, w := mustAttach(t, a2, sticky)
	wantWelcome(t, "sticky after restart within grace", w, true, false, 1)
	if f := readFrame(t, ws2); f["payload"] != "before restart" {
		t.Fatalf("replayed %v", f)
	}
}

// Row "Gateway process restart without durable registry".
func TestMatrixRestartWithoutDurableRegistry(t *testing.T) {
	t.Parallel()
	key := hub.NewAPIKey()
	cfg := hub.Config{APIKeys: map[string]hub.TenantProject{key: {TenantID: "t1", ProjectID: "p1"}}}
	h := hubtest.Start(t, hubtest.Options{Config: cfg})
	s, _ := fabRegister(t, h, "s1", map[string]any{"runtime_mode": "sticky"})
	h.Close()

	h2 := hubtest.Start(t, hubtest.Options{Config: cfg}) // a fresh memstore: everything is gone
	if st, body := call(t, "POST", h2.URL+"/v1/heartbeat", s.Token, nil); st != http.StatusGone || errCode(body) != "session_expired" {
		t.Fatalf("heartbeat after restart: %d %v, want 410 session_expired", st, body)
	}
	if c, _, st, body := tryDial(t, h2, s); c != nil || st != http.StatusGone || errCode(body) != "session_expired" {
		t.Fatalf("attach after restart: %d %v, want 410 session_expired", st, body)
	}
	st, r := call(t, "POST", h2.URL+"/v1/sessions", h2.APIKey,
		map[string]any{"session_id": "s1", "surface": "claude_code", "runtime_mode": "sticky"}, "X-Marconi-Session-Token", s.Token)
	if st != http.StatusCreated || r["instance_id"] != h2.Server.InstanceID() {
		t.Fatalf("register again: %d %v, want 201, a new placement", st, r)
	}
}

// Row "Redis or durable registry outage": fail closed, recover without restart.
func TestMatrixRegistryOutage(t *testing.T) {
	t.Parallel()
	c := newFabCluster(t, true, hub.Config{StoreTimeout: time.Second})
	u, err := url.Parse(c.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	p := testproxy.Start(t, u.Host)
	u.Host = p.Addr()
	st := c.openStore(u.String())
	t.Cleanup(p.Close) // before the store closes: nothing waits on a cut link
	h := c.start("hub-a", st)
	s, _ := fabRegister(t, h, "s1", map[string]any{"runtime_mode": "sticky"})

	p.Cut()
	start := time.Now()
	code, body := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"surface": "claude_code", "runtime_mode": "sticky"})
	if code != http.StatusServiceUnavailable || errCode(body) != "registry_unavailable" {
		t.Fatalf("register during the outage: %d %v, want 503 registry_unavailable", code, body)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("503 took %v", d)
	}
	if _, _, code, body := tryDial(t, h, s); code != http.StatusServiceUnavailable || errCode(body) != "registry_unavailable" {
		t.Fatalf("attach during the outage: %d %v, want 503 registry_unavailable", code, body)
	}
	if code, _ := call(t, "GET", h.URL+"/readyz", "", nil); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz during the outage: %d, want 503", code)
	}
	if code, body := call(t, "GET", h.URL+"/v1/ops/fabric/summary", h.AdminToken, nil); code != http.StatusServiceUnavailable {
		t.Fatalf("summary during the outage: %d %v, want 503", code, body)
	}

	p.Restore()
	waitFor(t, "/readyz after the outage", func() bool {
		code, _ := call(t, "GET", h.URL+"/readyz", "", nil)
		return code == http.StatusOK
	})
	_, w := mustAttach(t, h, s)
	wantWelcome(t, "attach after the outage", w, false, false, 0)
	fabRegister(t, h, "s2", map[string]any{"runtime_mode": "sticky"})
}

// Row "Client disconnect within reconnect grace window".
func TestMatrixReconnectWithinGrace(t *testing.T) {
	t.Parallel()
	c := fabStartDurable(t, hub.Config{}, "hub-a", "hub-b")
	a, b := c.hubs["hub-a"], c.hubs["hub-b"]
	sticky, _ := fabRegister(t, a, "sticky", map[string]any{"runtime_mode": "sticky"})
	free, _ := fabRegister(t, b, "free", nil)
	sender, _ := fabRegister(t, a, "sender", nil)

	ws, w := mustAttach(t, a, sticky)
	wantWelcome(t, "first attach", w, false, false, 0)
	sendAs(t, a, sender, "sticky", "unacked")
	readFrame(t, ws)
	detach(t, a, ws, sticky)
	wsFree, _ := mustAttach(t, a, free)
	detach(t, a, wsFree, free)

	c.clock.Advance(30 * time.Second)
	c.tick("hub-a", "hub-b")
	_, _, st, body := tryDial(t, b, sticky)
	wantWrongInstance(t, "sticky elsewhere within grace", st, body, a)
	ws, w = mustAttach(t, a, sticky)
	wantWelcome(t, "sticky back within grace", w, true, false, 1)
	if f := readFrame(t, ws); f["payload"] != "unacked" {
		t.Fatalf("replayed %v", f)
	}
	// Stateless keeps its mode and may come back anywhere.
	_, w = mustAttach(t, b, free)
	wantWelcome(t, "stateless within grace on another hub", w, true, false, 0)
	if s := summary(t, a); totals(s)["total_fallbacks"] != 0.0 || totals(s)["total_reassignments"] != 0.0 {
		t.Fatalf("totals %v, want no takeover", totals(s))
	}
}

// Row "Reconnect after grace window or session TTL expiry", with both
// disconnect policies.
func TestMatrixReconnectAfterGrace(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{fabric.PolicyRetain, fabric.PolicyDrop} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			c := fabStartDurable(t, hub.Config{Fabric: fabric.Config{DisconnectPolicy: policy}}, "hub-a", "hub-b")
			a, b := c.hubs["hub-a"], c.hubs["hub-b"]
			sticky, _ := fabRegister(t, a, "sticky", map[string]any{"runtime_mode": "sticky"})
			home, _ := fabRegister(t, a, "home", map[string]any{"runtime_mode": "sticky"})
			if got := assignedOf(t, a, "home"); got != "hub-b" {
				t.Fatalf("home placed on %q, want hub-b", got)
			}
			sender, _ := fabRegister(t, a, "sender", nil)
			ws, _ := mustAttach(t, a, sticky)
			sendAs(t, a, sender, "sticky", "for the old runtime")
			readFrame(t, ws)
			detach(t, a, ws, sticky)
			wsHome, _ := mustAttach(t, b, home)
			detach(t, b, wsHome, home)

			c.clock.Advance(61 * time.Second)
			c.tick("hub-a", "hub-b") // both healthy: only the grace window passed
			ws, w := mustAttach(t, b, sticky)
			if policy == fabric.PolicyDrop {
				wantWelcome(t, "after grace, drop", w, false, true, 0)
				if w["dropped"] != 1.0 {
					t.Fatalf("welcome %v, want dropped 1", w)
				}
				if got := metric(t, b, "marconi_signals_dropped_total", "reason", "affinity_reset"); got != 1 {
					t.Fatalf("marconi_signals_dropped_total{affinity_reset} = %v, want 1", got)
				}
			} else {
				wantWelcome(t, "after grace, retain", w, false, true, 1)
				if _, ok := w["dropped"]; ok {
					t.Fatalf("welcome %v carries dropped under retain", w)
				}
				if f := readFrame(t, ws); f["payload"] != "for the old runtime" {
					t.Fatalf("replayed %v", f)
				}
			}
			// Assigned to the hub it came back to, after grace: a new placement too.
			_, w = mustAttach(t, b, home)
			wantWelcome(t, "home after grace", w, false, true, 0)

			s := summary(t, a)
			if tt := totals(s); tt["total_reassignments"] != 2.0 || tt["total_fallbacks"] != 0.0 {
				t.Fatalf("totals %v, want 2 reassignments, no fallback", tt)
			}
			ev := events(s)
			if len(ev) != 2 || ev[0]["reason"] != "grace_expired" || ev[1]["reason"] != "grace_expired" {
				t.Fatalf("events %v", ev)
			}
			if got := metric(t, b, "marconi_fabric_reassignments_total"); got != 2 {
				t.Fatalf("marconi_fabric_reassignments_total = %v, want 2", got)
			}
		})
	}
}

// Row "Automatic retry or reassignment": no takeover ever claims that local
// state survived.
func TestMatrixRetryOrReassignmentNeverClaimsStateSurvived(t *testing.T) {
	t.Parallel()
	c := fabStartDurable(t, hub.Config{}, "hub-a", "hub-b")
	a, b := c.hubs["hub-a"], c.hubs["hub-b"]
	s1, _ := fabRegister(t, a, "s1", map[string]any{"runtime_mode": "sticky"}) // on hub-a
	s2, _ := fabRegister(t, a, "s2", map[string]any{"runtime_mode": "sticky"}) // on hub-b
	for _, x := range []struct {
		h *hubtest.Hub
		a agent
	}{{a, s1}, {b, s2}} {
		ws, _ := mustAttach(t, x.h, x.a)
		detach(t, x.h, ws, x.a)
	}
	// Within grace, hub-a dies: s1 retried on hub-b is a takeover.
	c.clock.Advance(11 * time.Second)
	c.tick("hub-b")
	_, w := mustAttach(t, b, s1)
	wantWelcome(t, "retry on another instance", w, false, true, 0)
	// Retrying the same attach again right away is no resume of the old state
	// either: it was assigned here by the takeover and is attached here now.
	_, w = mustAttach(t, b, s1)
	if w["affinity_reset"] != false || w["resumed"] != true {
		t.Fatalf("second attach after the takeover: %v, want resumed on the new placement", w)
	}
	// Past grace on its own (healthy) instance: a reassignment, reset too.
	c.clock.Advance(61 * time.Second)
	c.tick("hub-b")
	_, w = mustAttach(t, b, s2)
	wantWelcome(t, "reassignment on the same instance", w, false, true, 0)
}

// Row "State hydration": the hub sends the welcome, replayed signals and live
// signals, and nothing else, even after a takeover.
func TestMatrixNoStateHydration(t *testing.T) {
	t.Parallel()
	c := fabStartDurable(t, hub.Config{}, "hub-a", "hub-b")
	a, b := c.hubs["hub-a"], c.hubs["hub-b"]
	s1, _ := fabRegister(t, a, "s1", map[string]any{"runtime_mode": "sticky"})
	sender, _ := fabRegister(t, b, "sender", nil)
	ws, _ := mustAttach(t, a, s1)
	sendAs(t, a, sender, "s1", map[string]any{"n": 1})
	readFrame(t, ws)
	detach(t, a, ws, s1)
	c.clock.Advance(11 * time.Second)
	c.tick("hub-b")

	ws, w := mustAttach(t, b, s1)
	// history: the token of the store's history (Postgres keeps one), not state.
	wantKeys(t, "welcome", w, "type", "session_id", "instance_id", "resumed", "affinity_reset", "replayed", "history")
	if w["affinity_reset"] != true || w["instance_id"] != "hub-b" {
		t.Fatalf("welcome %v", w)
	}
	replayed := readFrame(t, ws)
	sendAs(t, b, sender, "s1", map[string]any{"n": 2})
	live := readFrame(t, ws)
	for i, f := range []map[string]any{replayed, live} {
		wantKeys(t, "signal frame", f, "type", "id", "seq", "from_session", "to_session", "kind", "payload", "created_at")
		if f["type"] != "signal" || f["seq"] != float64(i+1) {
			t.Fatalf("frame %d: %v, want signal seq %d", i, f, i+1)
		}
	}
}

func wantKeys(t *testing.T, what string, m map[string]any, keys ...string) {
	t.Helper()
	var got []string
	for k := range m {
		got = append(got, k)
	}
	sort.Strings(got)
	sort.Strings(keys)
	if !slices.Equal(got, keys) {
		t.Fatalf("%s has keys %v, want exactly %v", what, got, keys)
	}
}

// --- the summary's shape ---

func TestFabricSummaryShape(t *testing.T) {
	t.Parallel()
	c := newFabCluster(t, false, hub.Config{Fabric: fabric.Config{Placement: fabric.PlacementConfig{
		Adaptive: true, AdaptiveClients: []string{"canary"}}}})
	h := c.start("hub-a", nil)
	fabRegister(t, h, "s1", map[string]any{"runtime_mode": "sticky"})
	fabRegister(t, h, "s2", map[string]any{"client_id": "canary", "hints": map[string]any{"local_state": true}})
	fabRegister(t, h, "s3", nil)
	if code, _ := call(t, "GET", h.URL+"/v1/ops/fabric/summary", "", nil); code != http.StatusUnauthorized {
		t.Fatalf("summary without the admin token: %d, want 401", code)
	}
	s := summary(t, h)
	wantKeys(t, "summary", s, "adaptive_placement", "sessions", "instances", "summary", "fallback_events")
	ap := s["adaptive_placement"].(map[string]any)
	if ap["gate"] != "on" || len(ap["allowlist"].([]any)) != 1 || ap["allowlist"].([]any)[0] != "canary" {
		t.Fatalf("adaptive_placement %v", ap)
	}
	wantKeys(t, "adaptive_placement", ap, "gate", "allowlist", "by_client")
	if bc := ap["by_client"].([]any); len(bc) != 1 {
		t.Fatalf("by_client %v, want the canary's one placement", bc)
	} else {
		p := bc[0].(map[string]any)
		wantKeys(t, "by_client[0]", p, "client_id", "sessions", "by_mode", "on_allowlist")
		if p["client_id"] != "canary" || p["sessions"] != 1.0 || p["by_mode"].(map[string]any)["sticky"] != 1.0 || p["on_allowlist"] != true {
			t.Fatalf("by_client[0] %v", p)
		}
	}
	ss := s["sessions"].(map[string]any)
	wantKeys(t, "sessions", ss, "total", "by_mode", "by_source")
	if ss["total"] != 3.0 || ss["by_mode"].(map[string]any)["sticky"] != 2.0 ||
		ss["by_source"].(map[string]any)["adaptive-classifier"] != 1.0 || ss["by_source"].(map[string]any)["default"] != 1.0 {
		t.Fatalf("sessions %v", ss)
	}
	ins := s["instances"].([]any)
	if len(ins) != 1 {
		t.Fatalf("instances %v", ins)
	}
	in := ins[0].(map[string]any)
	wantKeys(t, "instance", in, "instance_id", "url", "healthy", "draining", "process", "sessions", "attached_queues", "last_heartbeat_at", "bus_key_version")
	if in["instance_id"] != "hub-a" || in["url"] != h.URL || in["healthy"] != true || in["process"] != "connected" || in["sessions"] != 2.0 || in["attached_queues"] != 0.0 ||
		in["bus_key_version"] != nil {
		t.Fatalf("instance %v", in)
	}
	wantKeys(t, "summary.summary", totals(s), "total_fallbacks", "total_reassignments", "total_adaptive_placements", "total_adaptive_placement_mismatches")
	if totals(s)["total_adaptive_placements"] != 1.0 {
		t.Fatalf("totals %v", totals(s))
	}
	if evs := s["fallback_events"].([]any); len(evs) != 0 {
		t.Fatalf("fallback_events %v, want []", evs)
	}
}

// --- adaptive placement ---

func adaptiveHub(t *testing.T, pc fabric.PlacementConfig) *hubtest.Hub {
	t.Helper()
	c := newFabCluster(t, false, hub.Config{Fabric: fabric.Config{Placement: pc}})
	return c.start("hub-a", nil)
}

func modeOf(t *testing.T, h *hubtest.Hub, id string, extra map[string]any) (string, string) {
	t.Helper()
	_, r := fabRegister(t, h, id, extra)
	return r["runtime_mode"].(string), r["runtime_mode_source"].(string)
}

func TestAdaptivePlacementGateAndAllowlist(t *testing.T) {
	t.Parallel()
	local := map[string]any{"local_state": true}
	cases := []struct {
		name         string
		pc           fabric.PlacementConfig
		body         map[string]any
		mode, source string
	}{
		{"gate off", fabric.PlacementConfig{AdaptiveClients: []string{"*"}},
			map[string]any{"client_id": "canary", "hints": local}, "stateless", "default"},
		{"gate on, allowlisted", fabric.PlacementConfig{Adaptive: true, AdaptiveClients: []string{"canary"}},
			map[string]any{"client_id": "canary", "hints": local}, "sticky", "adaptive-classifier"},
		{"gate on, allowlisted, replay-safe", fabric.PlacementConfig{Adaptive: true, AdaptiveClients: []string{"canary"}},
			map[string]any{"client_id": "canary"}, "stateless", "adaptive-classifier"},
		{"gate on, side effects", fabric.PlacementConfig{Adaptive: true, AdaptiveClients: []string{"canary"}},
			map[string]any{"client_id": "canary", "hints": map[string]any{"side_effects": true}}, "sticky", "adaptive-classifier"},
		{"gate on, not on the list", fabric.PlacementConfig{Adaptive: true, AdaptiveClients: []string{"canary"}},
			map[string]any{"client_id": "other", "hints": local}, "stateless", "default"},
		{"gate on, no client id", fabric.PlacementConfig{Adaptive: true, AdaptiveClients: []string{"*"}},
			map[string]any{"hints": local}, "stateless", "default"},
		{"gate on, star", fabric.PlacementConfig{Adaptive: true, AdaptiveClients: []string{"*"}},
			map[string]any{"client_id": "anyone", "hints": local}, "sticky", "adaptive-classifier"},
		{"explicit wins", fabric.PlacementConfig{Adaptive: true, AdaptiveClients: []string{"*"}},
			map[string]any{"client_id": "canary", "runtime_mode": "stateless", "hints": local}, "stateless", "explicit"},
		{"default mode sticky", fabric.PlacementConfig{DefaultMode: "sticky"},
			map[string]any{"client_id": "canary"}, "sticky", "default"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := adaptiveHub(t, tc.pc)
			mode, source := modeOf(t, h, "s", tc.body)
			if mode != tc.mode || source != tc.source {
				t.Fatalf("mode %s source %s, want %s %s", mode, source, tc.mode, tc.source)
			}
			wantPlaced := 0.0
			if source == "adaptive-classifier" {
				wantPlaced = 1
			}
			if got := metric(t, h, "marconi_adaptive_placements_total"); got != wantPlaced {
				t.Fatalf("marconi_adaptive_placements_total = %v, want %v", got, wantPlaced)
			}
		})
	}
}

func TestAdaptiveResumeKeepsStoredMode(t *testing.T) {
	t.Parallel()
	h := adaptiveHub(t, fabric.PlacementConfig{Adaptive: true, AdaptiveClients: []string{"canary"}})
	s, r := fabRegister(t, h, "s", map[string]any{"client_id": "canary", "hints": map[string]any{"local_state": true}})
	if r["runtime_mode"] != "sticky" {
		t.Fatalf("registration %v", r)
	}
	st, r := call(t, "POST", h.URL+"/v1/sessions", h.APIKey,
		map[string]any{"session_id": "s", "surface": "claude_code", "runtime_mode": "stateless", "client_id": "canary"},
		"X-Marconi-Session-Token", s.Token)
	if st != http.StatusOK || r["runtime_mode"] != "sticky" || r["runtime_mode_source"] != "adaptive-classifier" {
		t.Fatalf("resume: %d %v, want 200 keeping sticky/adaptive-classifier", st, r)
	}
	if got := metric(t, h, "marconi_adaptive_placements_total"); got != 1 {
		t.Fatalf("a resume counted as a placement: %v", got)
	}
}

func TestPlacementMismatchAndRollback(t *testing.T) {
	t.Parallel()
	c := newFabCluster(t, false, hub.Config{Fabric: fabric.Config{Placement: fabric.PlacementConfig{
		Adaptive: true, AdaptiveClients: []string{"canary"}, RollbackAfter: 2}}})
	h := c.start("hub-a", nil)
	h2 := c.start("hub-b", nil) // shares the store: the count is cluster-wide
	c.tick("hub-a")
	placed, _ := fabRegister(t, h, "placed", map[string]any{"client_id": "canary"})
	explicit, _ := fabRegister(t, h, "explicit", map[string]any{"client_id": "canary", "runtime_mode": "stateless"})
	dflt, _ := fabRegister(t, h, "dflt", nil)

	for _, a := range []agent{explicit, dflt} {
		if st, body := call(t, "POST", h.URL+"/v1/placement-mismatch", a.Token, map[string]any{"reason": "x"}); st != http.StatusConflict || errCode(body) != "not_adaptive_placement" {
			t.Fatalf("mismatch from %s: %d %v, want 409 not_adaptive_placement", a.ID, st, body)
		}
	}
	if st, body := call(t, "POST", h.URL+"/v1/placement-mismatch", placed.Token, "[]"); st != http.StatusBadRequest {
		t.Fatalf("mismatch with a bad body: %d %v", st, body)
	}
	if st, body := call(t, "POST", h.URL+"/v1/placement-mismatch", placed.Token, map[string]any{"reason": "needed the shell's cwd"}); st != http.StatusNoContent {
		t.Fatalf("mismatch: %d %v, want 204", st, body)
	}
	if s := summary(t, h); totals(s)["total_adaptive_placement_mismatches"] != 1.0 || s["adaptive_placement"].(map[string]any)["gate"] != "on" {
		t.Fatalf("after one mismatch: %v", s)
	}
	if got := metric(t, h, "marconi_adaptive_placement_mismatches_total"); got != 1 {
		t.Fatalf("marconi_adaptive_placement_mismatches_total = %v", got)
	}
	if _, src := modeOf(t, h, "before", map[string]any{"client_id": "canary"}); src != "adaptive-classifier" {
		t.Fatalf("placed by %s before the rollback", src)
	}

	// The second mismatch, reported to the other instance, reaches the threshold.
	if st, body := call(t, "POST", h2.URL+"/v1/placement-mismatch", placed.Token, map[string]any{}); st != http.StatusNoContent {
		t.Fatalf("second mismatch: %d %v", st, body)
	}
	if got := metric(t, h2, "marconi_adaptive_placement_rolled_back"); got != 1 {
		t.Fatalf("rolled back gauge on hub-b = %v, want 1", got)
	}
	if _, src := modeOf(t, h2, "after-b", map[string]any{"client_id": "canary"}); src != "default" {
		t.Fatalf("hub-b placed by %s after the rollback", src)
	}
	// hub-a learns it on its next tick.
	c.tick("hub-a")
	if s := summary(t, h); s["adaptive_placement"].(map[string]any)["gate"] != "rolled_back" {
		t.Fatalf("gate on hub-a: %v", s["adaptive_placement"])
	}
	if got := metric(t, h, "marconi_adaptive_placement_rolled_back"); got != 1 {
		t.Fatalf("rolled back gauge on hub-a = %v, want 1", got)
	}
	mode, src := modeOf(t, h, "after-a", map[string]any{"client_id": "canary", "hints": map[string]any{"local_state": true}})
	if src != "default" || mode != "stateless" {
		t.Fatalf("hub-a placed %s by %s after the rollback", mode, src)
	}
	if mode, src := modeOf(t, h, "explicit-after", map[string]any{"client_id": "canary", "runtime_mode": "sticky"}); mode != "sticky" || src != "explicit" {
		t.Fatalf("explicit after the rollback: %s %s", mode, src)
	}
}

// --- reserved modes at every entry point ---

func TestReservedModesRejectedEverywhere(t *testing.T) {
	t.Parallel()
	h := adaptiveHub(t, fabric.PlacementConfig{Adaptive: true, AdaptiveClients: []string{"*"}})
	for _, m := range []string{"soft_sticky", "pinned", "hybrid"} {
		st, body := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": "r-" + m, "surface": "claude_code", "runtime_mode": m, "client_id": "c"})
		if st != http.StatusBadRequest || errCode(body) != "reserved_runtime_mode" {
			t.Fatalf("register %s: %d %v, want 400 reserved_runtime_mode", m, st, body)
		}
		if rs := routeState(t, h, "r-"+m); rs["route_state"] != "not_registered" {
			t.Fatalf("%s stored something: %v", m, rs)
		}
		cfg := hub.Config{Fabric: fabric.Config{Placement: fabric.PlacementConfig{DefaultMode: fabric.Mode(m)}}}
		if _, err := hub.New(cfg, hub.Deps{Store: memstore.New()}); err == nil {
			t.Fatalf("hub.New with default runtime mode %s: no error", m)
		}
	}
	if st, body := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"surface": "claude_code", "runtime_mode": "roaming"}); st != http.StatusBadRequest || errCode(body) != "invalid_runtime_mode" {
		t.Fatalf("unknown mode: %d %v", st, body)
	}
	if s := summary(t, h); s["sessions"].(map[string]any)["total"] != 0.0 {
		t.Fatalf("sessions stored: %v", s["sessions"])
	}
}
