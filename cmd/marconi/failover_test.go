package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/internal/haproxytest"
	"github.com/marconihub/marconi/internal/pgcluster"
	"github.com/marconihub/marconi/internal/testwait"
	"github.com/marconihub/marconi/migrations"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// EnvFailover, set to "long", makes TestStoreFailover switch the primary
// over back and forth several times instead of once.
const EnvFailover = "MARCONI_FAILOVER"

const (
	failoverKey   = "mak_failover_test_local_only"
	failoverAdmin = "madm_failover_test_local_only"
	// failoverAgents send every failoverEvery each, half of them sticky.
	failoverAgents = 6
	failoverEvery  = 50 * time.Millisecond
	// failoverDeadAfter is the hubs' MARCONI_INSTANCE_DEAD_AFTER_SECONDS:
	// after an outage, an instance alive throughout must heartbeat again
	// within it, less the age its last heartbeat had when the outage began.
	// At 4 s (3 s of room with 1 s heartbeats) a CI run under -race and
	// every other package saw one hub take longer, once; 6 s leaves 5.
	failoverDeadAfter = 6 * time.Second
)

// TestStoreFailover runs two hub instances on a primary and its synchronous
// standby, through the multi-host URL with target_session_attrs=read-write,
// with agents (the Go client, sticky and stateless) sending to each other;
// mid-load the primary is crashed (pg_ctl stop -m immediate) and, once the
// hubs report the store unavailable, the standby is promoted; the old
// primary is rebuilt as the standby and the same is done the other way,
// with the outage held past the instances' dead-after window. The ledger:
// every send answered 200 is delivered once and in order; no send is
// answered 500; no instance sees the other unhealthy, no sticky session
// is taken over or reassigned, no agent is told affinity_reset; both
// instances' liveness locks are held again on the new primary. How long
// sends were refused and how long until every agent was back are logged,
// not asserted. MARCONI_FAILOVER=long switches over back and forth.
func TestStoreFailover(t *testing.T) {
	c := pgcluster.New(t)
	hubs := startFailoverHubs(t, c.URL(), "hub-a", "hub-b")
	for _, h := range hubs {
		pollUntil(t, h.Config.Hub.InstanceID+" to see both instances' processes connected", func() bool {
			return processesConnected(t, h, "hub-a", "hub-b")
		})
	}
	led := newFailoverLedger()
	agents := dialFailoverAgents(t, hubs, led)
	// quiet never sends nor heartbeats within the test (so nothing reaches
	// it piggybacked on an answer) and holds its WebSocket on hub-b: what
	// agents on hub-a send it after the failover comes by hub-b's wake-up
	// listener, which must have listened again on the new primary.
	quiet := dialAgent(t, hubs[1], "quiet", "stateless", led)
	recipients := append(slices.Clone(agents), quiet)
	sticky := stickyAssignments(t, c.URL())
	if len(sticky) != failoverAgents/2 {
		t.Fatalf("%d sticky sessions placed, want %d", len(sticky), failoverAgents/2)
	}

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i, a := range agents {
		wg.Go(func() { a.sendLoop(ctx, recipients, i, led) })
	}
	health := watchHealth(ctx, &wg, hubs)
	defer func() { stop(); wg.Wait() }()
	led.waitAnswered(t, 100)

	rounds := failoverRounds()
	for round := range rounds {
		failOver(t, c, hubs, led, agents, round, rounds)
		for _, h := range hubs {
			pollUntil(t, h.Config.Hub.InstanceID+" to see both processes connected on the new primary", func() bool {
				return processesConnected(t, h, "hub-a", "hub-b")
			})
		}
		led.waitAnswered(t, led.answeredCount()+50)
	}
	stop()
	wg.Wait()

	n := led.waitDelivered(t, 60*time.Second)
	led.verify(t)
	statuses := led.statusCounts()
	t.Logf("%d sends answered 200 and delivered once, in order; answers by status: %v", n, statuses)
	if statuses[http.StatusInternalServerError] > 0 {
		t.Errorf("%d sends answered 500 across the failover; a store that moves is 503", statuses[http.StatusInternalServerError])
	}
	for code, k := range led.codes() {
		if code != "registry_unavailable" {
			t.Errorf("%d sends refused with %s; the failover may refuse only registry_unavailable", k, code)
		}
	}
	checkNobodyMoved(t, hubs, agents, health, c.URL(), sticky)
	if st := quiet.c.Stats(); st.Reconnects > 0 {
		t.Errorf("quiet's WebSocket was redialed %d times; it must hold one throughout, so that its signals came by wake-ups", st.Reconnects)
	}
}

