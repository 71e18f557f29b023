package selfheal

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/marconihub/marconi"
)

// fakeClock is a settable clock, safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 6, 4, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type harness struct {
	ev    *Evaluator
	clock *fakeClock
	reg   *prometheus.Registry
}

func newHarness(t *testing.T, mut func(*Config)) *harness {
	t.Helper()
	cfg := DefaultConfig()
	if mut != nil {
		mut(&cfg)
	}
	clock := newFakeClock()
	reg := prometheus.NewRegistry()
	ev, err := New(cfg, clock.Now, reg, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &harness{ev: ev, clock: clock, reg: reg}
}

// party returns a fresh live-WS party without a queue, last seen 10s ago.
func (h *harness) party(tenant, project, session string) Party {
	return Party{
		TenantID: tenant, ProjectID: project, SessionID: session,
		Surface: "claude_code", ProofOfLife: h.clock.Now().Add(-10 * time.Second),
	}
}

// attached returns a party whose queue is attached.
func (h *harness) attached(session string) Party {
	p := h.party("t1", "p1", session)
	p.HasQueue = true
	return p
}

func (h *harness) count(outcome Outcome) float64 {
	return testutil.ToFloat64(h.ev.counters[outcome])
}

// counts reads every outcome from the registry, as /metrics would show them.
func (h *harness) counts(t *testing.T) map[Outcome]float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	out := map[Outcome]float64{}
	for _, mf := range mfs {
		if mf.GetName() != MetricName {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					out[Outcome(l.GetValue())] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

func (h *harness) wantCounts(t *testing.T, want map[Outcome]float64) {
	t.Helper()
	got := h.counts(t)
	for _, o := range marconi.Outcomes {
		if got[o] != want[o] {
			t.Errorf("%s{outcome=%q} = %v, want %v (all: %v)", MetricName, o, got[o], want[o], got)
		}
	}
}

func TestAC1_RecipientRouteStaleAttempted(t *testing.T) {
	h := newHarness(t, nil)
	r := h.ev.Spend(h.party("t1", "p1", "lafonda"), h.attached("donna"))
	want := Result{Recipient: marconi.OutcomeAttempted, RecipientRouteStale: true, Outcome: marconi.OutcomeAttempted}
	if r != want {
		t.Fatalf("Spend = %+v, want %+v", r, want)
	}
	h.wantCounts(t, map[Outcome]float64{marconi.OutcomeAttempted: 1})
	if got := h.ev.Tokens(SideRecipient, "t1", "p1", "lafonda"); got != 2 {
		t.Errorf("recipient tokens after one attempt = %v, want 2", got)
	}
	if got := h.ev.Tokens(SideSender, "t1", "p1", "lafonda"); got != 3 {
		t.Errorf("sender bucket of the recipient touched: %v tokens, want 3", got)
	}
}

func TestRecipientWithQueueNotEvaluated(t *testing.T) {
	h := newHarness(t, nil)
	r := h.ev.Spend(h.attached("lafonda"), h.attached("donna"))
	if r != (Result{}) {
		t.Fatalf("Spend with both queues attached = %+v, want zero (selfheal_outcome null)", r)
	}
	h.wantCounts(t, nil)
	if h.ev.Len() != 0 {
		t.Errorf("Len = %d, want 0", h.ev.Len())
	}
}

func TestAC5_FourSendsIn60s_ThreeAttemptedFourthRateLimited(t *testing.T) {
	h := newHarness(t, nil)
	var got []Result
	for range 4 {
		got = append(got, h.ev.Spend(h.party("t1", "p1", "lafonda"), h.attached("donna")))
		h.clock.Advance(time.Second)
	}
	for i, r := range got[:3] {
		if r.Recipient != marconi.OutcomeAttempted || !r.RecipientRouteStale || r.Outcome != marconi.OutcomeAttempted {
			t.Errorf("send %d = %+v, want attempted with recipient_route_stale", i+1, r)
		}
	}
	want4 := Result{Recipient: marconi.OutcomeRateLimited, Outcome: marconi.OutcomeRateLimited}
	if got[3] != want4 {
		t.Errorf("send 4 = %+v, want %+v", got[3], want4)
	}
	h.wantCounts(t, map[Outcome]float64{marconi.OutcomeAttempted: 3, marconi.OutcomeRateLimited: 1})
}

// Test scenario 3 of the SPEC: five sends in quick succession give three
// attempted and two rate_limited, and the rate-limited ones carry no hint.
func TestScenario3_FiveSendsThreeAttemptedTwoRateLimited(t *testing.T) {
	h := newHarness(t, nil)
	var attempted, limited int
	for i := range 5 {
		r := h.ev.Spend(h.party("t1", "p1", "lafonda"), h.attached("donna"))
		switch r.Outcome {
		case marconi.OutcomeAttempted:
			attempted++
		case marconi.OutcomeRateLimited:
			limited++
			if r.RecipientRouteStale || r.SenderRouteStale {
				t.Errorf("send %d rate_limited with a route_stale hint: %+v", i+1, r)
			}
		default:
			t.Errorf("send %d outcome %q", i+1, r.Outcome)
		}
		h.clock.Advance(time.Second)
	}
	if attempted != 3 || limited != 2 {
		t.Errorf("attempted %d, rate_limited %d; want 3 and 2", attempted, limited)
	}
	h.wantCounts(t, map[Outcome]float64{marconi.OutcomeAttempted: 3, marconi.OutcomeRateLimited: 2})
}

func TestLinearRefill(t *testing.T) {
	h := newHarness(t, nil) // 3 tokens per 60s: one token every 20s
	recip := func() Party { return h.party("t1", "p1", "lafonda") }
	for range 3 {
		if r := h.ev.Spend(recip(), h.attached("donna")); r.Recipient != marconi.OutcomeAttempted {
			t.Fatalf("initial burst: %+v", r)
		}
	}
	if got := h.ev.Tokens(SideRecipient, "t1", "p1", "lafonda"); got != 0 {
		t.Fatalf("tokens after burst = %v, want 0", got)
	}
	h.clock.Advance(10 * time.Second)
	if got := h.ev.Tokens(SideRecipient, "t1", "p1", "lafonda"); math.Abs(got-0.5) > 1e-9 {
		t.Errorf("tokens 10s after burst = %v, want 0.5 (fractional, linear)", got)
	}
	h.clock.Advance(9 * time.Second) // 19s: 0.95 tokens
	if r := h.ev.Spend(recip(), h.attached("donna")); r.Recipient != marconi.OutcomeRateLimited {
		t.Fatalf("at 19s: %+v, want rate_limited", r)
	}
	h.clock.Advance(time.Second) // 20s: one token
	if r := h.ev.Spend(recip(), h.attached("donna")); r.Recipient != marconi.OutcomeAttempted {
		t.Fatalf("at 20s: %+v, want attempted", r)
	}
	if r := h.ev.Spend(recip(), h.attached("donna")); r.Recipient != marconi.OutcomeRateLimited {
		t.Fatalf("right after the refilled token was spent: %+v, want rate_limited", r)
	}
	// A rate_limited evaluation spends nothing: 40s later there are exactly 2.
	h.clock.Advance(40 * time.Second)
	if got := h.ev.Tokens(SideRecipient, "t1", "p1", "lafonda"); math.Abs(got-2) > 1e-9 {
		t.Errorf("tokens 40s after reaching 0 = %v, want 2", got)
	}
	// Never above capacity.
	h.clock.Advance(time.Hour)
	if got := h.ev.Tokens(SideRecipient, "t1", "p1", "lafonda"); got != 3 {
		t.Errorf("tokens after an hour = %v, want capacity 3", got)
	}
}

func TestClockGoingBackwardsAddsNoTokens(t *testing.T) {
	h := newHarness(t, nil)
	for range 3 {
		h.ev.Spend(h.party("t1", "p1", "s"), h.attached("x"))
	}
	h.clock.Advance(-time.Hour)
	if r := h.ev.Spend(h.party("t1", "p1", "s"), h.attached("x")); r.Recipient != marconi.OutcomeRateLimited {
		t.Errorf("after clock went back: %+v, want rate_limited", r)
	}
}

func TestAC6_StaleRecency(t *testing.T) {
	h := newHarness(t, nil)
	now := h.clock.Now()

	stale := h.party("t1", "p1", "ghost")
	stale.ProofOfLife = now.Add(-301 * time.Second)
	r := h.ev.Spend(stale, h.attached("donna"))
	want := Result{Recipient: marconi.OutcomeStaleRecency, Outcome: marconi.OutcomeStaleRecency}
	if r != want {
		t.Fatalf("Spend = %+v, want %+v", r, want)
	}
	if got := h.ev.Tokens(SideRecipient, "t1", "p1", "ghost"); got != 3 {
		t.Errorf("stale_recency spent a token: %v left", got)
	}

	never := h.party("t1", "p1", "never")
	never.ProofOfLife = time.Time{}
	if r := h.ev.Spend(never, h.attached("donna")); r.Recipient != marconi.OutcomeStaleRecency {
		t.Errorf("zero proof of life: %+v, want stale_recency", r)
	}

	edge := h.party("t1", "p1", "edge")
	edge.ProofOfLife = now.Add(-300 * time.Second)
	if r := h.ev.Spend(edge, h.attached("donna")); r.Recipient != marconi.OutcomeAttempted {
		t.Errorf("proof of life exactly 300s old: %+v, want attempted (stale only when older)", r)
	}
	h.wantCounts(t, map[Outcome]float64{marconi.OutcomeStaleRecency: 2, marconi.OutcomeAttempted: 1})
	if h.ev.Len() != 1 {
		t.Errorf("Len = %d, want 1 (only the attempted bucket)", h.ev.Len())
	}
}

func TestAC7_UnsupportedSurfaceCodex(t *testing.T) {
	h := newHarness(t, nil)
	codex := h.party("t1", "p1", "codex-agent")
	codex.Surface = "codex"
	codex.ProofOfLife = time.Time{} // surface is checked before recency
	r := h.ev.Spend(codex, h.attached("donna"))
	want := Result{Recipient: marconi.OutcomeUnsupportedSurface, Outcome: marconi.OutcomeUnsupportedSurface}
	if r != want {
		t.Fatalf("Spend = %+v, want %+v", r, want)
	}
	h.wantCounts(t, map[Outcome]float64{marconi.OutcomeUnsupportedSurface: 1})
	if h.ev.Len() != 0 {
		t.Errorf("unsupported_surface touched a bucket: Len = %d", h.ev.Len())
	}
}

func TestAC7_CodexSenderIsSilent(t *testing.T) {
	h := newHarness(t, nil)
	sender := h.party("t1", "p1", "codex-agent")
	sender.Surface = "codex"
	r := h.ev.Spend(h.attached("lafonda"), sender)
	if r != (Result{}) {
		t.Fatalf("codex sender without queue: %+v, want zero result", r)
	}
	h.wantCounts(t, nil)
}

func TestAC3_SenderRouteStale(t *testing.T) {
	h := newHarness(t, nil)
	r := h.ev.Spend(h.attached("lafonda"), h.party("t1", "p1", "donna"))
	want := Result{Sender: marconi.OutcomeAttempted, SenderRouteStale: true, Outcome: marconi.OutcomeAttempted}
	if r != want {
		t.Fatalf("Spend = %+v, want %+v", r, want)
	}
	if got := h.ev.Tokens(SideSender, "t1", "p1", "donna"); got != 2 {
		t.Errorf("sender tokens = %v, want 2", got)
	}

	// The sender gate is the longer threshold: 400s old is still attempted.
	mid := h.party("t1", "p1", "mid")
	mid.ProofOfLife = h.clock.Now().Add(-400 * time.Second)
	if r := h.ev.Spend(h.attached("lafonda"), mid); r.Sender != marconi.OutcomeAttempted || !r.SenderRouteStale {
		t.Errorf("sender 400s old: %+v, want attempted", r)
	}
	old := h.party("t1", "p1", "old")
	old.ProofOfLife = h.clock.Now().Add(-601 * time.Second)
	r = h.ev.Spend(h.attached("lafonda"), old)
	if want := (Result{Sender: marconi.OutcomeStaleRecency, Outcome: marconi.OutcomeStaleRecency}); r != want {
		t.Errorf("sender 601s old: %+v, want %+v", r, want)
	}
	h.wantCounts(t, map[Outcome]float64{marconi.OutcomeAttempted: 2, marconi.OutcomeStaleRecency: 1})
}

func TestBothSidesEvaluated(t *testing.T) {
	h := newHarness(t, nil)
	r := h.ev.Spend(h.party("t1", "p1", "lafonda"), h.party("t1", "p1", "donna"))
	want := Result{Recipient: marconi.OutcomeAttempted, Sender: marconi.OutcomeAttempted,
		RecipientRouteStale: true, SenderRouteStale: true, Outcome: marconi.OutcomeAttempted}
	if r != want {
		t.Fatalf("Spend = %+v, want %+v", r, want)
	}
	h.wantCounts(t, map[Outcome]float64{marconi.OutcomeAttempted: 2}) // one per side
}

func TestCombinedOutcome(t *testing.T) {
	h := newHarness(t, nil)
	now := h.clock.Now()
	codex := func(s string) Party { p := h.party("t1", "p1", s); p.Surface = "codex"; return p }
	stale := func(s string) Party { p := h.party("t1", "p1", s); p.ProofOfLife = now.Add(-time.Hour); return p }
	exhausted := func(side Side, s string) Party {
		for range 3 {
			if side == SideRecipient {
				h.ev.Spend(h.party("t1", "p1", s), h.attached("z"))
			} else {
				h.ev.Spend(h.attached("z"), h.party("t1", "p1", s))
			}
		}
		return h.party("t1", "p1", s)
	}
	tests := []struct {
		name      string
		recipient Party
		sender    Party
		want      Result
	}{
		{"recipient stale, sender attempted", stale("r1"), h.party("t1", "p1", "s1"),
			Result{Recipient: marconi.OutcomeStaleRecency, Sender: marconi.OutcomeAttempted, SenderRouteStale: true, Outcome: marconi.OutcomeAttempted}},
		{"recipient unsupported, sender rate limited", codex("r2"), exhausted(SideSender, "s2"),
			Result{Recipient: marconi.OutcomeUnsupportedSurface, Sender: marconi.OutcomeRateLimited, Outcome: marconi.OutcomeUnsupportedSurface}},
		{"recipient rate limited, sender attempted", exhausted(SideRecipient, "r3"), h.party("t1", "p1", "s3"),
			Result{Recipient: marconi.OutcomeRateLimited, Sender: marconi.OutcomeAttempted, SenderRouteStale: true, Outcome: marconi.OutcomeAttempted}},
		{"recipient attached, sender stale", h.attached("r4"), stale("s4"),
			Result{Sender: marconi.OutcomeStaleRecency, Outcome: marconi.OutcomeStaleRecency}},
		{"recipient attached, sender codex", h.attached("r5"), codex("s5"), Result{}},
		{"recipient stale, sender attached", stale("r6"), h.attached("s6"),
			Result{Recipient: marconi.OutcomeStaleRecency, Outcome: marconi.OutcomeStaleRecency}},
	}
	for _, tt := range tests {
		if got := h.ev.Spend(tt.recipient, tt.sender); got != tt.want {
			t.Errorf("%s: Spend = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestRateLimitedNeverSetsRouteStale(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxAttempts = 1 })
	first := h.ev.Spend(h.party("t1", "p1", "r"), h.party("t1", "p1", "s"))
	if !first.RecipientRouteStale || !first.SenderRouteStale {
		t.Fatalf("first send: %+v, want both hints", first)
	}
	for i := range 5 {
		r := h.ev.Spend(h.party("t1", "p1", "r"), h.party("t1", "p1", "s"))
		want := Result{Recipient: marconi.OutcomeRateLimited, Sender: marconi.OutcomeRateLimited, Outcome: marconi.OutcomeRateLimited}
		if r != want {
			t.Errorf("send %d: %+v, want %+v", i+2, r, want)
		}
	}
	h.wantCounts(t, map[Outcome]float64{marconi.OutcomeAttempted: 2, marconi.OutcomeRateLimited: 10})
}

func TestAC5_BucketsIsolatedAcrossTenantsAndProjects(t *testing.T) {
	h := newHarness(t, nil)
	for range 3 {
		h.ev.Spend(h.party("tenantA", "p1", "alice"), h.attached("x"))
	}
	if r := h.ev.Spend(h.party("tenantA", "p1", "alice"), h.attached("x")); r.Recipient != marconi.OutcomeRateLimited {
		t.Fatalf("tenant A exhausted bucket: %+v, want rate_limited", r)
	}
	for _, p := range []Party{
		h.party("tenantB", "p1", "alice"), // same project and session names, other tenant
		h.party("tenantA", "p2", "alice"), // other project
		h.party("tenantA", "p1", "bob"),   // other session
	} {
		if r := h.ev.Spend(p, h.attached("x")); r.Recipient != marconi.OutcomeAttempted {
			t.Errorf("%s/%s/%s affected by tenantA/p1/alice: %+v", p.TenantID, p.ProjectID, p.SessionID, r)
		}
	}
	// The sender bucket of the same session is a separate bucket too.
	if r := h.ev.Spend(h.attached("x"), h.party("tenantA", "p1", "alice")); r.Sender != marconi.OutcomeAttempted {
		t.Errorf("alice's sender bucket affected by her recipient bucket: %+v", r)
	}
	// Keys are not confused by separators inside ids.
	for range 3 {
		h.ev.Spend(h.party("a/b", "c", "d"), h.attached("x"))
	}
	if r := h.ev.Spend(h.party("a", "b/c", "d"), h.attached("x")); r.Recipient != marconi.OutcomeAttempted {
		t.Errorf("tenant a/b project c collides with tenant a project b/c: %+v", r)
	}
}

func TestDisabled_NothingCountedNoBucketTouched(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Enabled = false })
	for range 10 {
		r := h.ev.Spend(h.party("t1", "p1", "r"), h.party("t1", "p1", "s"))
		if r != (Result{}) {
			t.Fatalf("disabled Spend = %+v, want zero", r)
		}
	}
	h.wantCounts(t, nil)
	if h.ev.Len() != 0 {
		t.Errorf("disabled Spend created %d buckets", h.ev.Len())
	}
	if got := h.ev.Tokens(SideRecipient, "t1", "p1", "r"); got != 3 {
		t.Errorf("disabled: recipient tokens %v, want 3", got)
	}
	// The metric is still exposed, every outcome at 0.
	if n := testutil.CollectAndCount(h.reg, MetricName); n != 7 {
		t.Errorf("disabled: %d series of %s, want 7", n, MetricName)
	}
}

func TestAC11_MetricLabelsExactlyTheEnumPresetAtZero(t *testing.T) {
	h := newHarness(t, nil)
	want := `
# HELP marconi_route_self_healed_total Self-heal (SPEC-168) evaluations of one side of a send, by outcome.
# TYPE marconi_route_self_healed_total counter
marconi_route_self_healed_total{outcome="attempted"} 0
marconi_route_self_healed_total{outcome="failed"} 0
marconi_route_self_healed_total{outcome="no_listener"} 0
marconi_route_self_healed_total{outcome="rate_limited"} 0
marconi_route_self_healed_total{outcome="stale_recency"} 0
marconi_route_self_healed_total{outcome="succeeded"} 0
marconi_route_self_healed_total{outcome="unsupported_surface"} 0
`
	if err := testutil.GatherAndCompare(h.reg, strings.NewReader(want), MetricName); err != nil {
		t.Fatalf("fresh registry: %v", err)
	}

	// After every reachable outcome, still exactly the seven label values.
	codex := h.party("t1", "p1", "c")
	codex.Surface = "codex"
	stale := h.party("t1", "p1", "old")
	stale.ProofOfLife = time.Time{}
	h.ev.Spend(codex, h.attached("x"))
	h.ev.Spend(stale, h.attached("x"))
	for range 4 {
		h.ev.Spend(h.party("t1", "p1", "r"), h.attached("x"))
	}
	want = strings.NewReplacer(
		`{outcome="attempted"} 0`, `{outcome="attempted"} 3`,
		`{outcome="rate_limited"} 0`, `{outcome="rate_limited"} 1`,
		`{outcome="stale_recency"} 0`, `{outcome="stale_recency"} 1`,
		`{outcome="unsupported_surface"} 0`, `{outcome="unsupported_surface"} 1`,
	).Replace(want)
	if err := testutil.GatherAndCompare(h.reg, strings.NewReader(want), MetricName); err != nil {
		t.Fatalf("after evaluations: %v", err)
	}
	if got := h.count(marconi.OutcomeAttempted); got != 3 {
		t.Errorf("attempted = %v, want 3", got)
	}
}

func TestNewErrors(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(DefaultConfig(), nil, reg, nil); err != nil {
		t.Fatalf("first New: %v", err)
	}
	var are prometheus.AlreadyRegisteredError
	if _, err := New(DefaultConfig(), nil, reg, nil); !errors.As(err, &are) {
		t.Errorf("second New on the same registry = %v, want AlreadyRegisteredError", err)
	}
	if _, err := New(DefaultConfig(), nil, nil, nil); err == nil {
		t.Error("New with nil registerer succeeded")
	}
	bad := DefaultConfig()
	bad.MaxAttempts = 0
	if _, err := New(bad, nil, prometheus.NewRegistry(), nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New with bad config = %v, want ErrInvalidConfig", err)
	}
}

func TestDebugLogPerDecision(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	clock := newFakeClock()
	ev, err := New(DefaultConfig(), clock.Now, prometheus.NewRegistry(), logger)
	if err != nil {
		t.Fatal(err)
	}
	fresh := clock.Now().Add(-time.Second)
	ev.Spend(
		Party{TenantID: "t1", ProjectID: "p1", SessionID: "lafonda", Surface: "codex", ProofOfLife: fresh},
		Party{TenantID: "t1", ProjectID: "p1", SessionID: "donna", Surface: "claude_code", ProofOfLife: fresh},
	)
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 2 {
		t.Fatalf("got %d log lines, want one per decision (2): %s", len(lines), buf.String())
	}
	want := [][3]string{{"recipient", "lafonda", "unsupported_surface"}, {"sender", "donna", "attempted"}}
	for i, w := range want {
		m := lines[i]
		if m["level"] != "DEBUG" || m["side"] != w[0] || m["session_id"] != w[1] || m["outcome"] != w[2] {
			t.Errorf("log line %d = %v, want DEBUG side=%s session_id=%s outcome=%s", i, m, w[0], w[1], w[2])
		}
	}
}

func TestBoundedMemory_100kSessionsAfterSweep(t *testing.T) {
	h := newHarness(t, nil)
	const n = 100_000
	sender := h.attached("x")
	for i := range n {
		h.ev.Spend(h.party("t1", "p1", fmt.Sprintf("s%d", i)), sender)
	}
	if got := h.ev.Len(); got != n {
		t.Fatalf("Len after %d attempts = %d", n, got)
	}
	// Not yet full (2.95 of 3 tokens): nothing is dropped.
	h.clock.Advance(19 * time.Second)
	if dropped := h.ev.Sweep(); dropped != 0 || h.ev.Len() != n {
		t.Fatalf("Sweep before refill dropped %d, Len %d", dropped, h.ev.Len())
	}
	// One more second: every bucket is full again and forgotten.
	h.clock.Advance(time.Second)
	if dropped := h.ev.Sweep(); dropped != n {
		t.Errorf("Sweep dropped %d, want %d", dropped, n)
	}
	if got := h.ev.Len(); got != 0 {
		t.Errorf("Len after Sweep = %d, want 0", got)
	}
	// A forgotten bucket behaves as full.
	if got := h.ev.Tokens(SideRecipient, "t1", "p1", "s42"); got != 3 {
		t.Errorf("forgotten bucket reads %v tokens, want 3", got)
	}
}

func TestFullBucketForgottenOnAccess(t *testing.T) {
	h := newHarness(t, nil)
	h.ev.Spend(h.party("t1", "p1", "a"), h.attached("x"))
	h.ev.Spend(h.party("t1", "p1", "b"), h.attached("x"))
	if h.ev.Len() != 2 {
		t.Fatalf("Len = %d, want 2", h.ev.Len())
	}
	h.clock.Advance(20 * time.Second)
	if got := h.ev.Tokens(SideRecipient, "t1", "p1", "a"); got != 3 {
		t.Fatalf("tokens = %v, want 3", got)
	}
	if h.ev.Len() != 1 {
		t.Errorf("Len after reading a full bucket = %d, want 1", h.ev.Len())
	}
	// An attempt on a bucket that had refilled starts from full again.
	if r := h.ev.Spend(h.party("t1", "p1", "b"), h.attached("x")); r.Recipient != marconi.OutcomeAttempted {
		t.Fatalf("%+v", r)
	}
	if got := h.ev.Tokens(SideRecipient, "t1", "p1", "b"); got != 2 {
		t.Errorf("tokens = %v, want 2", got)
	}
}

func TestConcurrentEvaluate(t *testing.T) {
	h := newHarness(t, nil) // the clock stands still: no refill
	const goroutines, perG, sessions = 8, 200, 5
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perG {
				s := fmt.Sprintf("s%d", (g+i)%sessions)
				r := h.ev.Spend(h.party("t1", "p1", s), h.party("t1", "p1", s))
				if r.Recipient == marconi.OutcomeRateLimited && r.RecipientRouteStale {
					t.Errorf("rate_limited with recipient_route_stale: %+v", r)
				}
				_ = h.ev.Tokens(SideSender, "t1", "p1", s)
				if i%50 == 0 {
					h.ev.Sweep()
				}
			}
		}()
	}
	wg.Wait()
	// Each of the 2*sessions buckets grants exactly MaxAttempts, never more.
	total := float64(goroutines * perG * 2)
	want := map[Outcome]float64{
		marconi.OutcomeAttempted:   float64(2 * sessions * 3),
		marconi.OutcomeRateLimited: total - float64(2*sessions*3),
	}
	h.wantCounts(t, want)
}
