package hub_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// hasMetric reports whether the registry holds a counter or gauge series
// named name with the given label pairs.
func hasMetric(t *testing.T, h *hubtest.Hub, name string, labels ...string) bool {
	t.Helper()
	_, ok := lookupMetric(t, h, name, labels...)
	return ok
}

// histogramCount is the sample count of a histogram series.
func histogramCount(t *testing.T, h *hubtest.Hub, name, route, method string) uint64 {
	t.Helper()
	mfs, _ := h.Registry.Gather()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			if got["route"] == route && got["method"] == method {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}

func TestHTTPMetricsByRouteAndStatus(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	a := register(t, h, "alice", "claude_code")
	call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": "bob", "surface": "nope"})
	call(t, "POST", h.URL+"/v1/signals", a.Token, map[string]any{"to_session": "ghost-1", "payload": 1})
	call(t, "GET", h.URL+"/v1/no/such/thing/"+strings.Repeat("x", 20), a.Token, nil)
	c, _ := dial(t, h, a)
	c.CloseNow()
	// A WebSocket attach is counted when its handler ends.
	waitFor(t, "the attach to be counted", func() bool {
		return hasMetric(t, h, "marconi_http_requests_total", "route", "/v1/ws")
	})

	for _, tt := range []struct {
		route, method, status string
	}{
		{"/v1/sessions", "POST", "201"},
		{"/v1/sessions", "POST", "400"},
		{"/v1/signals", "POST", "404"},
		{"/v1/ws", "GET", "101"},
	} {
		if got := metric(t, h, "marconi_http_requests_total", "route", tt.route, "method", tt.method, "status", tt.status); got != 1 {
			t.Errorf("requests %v = %v, want 1", tt, got)
		}
	}
	// An unknown path is counted under a bounded label, never its own path.
	mfs, _ := h.Registry.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if strings.Contains(lp.GetValue(), "xxxx") {
					t.Errorf("%s has an unbounded label %s=%q", mf.GetName(), lp.GetName(), lp.GetValue())
				}
			}
		}
	}
	if n := histogramCount(t, h, "marconi_http_request_duration_seconds", "/v1/sessions", "POST"); n != 2 {
		t.Errorf("latency samples for POST /v1/sessions = %d, want 2", n)
	}
	if n := histogramCount(t, h, "marconi_http_request_duration_seconds", "/v1/ws", "GET"); n != 0 {
		t.Errorf("a WebSocket was timed as a request: %d samples", n)
	}
}

// TestSessionsByRouteStateGauge: the cluster-wide gauge counts live
// sessions by route state, with piggyback-only sessions apart.
func TestSessionsByRouteStateGauge(t *testing.T) {
	clock := hubtest.NewClock(time.Now().UTC())
	h := hubtest.Start(t, hubtest.Options{Now: clock.Now, Config: hub.Config{
		Retention: hub.Retention{Every: 5 * time.Millisecond},
	}})
	a := register(t, h, "alice", "claude_code")
	register(t, h, "bob", "claude_code")
	codex := register(t, h, "batch", "codex")
	send(t, h, codex, "bob", "hello")
	c, _ := dial(t, h, a)
	defer c.CloseNow()

	sessions := func(state, class string) float64 {
		return metric(t, h, "marconi_sessions", "route_state", state, "surface_class", class)
	}
	waitFor(t, "the route-state gauge", func() bool {
		return hasMetric(t, h, "marconi_sessions") && sessions("attached", "live") == 1 &&
			sessions("route_without_queue", "live") == 1 && sessions("route_without_queue", "piggyback") == 1
	})
	if sessions("stale", "live") != 0 || metric(t, h, "marconi_pending_signals") != 1 || metric(t, h, "marconi_cluster_reporter") != 1 {
		t.Errorf("stale %v, pending %v, reporter %v", sessions("stale", "live"), metric(t, h, "marconi_pending_signals"), metric(t, h, "marconi_cluster_reporter"))
	}
	// Past the freshness window, the sessions without a WebSocket go stale.
	clock.Advance(10 * time.Minute)
	waitFor(t, "stale sessions in the gauge", func() bool {
		return sessions("stale", "live") == 1 && sessions("stale", "piggyback") == 1 && sessions("route_without_queue", "live") == 0
	})
}

