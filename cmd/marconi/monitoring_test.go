package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/marconihub/marconi/internal/natstest"
	"github.com/marconihub/marconi/internal/pgtest"
)

// promtool returns the path of Debian's promtool. Without it the test
// skips, or fails when MARCONI_TEST_REQUIRE_PROMTOOL=1 (CI sets it).
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err == nil {
		return p
	}
	if os.Getenv("MARCONI_TEST_REQUIRE_PROMTOOL") == "1" {
		t.Fatal("promtool is not installed and MARCONI_TEST_REQUIRE_PROMTOOL=1 (apt-get install prometheus)")
	}
	t.Skip("skipping: promtool is not installed (apt-get install prometheus)")
	return ""
}

func runPromtool(t *testing.T, bin, dir string, stdin []byte, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bin, args...)
	cmd.Dir = dir
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func scrape(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("scrape: %d %v", resp.StatusCode, err)
	}
	return b
}

// exported is the set of series names in a text exposition (histograms
// show as their _bucket, _sum and _count series).
func exported(text []byte) map[string]bool {
	names := map[string]bool{}
	for _, line := range strings.Split(string(text), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		names[line[:strings.IndexAny(line, "{ ")]] = true
	}
	return names
}

var metricName = regexp.MustCompile(`\b(?:marconi|go|process)_[a-z0-9_]+`)

// TestMonitoringAgainstRealMetrics holds the Grafana dashboard and the
// alerting rules to the metrics a real hub exports: promtool lints the
// scrape, checks and unit-tests the rules, and every metric the rules and
// the dashboard name must be in the scrape.
func TestMonitoringAgainstRealMetrics(t *testing.T) {
	bin := promtool(t)
	m, out := startMain(t, map[string]string{"MARCONI_PRUNE_INTERVAL_SECONDS": "1"})
	key := devKey(t, out.String())
	for _, id := range []string{"alice", "bob"} {
		if a := post(t, m.URL()+"/v1/sessions", key, `{"session_id":"`+id+`","surface":"claude_code"}`); a.status != 201 {
			t.Fatalf("register %s: %+v", id, a)
		}
	}
	// Every series the rules and dashboard use, once the reporter sampled.
	var text []byte
	pollUntil(t, "the cluster-wide gauges", func() bool {
		text = scrape(t, m.URL())
		return exported(text)["marconi_sessions"]
	})
	names := exported(text)

	runPromtool(t, bin, ".", text, "check", "metrics")
	rulesDir := filepath.Join("..", "..", "deploy", "prometheus")
	runPromtool(t, bin, rulesDir, nil, "check", "rules", "alerts.yml")
	runPromtool(t, bin, rulesDir, nil, "test", "rules", "alerts_test.yml")
	runPromtool(t, bin, rulesDir, nil, "check", "config", "prometheus.yml")

	rules, err := os.ReadFile(filepath.Join(rulesDir, "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct{ Definition string }
		}
	}
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "marconi.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("deploy/grafana/marconi.json: %v", err)
	}
	used := map[string]string{}
	for _, n := range metricName.FindAllString(string(rules), -1) {
		used[n] = "deploy/prometheus/alerts.yml"
	}
	exprs := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs++
			for _, n := range metricName.FindAllString(tg.Expr, -1) {
				used[n] = "Grafana panel " + p.Title
			}
		}
	}
	for _, v := range dash.Templating.List {
		for _, n := range metricName.FindAllString(v.Definition, -1) {
			used[n] = "Grafana variable"
		}
	}
	if exprs < 10 || len(used) < 15 {
		t.Fatalf("found %d queries naming %d metrics: the parse is broken", exprs, len(used))
	}
	var missing []string
	for n, where := range used {
		if !names[n] && !postgresOrBusOnly(n) { // TestPostgresAndBusAlertsAgainstRealMetrics checks those
			missing = append(missing, n+" ("+where+")")
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("named by the dashboard or rules but not exported by the hub:\n  %s", strings.Join(missing, "\n  "))
	}
	if !regexp.MustCompile(`(?m)^marconi_build_info\{goversion="go[^"]+",revision="[^"]+",version="[^"]+"\} 1$`).Match(text) {
		t.Error("marconi_build_info is missing or malformed")
	}
}

// postgresOnly are the metrics the rules name that a hub exports only on
// Postgres (the in-memory store has no listener or liveness connection).
var postgresOnly = map[string]bool{"marconi_liveness_connects_total": true, "marconi_pg_listener_connects_total": true}

// postgresOrBusOnly tells the metrics a hub exports only on Postgres, or
// only with MARCONI_BUS_URL.
func postgresOrBusOnly(name string) bool {
	return postgresOnly[name] || strings.HasPrefix(name, "marconi_nats_bus_")
}

// TestPostgresAndBusAlertsAgainstRealMetrics holds the alerting rules on
// the NATS wake-up bus and on the Postgres listener and liveness connections to the metrics a hub
// on Postgres with MARCONI_BUS_URL exports (a hub on the in-memory store
// has none of them, so TestMonitoringAgainstRealMetrics leaves them to this
// test).
func TestPostgresAndBusAlertsAgainstRealMetrics(t *testing.T) {
	db := pgtest.Schema(t)
	bus := natstest.URL(t)
	rules, err := os.ReadFile(filepath.Join("..", "..", "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var named []string
	for _, n := range metricName.FindAllString(string(rules), -1) {
		if postgresOrBusOnly(n) {
			named = append(named, n)
		}
	}
	for _, want := range []string{"marconi_nats_bus_connected", "marconi_liveness_connects_total", "marconi_pg_listener_connects_total"} {
		if !slices.Contains(named, want) {
			t.Errorf("deploy/prometheus/alerts.yml does not name %s (MarconiWakeBusDown, MarconiLivenessConnectionFlapping, MarconiWakeListenerFlapping)", want)
		}
	}
	m, _ := startMain(t, map[string]string{"MARCONI_DATABASE_URL": db, "MARCONI_BUS_URL": bus})
	names := exported(scrape(t, m.URL()))
	for _, n := range named {
		if !names[n] {
			t.Errorf("deploy/prometheus/alerts.yml names %s, which a hub on Postgres with MARCONI_BUS_URL does not export", n)
		}
	}
}

// TestEveryAlertIsDocumented holds docs/operations.md's table of alerts to
// the rules: each alert has its row.
func TestEveryAlertIsDocumented(t *testing.T) {
	rules, err := os.ReadFile(filepath.Join("..", "..", "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	alerts := regexp.MustCompile(`(?m)^\s*- alert: (\w+)$`).FindAllSubmatch(rules, -1)
	if len(alerts) < 10 {
		t.Fatalf("found %d alerts in deploy/prometheus/alerts.yml: the parse is broken", len(alerts))
	}
	for _, a := range alerts {
		if !bytes.Contains(doc, []byte("| `"+string(a[1])+"` |")) {
			t.Errorf("alert %s has no row in docs/operations.md, Alerts", a[1])
		}
	}
}