// checkNobodyMoved checks what a failover with every instance alive
// throughout must leave as it was: no hub saw another unhealthy, no agent
// was told affinity_reset, no hub counted a fallback or a reassignment,
// and the sticky assignments read from dbURL are the ones given.
func checkNobodyMoved(t *testing.T, hubs []*Main, agents []*failoverAgent, health *healthWatch, dbURL string, sticky map[string]string) {
	t.Helper()
	if bad := health.unhealthy(); len(bad) > 0 {
		t.Errorf("an instance alive throughout was seen unhealthy by another: %v", bad)
	}
	for _, a := range agents {
		if r := a.resets.Load(); r > 0 {
			t.Errorf("%s was told affinity_reset %d times; its instance never died", a.id, r)
		}
	}
	for _, h := range hubs {
		for _, name := range []string{"marconi_fabric_fallbacks_total", "marconi_fabric_reassignments_total"} {
			if v := metricValue(t, h.URL(), name); v != 0 {
				t.Errorf("%s on %s = %v; no sticky session may move when no instance died", name, h.Config.Hub.InstanceID, v)
			}
		}
	}
	if after := stickyAssignments(t, dbURL); !mapsEqual(after, sticky) {
		t.Errorf("sticky assignments moved: before %v, after %v", sticky, after)
	}
}

// failoverRounds is how many times the failover tests switch the primary
// over: twice (the standby promoted as soon as the hubs see the primary
// gone, then, the roles swapped back, kept read-only past the instances'
// dead-after window, as a failover manager may take its time), or eight
// times with MARCONI_FAILOVER=long.
func failoverRounds() int {
	if os.Getenv(EnvFailover) == "long" {
		return 8
	}
	return 2
}

// failOver runs round (of rounds) of a failover test: it crashes the
// primary, waits until every hub's /readyz names the missing read-write
// server (its breaker open), holds the outage past the dead-after window
// in odd rounds, promotes the standby, waits until every agent has had a
// send answered 200 again, logs the round, and rebuilds the old primary
// as the standby unless the round is the last.
func failOver(t *testing.T, c *pgcluster.Cluster, hubs []*Main, led *failoverLedger, agents []*failoverAgent, round, rounds int) {
	t.Helper()
	crashed := time.Now()
	old := c.CrashPrimary()
	// The hubs reach the standby, read-only, through the multi-host URL:
	// not ready, and saying why.
	for _, h := range hubs {
		var last string
		pollUntil(t, h.Config.Hub.InstanceID+"'s /readyz to name the missing read-write server", func() bool {
			st, msg := readyzAdmin(t, h)
			if last != msg {
				t.Logf("%s /readyz: %d %s", h.Config.Hub.InstanceID, st, msg)
				last = msg
			}
			return st == http.StatusServiceUnavailable && strings.Contains(msg, "takes writes")
		})
		if v := metricValue(t, h.URL(), "marconi_store_breaker_open"); v != 1 {
			t.Errorf("%s: marconi_store_breaker_open = %v with no server taking writes, want 1", h.Config.Hub.InstanceID, v)
		}
	}
	if round%2 == 1 {
		// Not a wait for an event: the outage itself, the behaviour under
		// test, held on purpose until the dead-after window of every
		// heartbeat written before the crash has run out.
		holdOutage(t, crashed.Add(failoverDeadAfter+time.Second))
	}
	c.Promote()
	promoted := time.Now()
	back := led.waitAllBack(t, agents, promoted)
	refused, first, last := led.refusedSince(crashed)
	t.Logf("round %d: primary %s crashed, %s promoted %v later; %d sends refused 503 from %v to %v after the crash; every agent answered 200 again %v after the promotion",
		round+1, old.Name, c.Primary().Name, promoted.Sub(crashed).Round(time.Millisecond), refused,
		first.Round(time.Millisecond), last.Round(time.Millisecond), back.Round(time.Millisecond))
	if round < rounds-1 {
		c.Rebuild(old)
	}
}