// TestClusterGaugesExportedOnce: two instances on one store; only the
// healthy one with the lowest id exports the cluster-wide gauges, so sum()
// over instances counts each pending signal once. When it drains, the other
// takes over.
func TestClusterGaugesExportedOnce(t *testing.T) {
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	cfg := func(id string) hub.Config {
		return hub.Config{InstanceID: id, Retention: hub.Retention{Every: 5 * time.Millisecond},
			Fabric: fabric.Config{DeadAfter: time.Minute, HeartbeatEvery: time.Hour}}
	}
	a := hubtest.Start(t, hubtest.Options{Store: store, Config: cfg("hub-a")})
	b := hubtest.Start(t, hubtest.Options{Store: store, Config: cfg("hub-b")})
	for _, h := range []*hubtest.Hub{a, b} {
		if err := h.Server.Fabric().Tick(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	alice := register(t, a, "alice", "claude_code")
	register(t, a, "bob", "claude_code")
	send(t, a, alice, "bob", "one")
	send(t, a, alice, "bob", "two")
	waitFor(t, "hub-a to export the pending gauge", func() bool {
		return hasMetric(t, a, "marconi_pending_signals") && metric(t, a, "marconi_pending_signals") == 2
	})
	if hasMetric(t, b, "marconi_pending_signals") || hasMetric(t, b, "marconi_sessions") {
		t.Fatal("hub-b exports the cluster-wide gauges too: sum() would count them twice")
	}
	if metric(t, a, "marconi_cluster_reporter") != 1 || metric(t, b, "marconi_cluster_reporter") != 0 {
		t.Fatal("marconi_cluster_reporter does not say which instance reports")
	}

	a.Server.SetDraining()
	if err := b.Server.Fabric().Tick(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "hub-b to take over the cluster-wide gauges", func() bool {
		return hasMetric(t, b, "marconi_pending_signals") && metric(t, b, "marconi_pending_signals") == 2
	})
	if hasMetric(t, a, "marconi_pending_signals") || metric(t, a, "marconi_cluster_reporter") != 0 {
		t.Fatal("a draining instance still exports the cluster-wide gauges")
	}
}

// TestActivityLog: registrations, resumes, deregistrations and refusals are
// logged at info with their code, and no secret reaches the log.
func TestActivityLog(t *testing.T) {
	var buf lockedBuffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	h := hubtest.Start(t, hubtest.Options{Logger: log})
	a := register(t, h, "alice", "claude_code")
	st, resumed := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": "alice", "surface": "claude_code"},
		"X-Marconi-Session-Token", a.Token)
	if st != 200 {
		t.Fatalf("resume: %d %v", st, resumed)
	}
	call(t, "POST", h.URL+"/v1/sessions", h.APIKey, map[string]any{"session_id": "alice", "surface": "claude_code"})
	call(t, "POST", h.URL+"/v1/signals", "mst_not_a_real_token_123456", map[string]any{"to_session": "x", "payload": 1})
	call(t, "DELETE", h.URL+"/v1/session", resumed["token"].(string), nil)

	text := buf.String()
	for _, want := range []string{
		`"msg":"session registered"`, `"session_id":"alice"`, `"surface":"claude_code"`,
		`"msg":"session resumed"`,
		`"msg":"request refused"`, `"code":"forbidden"`, `"code":"session_expired"`, `"status":403`, `"route":"/v1/sessions"`,
		`"msg":"session deregistered"`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("activity log lacks %s", want)
		}
	}
	for _, secret := range []string{a.Token, resumed["token"].(string), h.APIKey, "mst_not_a_real_token_123456", h.AdminToken} {
		if strings.Contains(text, secret) {
			t.Errorf("a secret reached the log: %q", secret)
		}
	}
}
