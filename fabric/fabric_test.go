package fabric

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/internal/testwait"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

type testClock struct{ t time.Time }

func (c *testClock) now() time.Time { return c.t }

func newTestFabric(t *testing.T, st sessionstore.Store, clk *testClock, id string) *Fabric {
	t.Helper()
	return newProbedFabric(t, st, clk, id, nil)
}

// newProbedFabric is newTestFabric with a prober (nil: none).
func newProbedFabric(t *testing.T, st sessionstore.Store, clk *testClock, id string, p Prober) *Fabric {
	t.Helper()
	f, err := New(Config{InstanceID: id, PublicURL: "http://" + id}, Deps{Store: st, Prober: p, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestHealthFromTheCachedView(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a, b := newTestFabric(t, st, clk, "a"), newTestFabric(t, st, clk, "b")
	if a.Members.Healthy(ctx, "b") {
		t.Fatal("b healthy before anyone heartbeated")
	}
	for _, f := range []*Fabric{b, a} {
		if err := f.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !a.Members.Healthy(ctx, "b") || a.Members.URL(ctx, "b") != "http://b" {
		t.Fatalf("a sees b healthy=%v url=%q", a.Members.Healthy(ctx, "b"), a.Members.URL(ctx, "b"))
	}
	clk.t = clk.t.Add(9 * time.Second)
	if !a.Members.Healthy(ctx, "b") {
		t.Fatal("b unhealthy 9s after its heartbeat (dead after 10s)")
	}
	clk.t = clk.t.Add(time.Second)
	if a.Members.Healthy(ctx, "b") {
		t.Fatal("b healthy 10s after its heartbeat")
	}
	if !a.Members.Healthy(ctx, "a") {
		t.Fatal("an instance that is not draining is healthy to itself")
	}
	if err := b.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Members.Healthy(ctx, "b") {
		t.Fatal("a saw b's new heartbeat without a refresh: Healthy must not read the store")
	}
	if err := a.Members.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if !a.Members.Healthy(ctx, "b") {
		t.Fatal("b unhealthy after a fresh heartbeat and a refresh")
	}
	if err := b.Members.SetDraining(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Members.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Members.Healthy(ctx, "b") || b.Members.Healthy(ctx, "b") {
		t.Fatal("a draining instance is healthy")
	}
}

// countingStore counts the reads of the instance table.
type countingStore struct {
	sessionstore.Store
	lists atomic.Int32
}

func (s *countingStore) ListInstances(ctx context.Context) ([]sessionstore.Instance, error) {
	s.lists.Add(1)
	return s.Store.ListInstances(ctx)
}

// A process serves before its first tick has read the instance table (a
// slow store under load): its first decisions read the table themselves,
// once, rather than judge every other instance dead from an empty view (a
// send to a queue attached on a live peer answered queued_offline).
func TestDecisionsBeforeTheFirstTickReadTheTable(t *testing.T) {
	ctx := context.Background()
	st := &countingStore{Store: memstore.New()}
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	if err := st.HeartbeatInstance(ctx, sessionstore.Instance{ID: "b", URL: "http://b", StartedAt: clk.t, LastHeartbeatAt: clk.t}); err != nil {
		t.Fatal(err)
	}
	a := newTestFabric(t, st, clk, "a") // never ticked
	if !a.Members.HoldsQueue(ctx, "b", clk.t) {
		t.Fatal("a, before its first tick, takes a queue on b (heartbeat fresh) for absent")
	}
	if !a.Members.Healthy(ctx, "b") || !slices.Equal(a.Members.healthyOthers(ctx), []string{"b"}) {
		t.Fatalf("a, before its first tick: b healthy %v, healthy others %v", a.Members.Healthy(ctx, "b"), a.Members.healthyOthers(ctx))
	}
	if n := st.lists.Load(); n != 1 {
		t.Fatalf("the instance table was read %d times, want once: later decisions read the view", n)
	}
}

// slowListStore holds every read of the instance table until release is
// closed or the read's context ends (as a real store's query does), and
// says when the first one started.
type slowListStore struct {
	sessionstore.Store
	lists   atomic.Int32
	entered chan struct{} // closed by the first read
	once    sync.Once
	release chan struct{}
}

func newSlowListStore() *slowListStore {
	return &slowListStore{Store: memstore.New(), entered: make(chan struct{}), release: make(chan struct{})}
}

func (s *slowListStore) ListInstances(ctx context.Context) ([]sessionstore.Instance, error) {
	s.lists.Add(1)
	s.once.Do(func() { close(s.entered) })
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Store.ListInstances(ctx)
}

// The first decision's request is cancelled (its client went away) while
// its read of the instance table, shared with every decision made before
// the first tick, is under way: the read goes on, and a decision that
// shares it sees the live peer healthy, rather than the empty view (every
// peer dead) that a read cancelled with its first caller would leave.
func TestFirstReadOfTheTableOutlivesItsFirstCaller(t *testing.T) {
	ctx := context.Background()
	st := newSlowListStore()
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	if err := st.HeartbeatInstance(ctx, sessionstore.Instance{ID: "b", URL: "http://b", StartedAt: clk.t, LastHeartbeatAt: clk.t}); err != nil {
		t.Fatal(err)
	}
	a := newTestFabric(t, st, clk, "a") // never ticked
	firstCtx, cancelFirst := context.WithCancel(ctx)
	first, second := make(chan bool, 1), make(chan bool, 1)
	go func() { first <- a.Members.HoldsQueue(firstCtx, "b", clk.t) }()
	testwait.Receive(t, "the first read of the instance table", 10*time.Second, st.entered)
	go func() { second <- a.Members.Healthy(ctx, "b") }()
	cancelFirst()
	// The cancelled caller returns without waiting for the read.
	testwait.Receive(t, "the cancelled first decision", 10*time.Second, first)
	close(st.release)
	if !testwait.Receive(t, "the second decision", 10*time.Second, second) {
		t.Fatal("a decision sharing the first read, whose first caller was cancelled, judged the live peer b dead")
	}
	if n := st.lists.Load(); n != 1 {
		t.Fatalf("the instance table was read %d times, want once, shared", n)
	}
}

// The shared first read has a bound of its own (StoreTimeout): a store that
// never answers fails it, and the next decision reads again.
func TestFirstReadOfTheTableIsBounded(t *testing.T) {
	st := newSlowListStore()
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	f, err := New(Config{InstanceID: "a", StoreTimeout: 20 * time.Millisecond}, Deps{Store: st, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.Members.ensureLoaded(context.Background()) }()
	if err := testwait.Receive(t, "the bounded first read", 10*time.Second, done); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first read of a store that never answers: %v, want a deadline exceeded", err)
	}
	close(st.release)
	if err := f.Members.ensureLoaded(context.Background()); err != nil || st.lists.Load() != 2 {
		t.Fatalf("the next decision: %v after %d reads, want a second read that succeeds", err, st.lists.Load())
	}
}

// URL and Reporter read the view too, so before the first tick they read
// the instance table: a holder's address named in a send's answer, and the
// cluster gauges exported by one instance, not by every one just started.
func TestURLAndReporterBeforeTheFirstTickReadTheTable(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	for _, id := range []string{"a", "c"} {
		if err := st.HeartbeatInstance(ctx, sessionstore.Instance{ID: id, URL: "http://" + id, StartedAt: clk.t, LastHeartbeatAt: clk.t}); err != nil {
			t.Fatal(err)
		}
	}
	b := newTestFabric(t, st, clk, "b") // never ticked
	if u := b.Members.URL(ctx, "c"); u != "http://c" {
		t.Fatalf("b's URL of c before b's first tick = %q, want http://c", u)
	}
	b = newTestFabric(t, st, clk, "b")
	if b.Members.Reporter(ctx) {
		t.Fatal("b, before its first tick, claims the cluster gauges while a (a lower id) is healthy")
	}
}

func TestAssignLeastLoaded(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a, b, c := newTestFabric(t, st, clk, "a"), newTestFabric(t, st, clk, "b"), newTestFabric(t, st, clk, "c")
	for _, f := range []*Fabric{a, b, c, a, b} {
		if err := f.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for i := range 6 {
		inst, err := b.Placer.Assign(ctx, "t", "p")
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, inst)
		k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: string(rune('a' + i))}
		_, err = st.CreateSession(ctx, sessionstore.Session{Key: k, RuntimeMode: ModeSticky, TokenHash: []byte(k.SessionID),
			RegisteredAt: clk.t, ExpiresAt: clk.t.Add(time.Hour), AssignedInstance: inst}, clk.t)
		if err != nil {
			t.Fatal(err)
		}
	}
	// b answers: ties go to b first, then to the lowest id.
	want := []string{"b", "a", "c", "b", "a", "c"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("assignments %v, want %v", got, want)
		}
	}
	// c dies: it gets nothing more.
	clk.t = clk.t.Add(11 * time.Second)
	for _, f := range []*Fabric{a, b} {
		if err := f.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if inst, _ := b.Placer.Assign(ctx, "t", "p"); inst == "c" {
			t.Fatal("assigned to an unhealthy instance")
		}
	}
}

// By project (MARCONI_STICKY_PLACEMENT=project), a new sticky session goes
// where its project already is: its sessions' queues, or the assignments of
// those not attached yet, on a healthy instance; a project with none there is
// placed by the fewest sticky sessions. By the fewest (the default), the
// project does not count.
func TestAssignByProject(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	byProject := func(id string) *Fabric {
		f, err := New(Config{InstanceID: id, PublicURL: "http://" + id, Placement: PlacementConfig{Sticky: StickyByProject}},
			Deps{Store: st, Now: clk.now})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	a, b, c := byProject("a"), byProject("b"), byProject("c")
	fewest := newTestFabric(t, st, clk, "b") // instance b again, configured by the fewest
	for _, f := range []*Fabric{a, b, c, fewest, a, b} {
		if err := f.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	create := func(project, id string, mode Mode, assigned, attached string) {
		t.Helper()
		k := sessionstore.Key{TenantID: "t", ProjectID: project, SessionID: id}
		_, err := st.CreateSession(ctx, sessionstore.Session{Key: k, RuntimeMode: mode, TokenHash: []byte(project + id),
			RegisteredAt: clk.t, ExpiresAt: clk.t.Add(time.Hour), AssignedInstance: assigned}, clk.t)
		if err != nil {
			t.Fatal(err)
		}
		if attached != "" {
			touch := sessionstore.Touch{VerbAt: clk.t, ExpiresAt: clk.t.Add(time.Hour)}
			if _, err := st.AttachQueue(ctx, k, attached, clk.t, touch, clk.t); err != nil {
				t.Fatal(err)
			}
		}
	}
	// c is the busiest by sticky sessions: p1's two, registered and not
	// attached yet, and another of p2 attached there.
	create("p1", "s1", ModeSticky, "c", "")
	create("p1", "s2", ModeSticky, "c", "")
	create("p2", "s1", ModeSticky, "c", "c")
	// p2's stateless agents are attached on a, which holds no sticky session.
	for _, id := range []string{"s2", "s3", "s4"} {
		create("p2", id, ModeStateless, "", "a")
	}
	for _, c := range []struct {
		project string
		placer  *Fabric
		want    string
	}{
		{"p1", b, "c"},      // where p1's sessions are assigned, though c has the most sticky sessions
		{"p2", b, "a"},      // where most of p2 is attached (three on a, one on c)
		{"p3", b, "b"},      // a new project: the fewest (a and b tie; b answers)
		{"p1", fewest, "b"}, // by the fewest, the project does not count
	} {
		got, err := c.placer.Placer.Assign(ctx, "t", c.project)
		if err != nil || got != c.want {
			t.Errorf("Assign(%s) by %s = %q, %v; want %q", c.project, c.placer.Placer.cfg.Placement.Sticky, got, err, c.want)
		}
	}
	// c dies: p1 is no longer anywhere healthy, and goes by the fewest.
	clk.t = clk.t.Add(11 * time.Second)
	for _, f := range []*Fabric{a, b} {
		if err := f.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := b.Placer.Assign(ctx, "t", "p1"); err != nil || got != "b" {
		t.Errorf("Assign(p1) with its instance dead = %q, %v; want b (the fewest)", got, err)
	}
}

// The canary view lists adaptive placements by client, most first, says
// which clients are on the allowlist now, and leaves out other sources.
func TestSummaryCanaryView(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	f, err := New(Config{InstanceID: "a", Placement: PlacementConfig{Adaptive: true, AdaptiveClients: []string{"canary-2"}}}, Deps{Store: st, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	add := func(id, client string, mode Mode, source ModeSource) {
		_, err := st.CreateSession(ctx, sessionstore.Session{
			Key: sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: id}, Surface: "claude_code",
			RuntimeMode: mode, RuntimeModeSource: source, ClientID: client, TokenHash: []byte(id),
			RegisteredAt: clk.t, ExpiresAt: clk.t.Add(time.Hour),
		}, clk.t)
		if err != nil {
			t.Fatal(err)
		}
	}
	add("1", "canary-1", ModeSticky, SourceAdaptive) // placed under an earlier allowlist
	add("2", "canary-2", ModeSticky, SourceAdaptive)
	add("3", "canary-2", ModeStateless, SourceAdaptive)
	add("4", "canary-2", ModeSticky, SourceExplicit) // not the classifier's
	add("5", "other", ModeStateless, SourceDefault)
	s, err := f.Summary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []ClientPlacements{
		{ClientID: "canary-2", Sessions: 2, ByMode: map[Mode]int{"sticky": 1, "stateless": 1}, OnAllowlist: true},
		{ClientID: "canary-1", Sessions: 1, ByMode: map[Mode]int{"sticky": 1}, OnAllowlist: false},
	}
	if len(s.ByClient) != len(want) {
		t.Fatalf("ByClient = %+v, want %+v", s.ByClient, want)
	}
	for i := range want {
		g, w := s.ByClient[i], want[i]
		if g.ClientID != w.ClientID || g.Sessions != w.Sessions || g.OnAllowlist != w.OnAllowlist || !maps.Equal(g.ByMode, w.ByMode) {
			t.Errorf("ByClient[%d] = %+v, want %+v", i, g, w)
		}
	}
}

// fakeProber answers ConnectedInstances from a set the test sets, as seen
// on server: the current process (the StartedAt in st) of each instance in
// live is connected.
type fakeProber struct {
	st     sessionstore.Store
	live   map[string]bool
	server string
}

func (p *fakeProber) ConnectedInstances(ctx context.Context) (map[string]time.Time, string, error) {
	list, err := p.st.ListInstances(ctx)
	if err != nil {
		return nil, "", err
	}
	live := map[string]time.Time{}
	for _, in := range list {
		if p.live[in.ID] {
			live[in.ID] = in.StartedAt
		}
	}
	return live, p.server, nil
}

// Probe judges only a process it saw connected: one never seen (an older
// binary, a listener not yet up) keeps its heartbeat's verdict, one seen and
// gone is dead at once, and a restart (a new StartedAt) starts unseen.
func TestProbeJudgesOnlyProcessesSeenConnected(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	p := &fakeProber{st: st, live: map[string]bool{}}
	a := newProbedFabric(t, st, clk, "a", p)
	beat := func(id string, started time.Time) {
		t.Helper()
		if err := st.HeartbeatInstance(ctx, sessionstore.Instance{ID: id, URL: "http://" + id, StartedAt: started, LastHeartbeatAt: clk.t}); err != nil {
			t.Fatal(err)
		}
	}
	process := func(id string) string {
		t.Helper()
		s, err := a.Summary(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range s.Instances {
			if in.ID == id {
				return in.Process
			}
		}
		return "absent"
	}
	beat("b", clk.t)
	if err := a.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if !a.Members.Healthy(ctx, "b") || process("b") != ProcessUnknown {
		t.Fatalf("b never seen connected: healthy %v, process %q; want healthy, unknown", a.Members.Healthy(ctx, "b"), process("b"))
	}
	p.live["b"] = true
	if err := a.Members.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	if !a.Members.Healthy(ctx, "b") || process("b") != ProcessConnected {
		t.Fatalf("b connected: healthy %v, process %q", a.Members.Healthy(ctx, "b"), process("b"))
	}
	delete(p.live, "b") // its connection ended; its heartbeat is still fresh
	if err := a.Members.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Members.Healthy(ctx, "b") || a.Members.HoldsQueue(ctx, "b", clk.t) || process("b") != ProcessGone {
		t.Fatalf("b gone: healthy %v, process %q; want unhealthy, gone", a.Members.Healthy(ctx, "b"), process("b"))
	}
	clk.t = clk.t.Add(time.Second)
	beat("b", clk.t) // restarted: a new process, not yet connected
	if err := a.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if !a.Members.Healthy(ctx, "b") || process("b") != ProcessUnknown {
		t.Fatalf("b restarted, listener not up yet: healthy %v, process %q; want healthy by its heartbeat, unknown", a.Members.Healthy(ctx, "b"), process("b"))
	}
}

// After a failover the prober answers from another server, where no
// listener has taken its lock yet: an instance seen connected before is not
// declared dead for that (its heartbeat judges it), becomes connected again
// once its lock is seen there, and is gone if its lock goes after that.
func TestProbeOnAnotherServerForgetsWhoWasConnected(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	p := &fakeProber{st: st, live: map[string]bool{"b": true}, server: "primary"}
	a := newProbedFabric(t, st, clk, "a", p)
	if err := st.HeartbeatInstance(ctx, sessionstore.Instance{ID: "b", URL: "http://b", StartedAt: clk.t, LastHeartbeatAt: clk.t}); err != nil {
		t.Fatal(err)
	}
	probe := func(live bool, server string) {
		t.Helper()
		p.live["b"], p.server = live, server
		if err := a.Members.Probe(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Tick(ctx); err != nil { // sees b connected on the primary
		t.Fatal(err)
	}
	probe(false, "promoted standby")
	if !a.Members.Healthy(ctx, "b") || !a.Members.HoldsQueue(ctx, "b", clk.t) {
		t.Fatal("b, seen connected on the old primary, is dead on the new one before its listener could reconnect")
	}
	probe(true, "promoted standby")
	probe(false, "promoted standby")
	if a.Members.Healthy(ctx, "b") {
		t.Fatal("b, seen connected on the new primary and then not, is still healthy")
	}
}

// Before naming an instance in wrong_instance the fabric probes again, so a
// process that died since the last scheduled probe is not named; probes
// beyond the schedule are spaced by minProbeGap.
func TestConfirmHealthyProbesBeforeNamingAnInstance(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	p := &fakeProber{st: st, live: map[string]bool{"b": true}}
	a := newProbedFabric(t, st, clk, "a", p)
	if err := st.HeartbeatInstance(ctx, sessionstore.Instance{ID: "b", URL: "http://b", StartedAt: clk.t, LastHeartbeatAt: clk.t}); err != nil {
		t.Fatal(err)
	}
	if err := a.Tick(ctx); err != nil { // sees b connected
		t.Fatal(err)
	}
	delete(p.live, "b") // b is killed right after the scheduled probe
	if !a.Members.confirmHealthy(ctx, "b") {
		t.Fatal("a probe within minProbeGap of the last one ran anyway")
	}
	a.Members.mu.Lock()
	a.Members.lastProbe = time.Now().Add(-minProbeGap)
	a.Members.mu.Unlock()
	if a.Members.confirmHealthy(ctx, "b") {
		t.Fatal("confirmHealthy named an instance whose process is gone")
	}
}

// healthGauge reads marconi_instance_healthy{instance_id=id} from reg, and
// whether the series exists.
func healthGauge(t *testing.T, reg *prometheus.Registry, id string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "marconi_instance_healthy" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == id {
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// TestHealthGaugeFollowsTheProbe: marconi_instance_healthy says 0 as soon as
// the liveness probe finds a process gone, and as soon as a heartbeat grows
// older than DeadAfter, without waiting for the next refresh (every
// HeartbeatEvery, 3 s); before, it changed only on the refresh.
func TestHealthGaugeFollowsTheProbe(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	reg := prometheus.NewRegistry()
	p := &fakeProber{st: st, live: map[string]bool{"b": true}}
	a, err := New(Config{InstanceID: "a", PublicURL: "http://a"}, Deps{Store: st, Prober: p, Now: clk.now, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.HeartbeatInstance(ctx, sessionstore.Instance{ID: "b", URL: "http://b", StartedAt: clk.t, LastHeartbeatAt: clk.t}); err != nil {
		t.Fatal(err)
	}
	// A scrape before a's first tick reads the instance table, as any
	// decision then does (ensureLoaded): b is there, healthy, not missing.
	if v, ok := healthGauge(t, reg, "b"); !ok || v != 1 {
		t.Fatalf("b before a's first tick: %v (present %v), want 1", v, ok)
	}
	if err := a.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if v, ok := healthGauge(t, reg, "b"); !ok || v != 1 {
		t.Fatalf("b after a tick: %v (present %v), want 1", v, ok)
	}
	if v, _ := healthGauge(t, reg, "a"); v != 1 {
		t.Fatalf("a itself: %v, want 1", v)
	}
	delete(p.live, "b") // b's process is killed; its heartbeat is still fresh
	if err := a.Members.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	if v, _ := healthGauge(t, reg, "b"); v != 0 {
		t.Fatalf("b after a probe found it gone, no refresh: %v, want 0", v)
	}

	p.live["c"] = true
	if err := st.HeartbeatInstance(ctx, sessionstore.Instance{ID: "c", URL: "http://c", StartedAt: clk.t, LastHeartbeatAt: clk.t}); err != nil {
		t.Fatal(err)
	}
	if err := a.Members.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if v, _ := healthGauge(t, reg, "c"); v != 1 {
		t.Fatalf("c after a refresh: %v, want 1", v)
	}
	clk.t = clk.t.Add(DefaultDeadAfter) // c's heartbeat grows old; no refresh
	if v, _ := healthGauge(t, reg, "c"); v != 0 {
		t.Fatalf("c with a heartbeat %v old: %v, want 0", DefaultDeadAfter, v)
	}
}

// downStore is a store whose instance table cannot be read or written while
// down is set: Postgres failing over.
type downStore struct {
	sessionstore.Store
	down bool
}

func (s *downStore) ListInstances(ctx context.Context) ([]sessionstore.Instance, error) {
	if s.down {
		return nil, sessionstore.ErrUnavailable
	}
	return s.Store.ListInstances(ctx)
}

// A store outage does not age heartbeats: no instance can heartbeat while
// it lasts, so an instance alive throughout is not dead when the store
// comes back after longer than DeadAfter; one that died during it is dead
// within DeadAfter of the store's return.
func TestStoreOutageDoesNotAgeHeartbeats(t *testing.T) {
	ctx := context.Background()
	st := &downStore{Store: memstore.New()}
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := newTestFabric(t, st, clk, "a")
	if err := st.HeartbeatInstance(ctx, sessionstore.Instance{ID: "b", URL: "http://b", StartedAt: clk.t, LastHeartbeatAt: clk.t}); err != nil {
		t.Fatal(err)
	}
	tick := func(wantErr bool) {
		t.Helper()
		if err := a.Tick(ctx); (err != nil) != wantErr {
			t.Fatalf("tick: %v, want an error %v", err, wantErr)
		}
	}
	tick(false)
	clk.t = clk.t.Add(time.Second)
	st.down = true
	tick(true)
	clk.t = clk.t.Add(3 * DefaultDeadAfter)
	if !a.Members.Healthy(ctx, "b") {
		t.Fatal("b unhealthy while the store is down: its heartbeat could not be written")
	}
	st.down = false
	tick(false)
	if !a.Members.Healthy(ctx, "b") {
		t.Fatal("b unhealthy as soon as the store is back, before it could heartbeat")
	}
	clk.t = clk.t.Add(DefaultDeadAfter - 2*time.Second)
	if !a.Members.Healthy(ctx, "b") {
		t.Fatal("b unhealthy within DeadAfter of the store's return")
	}
	clk.t = clk.t.Add(2 * time.Second)
	if a.Members.Healthy(ctx, "b") {
		t.Fatal("b, silent for DeadAfter since the store came back, is still healthy")
	}
}

// heldStore holds the first HeartbeatInstance until release is closed,
// having closed held once it is inside.
type heldStore struct {
	sessionstore.Store
	calls         atomic.Int32
	held, release chan struct{}
}

func (s *heldStore) HeartbeatInstance(ctx context.Context, in sessionstore.Instance) error {
	if s.calls.Add(1) == 1 {
		close(s.held)
		<-s.release
	}
	return s.Store.HeartbeatInstance(ctx, in)
}

// A heartbeat built while an earlier one is still being written waits for
// it: otherwise the earlier one, landing last, takes the row back in time
// (the others see the instance dead) and drops a draining mark set between
// the two. Here a tick's heartbeat is held in the store while the clock
// moves on and the instance starts draining; the row must end with the
// later time and the mark. (Unserialized, the draining heartbeat is
// written first whenever it runs before the tick's is let go.)
func TestHeartbeatsAreWrittenInTheOrderTheyAreBuilt(t *testing.T) {
	ctx := context.Background()
	st := &heldStore{Store: memstore.New(), held: make(chan struct{}), release: make(chan struct{})}
	var mu sync.Mutex
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return at }
	f, err := New(Config{InstanceID: "b", PublicURL: "http://b"}, Deps{Store: st, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	tick := make(chan error, 1)
	go func() { tick <- f.Members.heartbeat(ctx) }()
	<-st.held
	mu.Lock()
	at = at.Add(5 * time.Second)
	mu.Unlock()
	drain := make(chan error, 1)
	go func() { drain <- f.Members.SetDraining(ctx) }()
	close(st.release)
	if err := errors.Join(<-tick, <-drain); err != nil {
		t.Fatal(err)
	}
	list, err := st.ListInstances(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("instances %v, %v", list, err)
	}
	if got := list[0]; !got.LastHeartbeatAt.Equal(now()) || !got.Draining {
		t.Fatalf("b's row: heartbeat at %v, draining %v; want %v, draining", got.LastHeartbeatAt, got.Draining, now())
	}
}

// An instance that heartbeated after this one last read the instance table
// (two instances started together) is not taken for absent: an attach of a
// sticky session placed on it reads the table before deciding, and answers
// wrong_instance naming it, as the attach after a lost assignment race does
// (current). The view without it took the session over, resetting its
// affinity, while its instance was healthy.
func TestPlaceReadsTheTableForAnInstanceNotYetSeen(t *testing.T) {
	ctx := context.Background()
	st := &countingStore{Store: memstore.New()}
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	b := newTestFabric(t, st, clk, "b")
	if err := b.Tick(ctx); err != nil { // b's view: b alone
		t.Fatal(err)
	}
	a := newTestFabric(t, st, clk, "a")
	if err := a.Tick(ctx); err != nil { // a's first heartbeat, after b's read
		t.Fatal(err)
	}
	k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "sticky"}
	sess, err := st.CreateSession(ctx, sessionstore.Session{Key: k, RuntimeMode: ModeSticky, TokenHash: []byte("x"),
		RegisteredAt: clk.t, ExpiresAt: clk.t.Add(time.Hour), AssignedInstance: "a"}, clk.t)
	if err != nil {
		t.Fatal(err)
	}
	lists := st.lists.Load()
	p, err := b.Placer.Place(ctx, sess, false)
	if me := (*marconi.Error)(nil); !errors.As(err, &me) || me.Code != marconi.CodeWrongInstance || me.InstanceID != "a" {
		t.Fatalf("attach on b of a session placed on a, a healthy but not yet in b's view: %+v, %v; want wrong_instance naming a", p, err)
	}
	if n := st.lists.Load() - lists; n != 1 {
		t.Errorf("the attach read the instance table %d times, want once", n)
	}
	if _, err := b.Placer.Place(ctx, sess, false); err == nil {
		t.Fatal("the second attach on b was accepted")
	}
	if n := st.lists.Load() - lists; n != 1 {
		t.Errorf("after a second attach the table was read %d times in all, want once: a is in the view now", n)
	}
}
