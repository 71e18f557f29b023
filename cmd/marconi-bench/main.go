package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
)

// Bounds of one run, so that the tool cannot be turned into a flood.
const (
	maxAgents     = 2000
	maxDuration   = 5 * time.Minute
	maxTotalRate  = 5000.0
	dialsInFlight = 16
	// maxSamples bounds the latency samples kept per kind.
	maxSamples = 1 << 20
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// options are one run's parameters, validated by parseOptions.
type options struct {
	hubURL string
	// apiKeys are the API keys of the load's projects, one per project
	// (MARCONI_BENCH_API_KEY, comma-separated); agent i registers in project
	// i mod len(apiKeys).
	apiKeys  []string
	agents   int
	rate     float64 // sends a second per agent; 0 attaches and measures only
	duration time.Duration
	surface  string
	// ackInterval is the agents' Config.AckInterval; zero: the client's
	// default.
	ackInterval time.Duration
	// databaseURL is the hub's database (loopback), read for commits and
	// Postgres CPU per send; empty: not read.
	databaseURL string
}

func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("marconi-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.hubURL, "hub", "http://127.0.0.1:8080", "hub base URL (loopback only)")
	fs.IntVar(&o.agents, "agents", 100, fmt.Sprintf("agents to attach (1..%d)", maxAgents))
	fs.Float64Var(&o.rate, "rate", 1, "sends a second per agent, each to the next agent; 0 only attaches")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, fmt.Sprintf("how long to send (at most %s)", maxDuration))
	fs.StringVar(&o.surface, "surface", "claude_code", "surface the agents register with")
	fs.DurationVar(&o.ackInterval, "ack-interval", 0, ackIntervalUsage)
	fs.StringVar(&o.databaseURL, "database-url", "", "the hub's Postgres database (loopback only), to report its commits and the Postgres server's CPU per send; empty: not reported")
	projects := fs.Int("projects", 1, fmt.Sprintf("how many projects the agents are spread over (1..%d), agent i in project i mod N, each sending to the next agent of its project; MARCONI_BENCH_API_KEY then lists N keys, comma-separated, one per project", maxBenchProjects))
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if *projects < 1 || *projects > maxBenchProjects {
		return o, fmt.Errorf("-projects %d: want 1..%d", *projects, maxBenchProjects)
	}
	if err := checkAckInterval(o.ackInterval); err != nil {
		return o, err
	}
	if o.databaseURL != "" {
		if err := loopbackPostgres("-database-url", o.databaseURL); err != nil {
			return o, err
		}
	}
	keys := getenv("MARCONI_BENCH_API_KEY")
	if keys == "" {
		return o, errors.New("MARCONI_BENCH_API_KEY is not set: give an API key of the hub")
	}
	o.apiKeys = strings.Split(keys, ",")
	if len(o.apiKeys) != *projects || slices.Contains(o.apiKeys, "") {
		return o, fmt.Errorf("MARCONI_BENCH_API_KEY lists %d keys (comma-separated) with -projects %d: want one key per project, none empty", len(o.apiKeys), *projects)
	}
	u, err := url.Parse(o.hubURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return o, fmt.Errorf("-hub %q: want an http(s) URL", o.hubURL)
	}
	if !loopback(u.Hostname()) {
		return o, fmt.Errorf("-hub %q: only a hub on this machine (loopback) may be loaded", o.hubURL)
	}
	o.hubURL = strings.TrimRight(o.hubURL, "/")
	switch {
	case o.agents < 1 || o.agents > maxAgents:
		return o, fmt.Errorf("-agents %d: want 1..%d", o.agents, maxAgents)
	case o.duration <= 0 || o.duration > maxDuration:
		return o, fmt.Errorf("-duration %s: want more than 0 and at most %s", o.duration, maxDuration)
	case o.rate < 0 || o.rate*float64(o.agents) > maxTotalRate:
		return o, fmt.Errorf("-rate %g with %d agents: want at most %g sends a second in all", o.rate, o.agents, maxTotalRate)
	case o.rate > 0 && o.agents < 2:
		return o, errors.New("-rate > 0 needs at least 2 agents (each sends to the next)")
	case o.rate > 0 && o.agents < 2*len(o.apiKeys):
		return o, fmt.Errorf("-rate > 0 with -projects %d needs at least %d agents (each sends to the next of its project)", len(o.apiKeys), 2*len(o.apiKeys))
	}
	return o, nil
}