// holdOutage keeps the store without a primary until until, or until the
// test ends.
func holdOutage(t *testing.T, until time.Time) {
	t.Helper()
	hold := time.NewTimer(time.Until(until))
	defer hold.Stop()
	select {
	case <-hold.C:
	case <-t.Context().Done():
	}
}

// TestInstanceDeadDuringTheFailover measures the window of doubt that the
// failover leaves: hub-b dies while there is no primary, so its liveness
// lock is not on the new primary to be seen going; hub-a judges it by its
// heartbeat, whose window (the outage not counted) runs out after the
// promotion. It must be seen dead; how long that took is logged.
func TestInstanceDeadDuringTheFailover(t *testing.T) {
	c := pgcluster.New(t)
	hubs := startFailoverHubs(t, c.URL(), "hub-a", "hub-b")
	a, b := hubs[0], hubs[1]
	pollUntil(t, "hub-a to see hub-b's process connected", func() bool { return processesConnected(t, a, "hub-a", "hub-b") })
	c.CrashPrimary()
	pollUntil(t, "hub-a to find no server that takes writes", func() bool {
		st, msg := readyzAdmin(t, a)
		return st == http.StatusServiceUnavailable && strings.Contains(msg, "takes writes")
	})
	if err := b.Close(); err != nil {
		t.Fatalf("close hub-b: %v", err)
	}
	c.Promote()
	promoted := time.Now()
	var healthyFor time.Duration
	pollUntil(t, "hub-a to see hub-b, dead during the failover, unhealthy", func() bool {
		v, ok := instanceHealthy(t, a, "hub-b")
		if ok && v {
			healthyFor = time.Since(promoted)
		}
		return ok && !v
	})
	t.Logf("hub-b died during the failover; hub-a still took it for healthy %v after the promotion, dead %v after (dead-after window %v)",
		healthyFor.Round(time.Millisecond), time.Since(promoted).Round(time.Millisecond), failoverDeadAfter)
}

