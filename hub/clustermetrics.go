package hub

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/signals"
)

// Cluster-wide gauges (pending signals, sessions by route state) describe
// the shared store, not this instance. Were every instance to export them,
// sum() over instances would count each session once per instance. So only
// the reporter exports them: the healthy instance with the lowest id, as the
// fabric's instance table shows it (Fabric.Reporter). Every instance exports
// marconi_cluster_reporter (1 on the reporter) so that a graph can say which.
// Per-instance series (connections, counters) are exported everywhere and
// sum correctly. docs/operations.md says how to aggregate each.

// surfaceClass is the bounded label that tells sessions that hold a
// WebSocket when alive (live) from piggyback-only ones (codex), for which
// route_without_queue is the normal state.
func surfaceClass(surface marconi.Surface) string {
	if surface.Live() {
		return "live"
	}
	return "piggyback"
}

var (
	descPending = prometheus.NewDesc("marconi_pending_signals",
		"Unacknowledged signals of live sessions, cluster-wide; exported by the reporter instance only (marconi_cluster_reporter), so sum() over instances is right.", nil, nil)
	descSessions = prometheus.NewDesc("marconi_sessions",
		"Live sessions by route state and surface class (live: holds a WebSocket when alive; piggyback: never does), cluster-wide; exported by the reporter instance only.",
		[]string{"route_state", "surface_class"}, nil)
	descReporter = prometheus.NewDesc("marconi_cluster_reporter",
		"1 on the instance that exports the cluster-wide gauges (the healthy instance with the lowest id), 0 on the others.", nil, nil)
)

// routeStates are the route states a live session can be in.
var routeStates = []marconi.RouteState{marconi.StateAttached, marconi.StateRouteWithoutQueue, marconi.StateStale}

// clusterGauges holds the last sample of the cluster-wide gauges. It is a
// prometheus.Collector that exports them only while reporter() is true and a
// sample exists. It is safe for concurrent use.
type clusterGauges struct {
	reporter func(context.Context) bool

	mu       sync.Mutex
	sampled  bool
	pending  int
	sessions map[[2]string]int // route_state, surface_class
}

func (g *clusterGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- descPending
	ch <- descSessions
	ch <- descReporter
}

func (g *clusterGauges) Collect(ch chan<- prometheus.Metric) {
	if !g.reporter(context.Background()) { // a first read of the view is bounded by the fabric's StoreTimeout
		ch <- prometheus.MustNewConstMetric(descReporter, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(descReporter, prometheus.GaugeValue, 1)
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.sampled {
		return
	}
	ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(g.pending))
	for _, state := range routeStates {
		for _, class := range []string{"live", "piggyback"} {
			n := g.sessions[[2]string{string(state), class}]
			ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(n), string(state), class)
		}
	}
}

// sampleClusterNow is sampleCluster on its own deadline, for the sample Run
// takes at start.
func (s *Server) sampleClusterNow(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s.sampleCluster(ctx)
}

// sampleCluster reads the cluster-wide gauges from the store, on the
// reporter only (the others would read what they never export).
func (s *Server) sampleCluster(ctx context.Context) {
	if !s.cluster.reporter(ctx) {
		return
	}
	now := s.now()
	n, err := s.store.PendingTotal(ctx, now)
	if err != nil {
		s.log.Warn("count pending signals", "err", err)
		return
	}
	sessions, err := s.store.ListSessions(ctx, sessionstore.SessionFilter{}, now)
	if err != nil {
		s.log.Warn("list sessions for the route-state gauge", "err", err)
		return
	}
	byState := make(map[[2]string]int, 6)
	fresh := s.signals.Config().Freshness
	for i := range sessions {
		state := signals.Classify(sessions[i], s.conns.Route(ctx, sessions[i]), now, fresh)
		byState[[2]string{string(state), surfaceClass(sessions[i].Surface)}]++
	}
	s.cluster.mu.Lock()
	s.cluster.sampled, s.cluster.pending, s.cluster.sessions = true, n, byState
	s.cluster.mu.Unlock()
}