// loopbackPostgres checks that raw, the value of flag, is a postgres:// URL
// of a database on this machine: the tool loads and resets what it is
// given, so nothing else may be named.
func loopbackPostgres(flag, raw string) error {
	u, err := url.Parse(raw)
	if raw == "" || err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return fmt.Errorf("%s %q: want a postgres:// URL", flag, raw)
	}
	if !loopback(u.Hostname()) {
		return fmt.Errorf("%s: only a database on this machine (loopback) may be loaded", flag)
	}
	return nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if sub, ok := subcommands[args[0]]; ok {
			return runSub(ctx, args[0], sub, args[1:], stdout, stderr)
		}
	}
	o, err := parseOptions(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "marconi-bench:", err)
		return 2
	}
	if err := bench(ctx, o, stdout); err != nil {
		fmt.Fprintln(stderr, "marconi-bench:", err)
		return 1
	}
	return 0
}

// recorder keeps bounded latency samples; it is safe for concurrent use.
type recorder struct {
	mu      sync.Mutex
	samples []time.Duration
	dropped int
}

func (r *recorder) add(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.samples) >= maxSamples {
		r.dropped++
		return
	}
	r.samples = append(r.samples, d)
}

// summary is "n=… p50=… p99=… max=…" of the samples.
func (r *recorder) summary() string {
	r.mu.Lock()
	s := slices.Clone(r.samples)
	r.mu.Unlock()
	if len(s) == 0 {
		return "n=0"
	}
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[int(p*float64(len(s)-1))] }
	return fmt.Sprintf("n=%d p50=%s p90=%s p99=%s max=%s", len(s), q(0.5), q(0.9), q(0.99), s[len(s)-1])
}

// payload is what each benchmark signal carries: when it was sent.
type payload struct {
	SentNS int64 `json:"sent_ns"`
}

// partners places n agents in projects projects, agent i in project i mod
// projects, and gives each the agent it sends to: the next of its project
// (in order of i, the last to the first), so that every agent receives from
// exactly one. An agent alone in its project sends to itself.
func partners(n, projects int) []int {
	to := make([]int, n)
	for i := range n {
		to[i] = i + projects
		if to[i] >= n {
			to[i] = i % projects // the first of its project
		}
	}
	return to
}