// instanceHealthy is m's marconi_instance_healthy for id, and whether it
// exports one.
func instanceHealthy(t *testing.T, m *Main, id string) (healthy, ok bool) {
	t.Helper()
	resp, err := http.Get(m.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	for _, sm := range healthyRE.FindAllStringSubmatch(string(text), -1) {
		if sm[1] == id {
			return sm[2] == "1", true
		}
	}
	return false, false
}

// TestHubStartsWhileThePrimaryIsDown: a hub started on the multi-host URL
// while the primary is down and the standby still read-only does not come
// up on the standby: /readyz says no read-write server, a registration is
// 503 registry_unavailable, and `marconi config check` fails naming the
// cause; once the standby is promoted, the same process migrates and serves.
func TestHubStartsWhileThePrimaryIsDown(t *testing.T) {
	c := pgcluster.New(t)
	c.CrashPrimary()
	h := startFailoverHubs(t, c.URL(), "hub-late")[0]
	st, msg := readyzAdmin(t, h)
	if st != http.StatusServiceUnavailable {
		t.Fatalf("readyz with only a standby: %d %s, want 503", st, msg)
	}
	t.Logf("readyz with only a standby: %s", msg)
	if a := post(t, h.URL()+"/v1/sessions", failoverKey, `{"session_id":"early","surface":"codex"}`); a.status != 503 || a.code != "registry_unavailable" {
		t.Fatalf("register with only a standby: %+v, want 503 registry_unavailable", a)
	}
	if code, _, stderr := runCLI(t, map[string]string{"MARCONI_DATABASE_URL": c.URL()}, "", false, "config", "check"); code != 1 || !strings.Contains(stderr, "takes writes") {
		t.Errorf("config check with only a standby: exit %d, %q; want 1 naming no server that takes writes", code, stderr)
	}
	c.Promote()
	if code, _, stderr := runCLI(t, map[string]string{"MARCONI_DATABASE_URL": c.URL()}, "", false, "config", "check"); code != 0 {
		t.Errorf("config check once the standby is promoted: exit %d, %q", code, stderr)
	}
	pollUntil(t, "the hub to serve once the standby is promoted", func() bool {
		return post(t, h.URL()+"/v1/sessions", failoverKey, `{"session_id":"early","surface":"codex"}`).status == http.StatusCreated
	})
	if st, msg := readyzAdmin(t, h); st != http.StatusOK {
		t.Fatalf("readyz after the promotion: %d %s", st, msg)
	}
}

// TestHubOnAStandbyIsNotReady: a hub whose URL names a standby alone (no
// target_session_attrs: a misconfiguration, or a balancer that still points
// at the old standby) is not ready and says the store is read-only; a
// registration is 503 registry_unavailable, never a 500. Promoted, the same
// server serves the same process.
func TestHubOnAStandbyIsNotReady(t *testing.T) {
	c := pgcluster.New(t)
	// The schema is there, replicated: the hub's writes themselves meet the
	// standby's refusal (SQLSTATE 25006).
	if err := migrations.Up(context.Background(), c.Primary().URL()); err != nil {
		t.Fatal(err)
	}
	standby := c.Standby()
	h := startFailoverHubs(t, standby.URL(), "hub-standby")[0]
	st, msg := readyzAdmin(t, h)
	if st != http.StatusServiceUnavailable || !strings.Contains(msg, "read-only") {
		t.Fatalf("readyz on a standby: %d %s, want 503 naming it read-only", st, msg)
	}
	t.Logf("readyz on a standby: %s", msg)
	if a := post(t, h.URL()+"/v1/sessions", failoverKey, `{"session_id":"s1","surface":"codex"}`); a.status != 503 || a.code != "registry_unavailable" {
		t.Fatalf("register on a standby: %+v, want 503 registry_unavailable", a)
	}
	c.CrashPrimary()
	c.Promote()
	pollUntil(t, "the hub to serve once its server is promoted", func() bool {
		return post(t, h.URL()+"/v1/sessions", failoverKey, `{"session_id":"s1","surface":"codex"}`).status == http.StatusCreated
	})
}

// startFailoverHubs starts one in-process hub per id on dbURL, each on a
// port of its own named as its public URL.
func startFailoverHubs(t *testing.T, dbURL string, ids ...string) []*Main {
	t.Helper()
	var hubs []*Main
	for _, id := range ids {
		addr := haproxytest.FreeAddr(t)
		hubs = append(hubs, startFailoverHub(t, dbURL, id, addr, "http://"+addr, failoverKey+"=t/p"))
	}
	return hubs
}

// startFailoverHub starts one in-process hub on dbURL listening on addr,
// with apiKeys as its MARCONI_API_KEYS.
func startFailoverHub(t *testing.T, dbURL, id, addr, publicURL, apiKeys string) *Main {
	t.Helper()
	m, _ := startMain(t, map[string]string{
		"MARCONI_DATABASE_URL": dbURL, "MARCONI_MODE": "lan", "MARCONI_ADDR": addr,
		"MARCONI_PUBLIC_URL": publicURL, "MARCONI_INSTANCE_ID": id,
		"MARCONI_API_KEYS": apiKeys, "MARCONI_ADMIN_TOKEN": failoverAdmin,
		"MARCONI_STORE_TIMEOUT_SECONDS": "2", "MARCONI_STORE_PROBE_INTERVAL_MS": "100",
		"MARCONI_INSTANCE_HEARTBEAT_SECONDS": "1", "MARCONI_INSTANCE_DEAD_AFTER_SECONDS": fmt.Sprint(failoverDeadAfter.Seconds()),
		"MARCONI_SEND_RATE_PER_SECOND": "1000", "MARCONI_HEARTBEAT_INTERVAL_SECONDS": "3600",
		// No pending sweep within the test: a signal for an agent on
		// another instance arrives by a wake-up, so the listener must
		// LISTEN again on the new primary.
		"MARCONI_PENDING_SWEEP_SECONDS": "3600",
	})
	return m
}

// readyzAdmin is the hub's /readyz status and, when not ready, the message the
// admin token reads.
func readyzAdmin(t *testing.T, m *Main) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, m.URL()+"/readyz", nil)
	req.Header.Set("Authorization", "Bearer "+failoverAdmin)
	resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("readyz: %v", err)
	}
	defer resp.Body.Close()
	var body struct {
		Error struct{ Message string } `json:"error"`
	}
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &body)
	return resp.StatusCode, body.Error.Message
}

