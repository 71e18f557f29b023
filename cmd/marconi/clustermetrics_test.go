package main

import (
	"strings"
	"testing"

	"github.com/marconihub/marconi/internal/pgtest"
)

// TestClusterGaugesFromTheStart: a fresh hub exports the cluster-wide
// gauges (sessions by route state, pending signals), and on Postgres the
// group commit's reruns, within moments of starting, not after its first retention run (MARCONI_PRUNE_INTERVAL_SECONDS,
// 60 s here as by default; the poll gives up after 30 s).
func TestClusterGaugesFromTheStart(t *testing.T) {
	for _, store := range []string{"memory", "postgres"} {
		t.Run(store, func(t *testing.T) {
			kv := map[string]string{"MARCONI_PRUNE_INTERVAL_SECONDS": "60"}
			if store == "postgres" {
				kv["MARCONI_DATABASE_URL"] = pgtest.Schema(t)
			}
			m, _ := startMain(t, kv)
			want := []string{
				`marconi_cluster_reporter 1`,
				`marconi_pending_signals 0`,
				`marconi_sessions{route_state="attached",surface_class="live"} 0`,
				`marconi_sessions{route_state="route_without_queue",surface_class="piggyback"} 0`,
				`marconi_sessions{route_state="stale",surface_class="live"} 0`,
			}
			if store == "postgres" { // the store's group commit, from the start
				want = append(want, `marconi_store_batch_reruns_total{reason="deadlock"} 0`,
					`marconi_store_batch_reruns_total{reason="quota"} 0`, `marconi_store_batch_reruns_total{reason="refused"} 0`)
			}
			var text string
			pollUntil(t, "the cluster-wide gauges on a fresh hub", func() bool {
				text = string(scrape(t, m.URL()))
				for _, w := range want {
					if !strings.Contains(text, w+"\n") {
						return false
					}
				}
				return true
			})
		})
	}
}