func bench(ctx context.Context, o options, out io.Writer) error {
	fmt.Fprintf(out, "hub %s: %d agents, %g sends/s each for %s\n", o.hubURL, o.agents, o.rate, o.duration)
	if len(o.apiKeys) > 1 {
		fmt.Fprintf(out, "agents spread over %d projects (agent i in project i mod %d, each sending to the next of its project)\n", len(o.apiKeys), len(o.apiKeys))
	}
	before, err := scrape(ctx, o.hubURL)
	if err != nil {
		return err
	}

	var delivered recorder
	var received atomic.Int64
	clients := make([]*bootstrap.Client, o.agents)
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	}()
	var attach recorder
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(dialsInFlight)
	start := time.Now()
	for i := range clients {
		g.Go(func() error {
			dctx, cancel := context.WithTimeout(gctx, 30*time.Second)
			defer cancel()
			t0 := time.Now()
			c, err := bootstrap.Dial(dctx, bootstrap.Config{
				HubURL: o.hubURL, APIKey: o.apiKeys[i%len(o.apiKeys)], Surface: o.surface,
				SessionID: fmt.Sprintf("bench-%d-%d", start.Unix(), i), AckInterval: o.ackInterval,
				OnSignal: func(s bootstrap.Signal) {
					var p payload
					if json.Unmarshal(s.Payload, &p) == nil && p.SentNS > 0 {
						delivered.add(time.Since(time.Unix(0, p.SentNS)))
					}
					received.Add(1)
				},
			})
			if err != nil {
				return fmt.Errorf("attach agent %d: %w", i, err)
			}
			attach.add(time.Since(t0))
			clients[i] = c
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	fmt.Fprintf(out, "attached %d agents in %s (%d dials in flight); attach %s\n",
		o.agents, time.Since(start).Round(time.Millisecond), dialsInFlight, attach.summary())

	attached, err := scrape(ctx, o.hubURL)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "hub process, per attached agent (WebSocket + the client's idle keep-alive HTTP connection;")
	fmt.Fprintln(out, "meaningful on a freshly started hub, best run with GOGC=10 so the heap is close to live):")
	for _, m := range scrapedMetrics {
		fmt.Fprintf(out, "  %-36s %12.0f -> %12.0f  (%+.0f per agent)\n", m, before[m], attached[m], (attached[m]-before[m])/float64(o.agents))
	}
	if o.rate == 0 {
		return nil
	}

	var sendLat recorder
	var offered, sent, failed atomic.Int64
	acksBefore := sumAcks(clients)
	var dbBefore fleetSample
	if o.databaseURL != "" {
		dbBefore = sampleFleet(ctx, o.databaseURL, nil)
	}
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / o.rate)
	loadStart := time.Now()
	loadEnd := loadStart.Add(o.duration)
	next := partners(len(clients), len(o.apiKeys))
	for i, c := range clients {
		to := clients[next[i]].SessionID()
		// The agents' first sends are spread over one interval. Each send is
		// due at a fixed time, first + k intervals, not one interval after
		// the last: a timer that fires late, or a send that answers late,
		// delays the next ones only until the agent has caught up, and the
		// load offered is the rate asked for, as long as the hub keeps up.
		first := loadStart.Add(time.Duration(int64(interval) * int64(i) / int64(len(clients))))
		if first.Before(loadEnd) {
			offered.Add(int64((loadEnd.Sub(first)-1)/interval) + 1)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTimer(time.Hour)
			t.Stop()
			// A send started before the load's end runs to its answer; one
			// still due at the end (the hub fell behind) is not made.
			for due := first; due.Before(loadEnd); due = due.Add(interval) {
				if wait := time.Until(due); wait > 0 {
					t.Reset(wait)
					select {
					case <-ctx.Done():
						return
					case <-t.C:
					}
				} else if ctx.Err() != nil || !time.Now().Before(loadEnd) {
					return
				}
				sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
				t0 := time.Now()
				_, err := c.Send(sctx, to, "bench", payload{SentNS: t0.UnixNano()})
				scancel()
				if err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
					}
					continue
				}
				sendLat.add(time.Since(t0))
				sent.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(loadStart)
	// Let the last signals arrive, with a deadline.
	deadline := time.Now().Add(5 * time.Second)
	for received.Load() < sent.Load() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	acks := sumAcks(clients) - acksBefore
	var dbAfter fleetSample
	if o.databaseURL != "" {
		dbAfter = sampleFleet(ctx, o.databaseURL, nil)
	}
	loaded, err := scrape(ctx, o.hubURL)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "offered %d (%.0f/s), sent %d (%.0f/s), failed %d, received %d\n", offered.Load(), float64(offered.Load())/o.duration.Seconds(),
		sent.Load(), float64(sent.Load())/elapsed.Seconds(), failed.Load(), received.Load())
	if n := sent.Load(); n > 0 {
		fmt.Fprintf(out, "hub CPU per send:  %.0f µs (process_cpu_seconds_total over the load, idle agents included)\n",
			(loaded["process_cpu_seconds_total"]-attached["process_cpu_seconds_total"])/float64(n)*1e6)
		fmt.Fprintf(out, "acks per send:     %.2f (the agents' acks over the load and the wait for its last signals; ack interval %s)\n",
			float64(acks)/float64(n), ackIntervalName(o.ackInterval))
		if o.databaseURL != "" {
			fmt.Fprintf(out, "Postgres per send: %.2f commits, %.0f µs of its server's CPU (over the load and the wait for its last signals)\n",
				float64(dbAfter.commits-dbBefore.commits)/float64(n), float64(dbAfter.pgCPU-dbBefore.pgCPU)/float64(n)/float64(time.Microsecond))
		}
	}
	fmt.Fprintf(out, "send answer:       %s\n", sendLat.summary())
	fmt.Fprintf(out, "send -> OnSignal:  %s\n", delivered.summary())
	fmt.Fprintln(out, "hub process under load:")
	for _, m := range scrapedMetrics {
		fmt.Fprintf(out, "  %-36s %12.0f\n", m, loaded[m])
	}
	return nil
}

// scrapedMetrics are the hub process's own figures read from /metrics.
var scrapedMetrics = []string{
	"go_goroutines",
	"process_cpu_seconds_total",
	"go_memstats_heap_inuse_bytes",
	"go_memstats_stack_inuse_bytes",
	"process_resident_memory_bytes",
	"marconi_ws_connections",
}

// scrape reads scrapedMetrics from the hub's /metrics.
func scrape(ctx context.Context, hubURL string) (map[string]float64, error) {
	got := map[string]float64{}
	err := readMetrics(ctx, hubURL, func(line string) {
		name, val, ok := strings.Cut(line, " ")
		if !ok || !slices.Contains(scrapedMetrics, name) {
			return
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			got[name] = v
		}
	})
	if err != nil {
		return nil, err
	}
	for _, m := range scrapedMetrics {
		if _, ok := got[m]; !ok {
			return nil, fmt.Errorf("scrape /metrics: %s missing (is this a marconi serve process?)", m)
		}
	}
	return got, nil
}

// readMetrics hands each line of the hub's /metrics (Prometheus text) to
// line, within 10 s.
func readMetrics(ctx context.Context, hubURL string, line func(string)) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, hubURL+"/metrics", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("scrape /metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("scrape /metrics: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line(sc.Text())
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("scrape /metrics: %w", err)
	}
	return nil
}