// processesConnected reports whether m's fabric summary shows every id's
// process connected (its liveness lock held, as m's probe sees it).
func processesConnected(t *testing.T, m *Main, ids ...string) bool {
	t.Helper()
	st, s := fabricCall(t, "GET", m.URL()+"/v1/ops/fabric/summary", failoverAdmin, nil)
	if st != http.StatusOK {
		return false
	}
	seen := map[string]bool{}
	ins, _ := s["instances"].([]any)
	for _, in := range ins {
		if m, ok := in.(map[string]any); ok {
			id, _ := m["instance_id"].(string)
			seen[id] = m["process"] == "connected" && m["healthy"] == true
		}
	}
	for _, id := range ids {
		if !seen[id] {
			return false
		}
	}
	return true
}

// stickyAssignments reads each live sticky session's assigned instance.
func stickyAssignments(t *testing.T, dbURL string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := pgstore.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var list []sessionstore.Session
	pollUntil(t, "the store to list sessions", func() bool {
		list, err = st.ListSessions(ctx, sessionstore.SessionFilter{}, time.Now())
		return err == nil
	})
	out := map[string]string{}
	for _, s := range list {
		if s.RuntimeMode == "sticky" {
			out[s.SessionID] = s.AssignedInstance
		}
	}
	return out
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// healthWatch records every time one hub saw another unhealthy.
type healthWatch struct {
	mu  sync.Mutex
	bad []string
}

func (w *healthWatch) unhealthy() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.bad)
}

var healthyRE = regexp.MustCompile(`(?m)^marconi_instance_healthy\{instance_id="([^"]+)"\} (\S+)$`)

// watchHealth scrapes each hub's marconi_instance_healthy (its own view of
// the instances) every 50 ms until ctx ends.
func watchHealth(ctx context.Context, wg *sync.WaitGroup, hubs []*Main) *healthWatch {
	w := &healthWatch{}
	client := &http.Client{Timeout: 5 * time.Second}
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, h := range hubs {
				resp, err := client.Get(h.URL() + "/metrics")
				if err != nil {
					continue
				}
				text, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				for _, m := range healthyRE.FindAllStringSubmatch(string(text), -1) {
					if m[2] != "1" {
						w.mu.Lock()
						if len(w.bad) < 20 {
							w.bad = append(w.bad, fmt.Sprintf("%s saw %s unhealthy at %s", h.Config.Hub.InstanceID, m[1], time.Now().Format("15:04:05.000")))
						}
						w.mu.Unlock()
					}
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	return w
}

// failoverAgent is one agent: a Go client on one of the hubs.
type failoverAgent struct {
	id     string
	c      *bootstrap.Client
	resets atomic.Int64 // affinity_reset callbacks
}

// dialFailoverAgents dials the agents, alternately on each hub, the even
// ones sticky. A client sends once (SendAttempts 1), so the ledger sees
// every answer the hubs give.
func dialFailoverAgents(t *testing.T, hubs []*Main, led *failoverLedger) []*failoverAgent {
	t.Helper()
	agents := make([]*failoverAgent, failoverAgents)
	for i := range agents {
		mode := "stateless"
		if i%2 == 0 {
			mode = "sticky"
		}
		// The first hub's agents send where their hub is, not to the
		// recipient's instance: their signals for agents held elsewhere
		// (quiet among them) cross by wake-ups.
		h := i % len(hubs)
		agents[i] = dialAgentAt(t, hubs[h].URL(), failoverKey, fmt.Sprintf("agent-%d", i), mode, h == 0, led)
	}
	return agents
}

// dialAgent dials one agent on h.
func dialAgent(t *testing.T, h *Main, id, mode string, led *failoverLedger) *failoverAgent {
	t.Helper()
	return dialAgentAt(t, h.URL(), failoverKey, id, mode, false, led)
}

// dialAgentAt dials one agent on hubURL with the API key of its project;
// noHolder turns off its sending to the recipient's instance, so that its
// sends land where the balancer puts them.
func dialAgentAt(t *testing.T, hubURL, key, id, mode string, noHolder bool, led *failoverLedger) *failoverAgent {
	t.Helper()
	a := &failoverAgent{id: id}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := bootstrap.Dial(ctx, bootstrap.Config{
		HubURL: hubURL, APIKey: key, SessionID: id, Surface: "claude_code", RuntimeMode: mode,
		OnSignal:        func(s bootstrap.Signal) { led.delivered(id, s) },
		OnAffinityReset: func() { a.resets.Add(1) },
		Logger:          slog.New(slog.DiscardHandler),
		SendAttempts:    1,
		NoHolderRouting: noHolder,
	})
	if err != nil {
		t.Fatalf("dial %s: %v", id, err)
	}
	a.c = c
	t.Cleanup(func() { _ = c.Close() })
	return a
}

// sendLoop sends every failoverEvery to the next agents in turn until ctx
// ends, recording each attempt and answer.
func (a *failoverAgent) sendLoop(ctx context.Context, agents []*failoverAgent, self int, led *failoverLedger) {
	tick := time.NewTicker(failoverEvery)
	defer tick.Stop()
	for n := 1; ; n++ {
		to := agents[(self+1+n%(len(agents)-1))%len(agents)].id // never self
		p := failoverPayload{ID: fmt.Sprintf("%s/%d", a.id, n), From: a.id, N: n}
		led.attempt(p, to)
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		res, err := a.c.Send(sctx, to, "failover", p)
		cancel()
		if ctx.Err() != nil {
			return
		}
		led.answer(a.id, p, res, err)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

type failoverPayload struct {
	ID   string `json:"id"`
	From string `json:"from"`
	N    int    `json:"n"`
}

type failoverSent struct {
	p        failoverPayload
	to       string
	signalID string // set when answered 200
}

// failoverLedger records every send, every answer and every delivery. It
// is safe for concurrent use.
type failoverLedger struct {
	mu         sync.Mutex
	sends      map[string]*failoverSent  // by payload id
	answers    map[string]*failoverSent  // by signal id, answered 200
	got        map[string]map[string]int // recipient -> signal id -> deliveries
	order      map[string][]bootstrap.Signal
	status     map[int]int
	errCodes   map[string]int
	refusedAt  []time.Time                // each 503
	lastOK     map[string]time.Time       // agent -> its latest 200
	transport  int                        // sends with no answer (status 0 in statusCounts)
	noAnswer   []string                   // the first few of their errors
	payloadsOf map[string]failoverPayload // signal id -> its payload, as delivered
}

func newFailoverLedger() *failoverLedger {
	return &failoverLedger{
		sends: map[string]*failoverSent{}, answers: map[string]*failoverSent{}, got: map[string]map[string]int{},
		order: map[string][]bootstrap.Signal{}, status: map[int]int{}, errCodes: map[string]int{},
		lastOK: map[string]time.Time{}, payloadsOf: map[string]failoverPayload{},
	}
}

func (l *failoverLedger) attempt(p failoverPayload, to string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sends[p.ID] = &failoverSent{p: p, to: to}
}

func (l *failoverLedger) answer(agent string, p failoverPayload, res bootstrap.SendResult, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var he *bootstrap.Error
	switch {
	case err == nil:
		l.status[http.StatusOK]++
		s := l.sends[p.ID]
		s.signalID = res.SignalID
		l.answers[res.SignalID] = s
		l.lastOK[agent] = time.Now()
	case errors.As(err, &he):
		l.status[he.Status]++
		l.errCodes[string(he.Code)]++
		if he.Status == http.StatusServiceUnavailable {
			l.refusedAt = append(l.refusedAt, time.Now())
		}
	default:
		l.transport++
		if len(l.noAnswer) < 5 {
			l.noAnswer = append(l.noAnswer, fmt.Sprintf("%s at %s: %v", p.ID, time.Now().Format("15:04:05.000"), err))
		}
	}
}

func (l *failoverLedger) delivered(recipient string, sig bootstrap.Signal) {
	var p failoverPayload
	_ = json.Unmarshal(sig.Payload, &p)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.got[recipient] == nil {
		l.got[recipient] = map[string]int{}
	}
	l.got[recipient][sig.ID]++
	l.order[recipient] = append(l.order[recipient], sig)
	l.payloadsOf[sig.ID] = p
}

func (l *failoverLedger) answeredCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.answers)
}

// waitAnswered waits until n sends have been answered 200.
func (l *failoverLedger) waitAnswered(t *testing.T, n int) {
	t.Helper()
	pollUntil(t, fmt.Sprintf("%d sends answered 200", n), func() bool { return l.answeredCount() >= n })
}

// waitAllBack waits until every agent has had a send answered 200 after
// since, and returns how long after since the last of them did.
func (l *failoverLedger) waitAllBack(t *testing.T, agents []*failoverAgent, since time.Time) time.Duration {
	t.Helper()
	var back time.Duration
	pollUntil(t, "every agent to send again after the promotion", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		back = 0
		for _, a := range agents {
			at := l.lastOK[a.id]
			if !at.After(since) {
				return false
			}
			back = max(back, at.Sub(since))
		}
		return true
	})
	return back
}

// refusedSince counts the 503 answers after crash, and when the first and
// the last came, after crash.
func (l *failoverLedger) refusedSince(crash time.Time) (n int, first, last time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, at := range l.refusedAt {
		if at.Before(crash) {
			continue
		}
		if n == 0 {
			first = at.Sub(crash)
		}
		n++
		last = at.Sub(crash)
	}
	return n, first, last
}

// noAnswers is the first few errors of the sends that had no answer.
func (l *failoverLedger) noAnswers() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.noAnswer)
}

func (l *failoverLedger) statusCounts() map[int]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[int]int{}
	for k, v := range l.status {
		out[k] = v
	}
	if l.transport > 0 {
		out[0] = l.transport
	}
	return out
}

func (l *failoverLedger) codes() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for k, v := range l.errCodes {
		out[k] = v
	}
	return out
}

// waitDelivered waits until every send answered 200 reached its recipient
// and returns how many there were.
func (l *failoverLedger) waitDelivered(t *testing.T, within time.Duration) int {
	t.Helper()
	var n int
	testwait.ForNil(t, "every send answered 200 to be delivered", within, func() error {
		var err error
		n, err = l.undelivered()
		return err
	})
	return n
}

// undelivered says which sends answered 200 were not delivered yet, and
// how many were answered 200.
func (l *failoverLedger) undelivered() (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var missing []string
	for id, s := range l.answers {
		if l.got[s.to][id] == 0 {
			missing = append(missing, fmt.Sprintf("%s (%s to %s)", id, s.p.ID, s.to))
		}
	}
	if len(missing) > 0 {
		return len(l.answers), fmt.Errorf("%d sends answered 200 never delivered (lost), e.g. %v", len(missing), missing[:min(5, len(missing))])
	}
	return len(l.answers), nil
}

// verify checks each delivery: once per signal id, to the agent it was sent
// to, from its sender, in seq order and in each sender's order.
func (l *failoverLedger) verify(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for recipient, sigs := range l.order {
		var lastSeq int64
		lastN := map[string]int{}
		for _, sig := range sigs {
			p := l.payloadsOf[sig.ID]
			s, ok := l.sends[p.ID]
			switch {
			case l.got[recipient][sig.ID] > 1:
				t.Errorf("%s got signal %s %d times", recipient, sig.ID, l.got[recipient][sig.ID])
			case !ok:
				t.Errorf("%s got %s (%s), which nobody sent", recipient, sig.ID, sig.Payload)
			case s.to != recipient || sig.FromSession != p.From:
				t.Errorf("misrouted: %s from %s to %s delivered to %s from %s", p.ID, p.From, s.to, recipient, sig.FromSession)
			case s.signalID != "" && s.signalID != sig.ID:
				t.Errorf("%s: delivered as %s, answered as %s", p.ID, sig.ID, s.signalID)
			}
			if sig.Seq <= lastSeq {
				t.Errorf("%s: seq %d after %d", recipient, sig.Seq, lastSeq)
			}
			lastSeq = sig.Seq
			if p.N <= lastN[p.From] {
				t.Errorf("%s: %s's signal %d after its %d", recipient, p.From, p.N, lastN[p.From])
			}
			lastN[p.From] = p.N
		}
	}
}
