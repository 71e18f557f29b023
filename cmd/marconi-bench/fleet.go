package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The fleet subcommand measures what instances added behind a load balancer
// cost: the durable load of durable (closed-loop senders, each to its own
// attached recipient, acking over its WebSocket) against one instance, then
// against three instances behind HAProxy (deploy/haproxy.cfg), in rounds
// that alternate the two, on one Postgres. Behind the balancer a sender and
// its recipient mostly attach to different instances, so the cross-instance
// path is what is paid. Per run it reports sends/s, send p50/p99, Postgres
// commits per send (pg_stat_database) and hub CPU per send (/proc), and the
// three-instance figures as ratios of the one-instance ones. With -bus-url
// each round also runs the three instances waking each other through NATS
// (MARCONI_BUS_URL) instead of LISTEN/NOTIFY, and reports both buses'
// ratios, and NATS's against NOTIFY's. With -before, an earlier build runs
// in the same rounds and the after/before ratios are printed too;
// -instances 1 runs one instance alone, a quick before/after of one hub's
// cost per send.

// Bounds of a fleet run.
const (
	maxFleetRounds   = 10
	fleetInstances   = 3
	haproxyStartWait = 10 * time.Second
)

type fleetOptions struct {
	durableOptions
	before string // a second marconi binary, run interleaved with the first; empty: none
	// beforeDB is the database of the before binary (an older schema may
	// not run on a newer one); default databaseURL.
	beforeDB string
	haproxy  string
	config   string
	rounds   int
	// natsURL is the NATS server of the three-instance runs on the NATS
	// bus; empty: none.
	natsURL string
	// instances are the fleet sizes each round runs: 1, 3 or both.
	instances []int
}

func parseFleetOptions(args []string, stderr io.Writer) (fleetOptions, error) {
	var o fleetOptions
	fs := flag.NewFlagSet("marconi-bench fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.marconi, "marconi", "marconi", "the marconi binary to start the hubs with")
	fs.StringVar(&o.databaseURL, "database-url", "", "Postgres URL (loopback only) the hubs use; it is migrated. Use a database of its own: commits are counted database-wide")
	fs.StringVar(&o.before, "before", "", "another marconi binary (an earlier build) to run in the same rounds, before each run of -marconi, for before/after ratios")
	fs.StringVar(&o.beforeDB, "before-database-url", "", "the database of -before (loopback only; default -database-url): an older build may refuse a newer schema")
	fs.StringVar(&o.haproxy, "haproxy", "haproxy", "the haproxy binary")
	fs.StringVar(&o.config, "haproxy-config", "deploy/haproxy.cfg", "the balancer's configuration")
	senders := fs.Int("senders", 64, fmt.Sprintf("concurrent senders (1..%d)", maxDurableSenders))
	fs.DurationVar(&o.step, "duration", 15*time.Second, fmt.Sprintf("how long each run sends, after a %s warm-up (at most %s)", durableWarmup, maxDurableStep))
	fs.IntVar(&o.payload, "payload", 60, "payload bytes of each signal")
	fs.StringVar(&o.natsURL, "bus-url", "", "a NATS server (nats://, loopback only): each round also runs the three instances waking each other through it (MARCONI_BUS_URL) instead of Postgres NOTIFY; -marconi only")
	fs.IntVar(&o.rounds, "rounds", 2, fmt.Sprintf("rounds of one run each, one instance then three (1..%d)", maxFleetRounds))
	instances := fs.String("instances", fmt.Sprintf("1,%d", fleetInstances), fmt.Sprintf("the fleet sizes each round runs: 1, %d or 1,%d (1 alone for a quick before/after of one instance)", fleetInstances, fleetInstances))
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	u, err := url.Parse(o.databaseURL)
	switch {
	case err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql"):
		return o, fmt.Errorf("-database-url %q: want a postgres:// URL", o.databaseURL)
	case !loopback(u.Hostname()):
		return o, fmt.Errorf("-database-url: only a database on this machine (loopback) may be loaded")
	case *senders < 1 || *senders > maxDurableSenders:
		return o, fmt.Errorf("-senders %d: want 1..%d", *senders, maxDurableSenders)
	case o.step <= 0 || o.step > maxDurableStep:
		return o, fmt.Errorf("-duration %s: want more than 0 and at most %s", o.step, maxDurableStep)
	case o.payload < 2 || o.payload > maxDurablePayload:
		return o, fmt.Errorf("-payload %d: want 2..%d", o.payload, maxDurablePayload)
	case o.rounds < 1 || o.rounds > maxFleetRounds:
		return o, fmt.Errorf("-rounds %d: want 1..%d", o.rounds, maxFleetRounds)
	}
	if o.beforeDB == "" {
		o.beforeDB = o.databaseURL
	} else if u, err := url.Parse(o.beforeDB); err != nil || !loopback(u.Hostname()) {
		return o, fmt.Errorf("-before-database-url: want a postgres:// URL on this machine")
	}
	if o.natsURL != "" {
		if u, err := url.Parse(o.natsURL); err != nil || u.Scheme != "nats" || !loopback(u.Hostname()) {
			return o, fmt.Errorf("-bus-url %q: want a nats:// URL on this machine (loopback)", o.natsURL)
		}
	}
	if _, err := os.Stat(o.config); err != nil {
		return o, fmt.Errorf("-haproxy-config: %w", err)
	}
	switch *instances {
	case "1":
		o.instances = []int{1}
	case strconv.Itoa(fleetInstances):
		o.instances = []int{fleetInstances}
	case fmt.Sprintf("1,%d", fleetInstances):
		o.instances = []int{1, fleetInstances}
	default:
		return o, fmt.Errorf("-instances %q: want 1, %d or 1,%d", *instances, fleetInstances, fleetInstances)
	}
	o.senders = []int{*senders}
	return o, nil
}

// fleetCmd is the fleet subcommand.
func fleetCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFleetOptions(args, stderr)
	if err != nil {
		return err
	}
	return runFleet(ctx, o, stdout, stderr)
}

// fleetResult is one run's outcome.
type fleetResult struct {
	durableResult
	commitsPerSend float64
	cpuPerSend     time.Duration
}

func runFleet(ctx context.Context, o fleetOptions, out, logs io.Writer) error {
	n := o.senders[0]
	fmt.Fprintf(out, "fleet: %d senders, each to its own attached recipient (acking over its WebSocket), payload %d B, %s per run after a %s warm-up, %d rounds\n",
		n, o.payload, o.step, durableWarmup, o.rounds)
	fmt.Fprintf(out, "%-6s %-7s %-10s %-7s %10s %10s %10s %14s %14s %8s\n", "round", "build", "instances", "bus", "sends/s", "p50", "p99", "commits/send", "hub_cpu/send", "failed")
	builds := []string{o.marconi}
	if o.before != "" {
		builds = []string{o.before, o.marconi}
	}
	results := map[string][]fleetResult{} // by build, instances and bus
	for round := 1; round <= o.rounds; round++ {
		for _, bin := range builds {
			for _, c := range fleetConfigs(o, bin) {
				run := o
				run.marconi = bin
				if bin == o.before {
					run.databaseURL = o.beforeDB
				}
				if c.bus == busNATS {
					run.busURL = o.natsURL
				}
				r, err := fleetRun(ctx, run, c.instances, logs)
				if err != nil {
					return err
				}
				name := buildName(o, bin)
				fmt.Fprintf(out, "%-6d %-7s %-10d %-7s %10.0f %10s %10s %14.2f %14s %8d\n", round, name, c.instances, c.bus, r.perSec,
					r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond), r.commitsPerSend, r.cpuPerSend.Round(time.Microsecond), r.failed)
				key := fmt.Sprintf("%s/%d/%s", name, c.instances, c.bus)
				results[key] = append(results[key], r)
			}
		}
	}
	withOne, withThree := slices.Contains(o.instances, 1), slices.Contains(o.instances, fleetInstances)
	for _, bin := range builds {
		name := buildName(o, bin)
		one := meanFleet(results[name+"/1/"+busNOTIFY])
		for _, c := range fleetConfigs(o, bin) {
			if c.instances == 1 || !withOne {
				continue
			}
			fmt.Fprintln(out, fleetRatios(fmt.Sprintf("%s: three instances on %s / one", name, c.bus), o.rounds,
				meanFleet(results[fmt.Sprintf("%s/%d/%s", name, c.instances, c.bus)]), one))
		}
		if bin == o.marconi && o.natsURL != "" && withThree {
			fmt.Fprintln(out, fleetRatios(name+": three instances on NATS / three on NOTIFY", o.rounds,
				meanFleet(results[fmt.Sprintf("%s/%d/%s", name, fleetInstances, busNATS)]),
				meanFleet(results[fmt.Sprintf("%s/%d/%s", name, fleetInstances, busNOTIFY)])))
		}
	}
	if o.before != "" {
		for _, c := range fleetConfigs(o, o.before) { // the runs both builds made
			key := fmt.Sprintf("/%d/%s", c.instances, c.bus)
			fmt.Fprintln(out, fleetRatios(fmt.Sprintf("%d instance(s) on %s: after / before", c.instances, c.bus), o.rounds,
				meanFleet(results["after"+key]), meanFleet(results["before"+key])))
		}
	}
	return nil
}

// The wake-up buses a fleet run can use.
const (
	busNOTIFY = "NOTIFY" // Postgres LISTEN/NOTIFY, the default
	busNATS   = "NATS"   // MARCONI_BUS_URL
)

// fleetConfig is one run of a round: how many instances, on which bus.
type fleetConfig struct {
	instances int
	bus       string
}

// fleetConfigs are the runs of a round for bin: one instance, then three
// on NOTIFY, then (for -marconi with -bus-url) three on NATS, less the
// sizes -instances leaves out. One instance wakes nobody, so it has no NATS
// run.
func fleetConfigs(o fleetOptions, bin string) []fleetConfig {
	var cs []fleetConfig
	if slices.Contains(o.instances, 1) {
		cs = append(cs, fleetConfig{1, busNOTIFY})
	}
	if slices.Contains(o.instances, fleetInstances) {
		cs = append(cs, fleetConfig{fleetInstances, busNOTIFY})
		if o.natsURL != "" && bin == o.marconi {
			cs = append(cs, fleetConfig{fleetInstances, busNATS})
		}
	}
	return cs
}

// fleetRatios is a line of b's figures as ratios of a's, or says a has
// none to divide by.
func fleetRatios(what string, rounds int, b, a fleetResult) string {
	if a.perSec <= 0 || a.p99 <= 0 || a.commitsPerSend <= 0 || a.cpuPerSend <= 0 {
		return what + ": no figures to divide by"
	}
	return fmt.Sprintf("%s (means of %d rounds): sends/s %.2fx, p99 %.2fx, commits per send %.2fx, hub CPU per send %.2fx",
		what, rounds, b.perSec/a.perSec, float64(b.p99)/float64(a.p99), b.commitsPerSend/a.commitsPerSend, float64(b.cpuPerSend)/float64(a.cpuPerSend))
}

// buildName is how a row names the binary it ran: before or after.
func buildName(o fleetOptions, bin string) string {
	if o.before != "" && bin == o.before {
		return "before"
	}
	return "after"
}

// meanFleet is the mean of rs.
func meanFleet(rs []fleetResult) fleetResult {
	var m fleetResult
	for _, r := range rs {
		m.perSec += r.perSec / float64(len(rs))
		m.p99 += r.p99 / time.Duration(len(rs))
		m.commitsPerSend += r.commitsPerSend / float64(len(rs))
		m.cpuPerSend += r.cpuPerSend / time.Duration(len(rs))
	}
	return m
}

// fleetRun starts k hubs (behind HAProxy when k > 1), runs the load once
// and stops them.
func fleetRun(ctx context.Context, o fleetOptions, k int, logs io.Writer) (fleetResult, error) {
	var hubs []*benchHub
	defer func() {
		for _, h := range hubs {
			h.stop()
		}
	}()
	for i := 1; i <= k; i++ {
		h, err := startHub(ctx, o.durableOptions, fmt.Sprintf("hub-%d", i), "on", logs)
		if err != nil {
			return fleetResult{}, err
		}
		hubs = append(hubs, h)
	}
	target := hubs[0].url
	if k > 1 {
		lb, err := startHAProxy(ctx, o, hubs, logs)
		if err != nil {
			return fleetResult{}, err
		}
		defer lb.stop()
		target = lb.url
	}
	var before, after fleetSample
	marks := &stepMarks{
		start: func() { before = sampleFleet(ctx, o.databaseURL, hubs) },
		end:   func() { after = sampleFleet(ctx, o.databaseURL, hubs) },
	}
	r, err := durableStepMarked(ctx, o.durableOptions, target, target, o.senders[0], marks)
	if err != nil {
		return fleetResult{}, err
	}
	out := fleetResult{durableResult: r}
	if r.sends > 0 {
		out.commitsPerSend = float64(after.commits-before.commits) / float64(r.sends)
		out.cpuPerSend = (after.cpu - before.cpu) / time.Duration(r.sends)
	}
	return out, nil
}

// fleetSample is what a run's figures are deltas of: the database's
// committed transactions and the hubs' CPU time.
type fleetSample struct {
	commits int64
	cpu     time.Duration
}

// sampleFleet reads the database's commit count and the hubs' CPU time;
// a figure it cannot read stays zero.
func sampleFleet(ctx context.Context, databaseURL string, hubs []*benchHub) fleetSample {
	var s fleetSample
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(cctx, databaseURL); err == nil {
		// Counters are flushed by each backend when it goes idle; clear
		// this backend's snapshot so the read is current.
		_, _ = conn.Exec(cctx, `SELECT pg_stat_clear_snapshot()`)
		_ = conn.QueryRow(cctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&s.commits)
		_ = conn.Close(cctx)
	}
	for _, h := range hubs {
		s.cpu += processCPU(h.cmd.Process.Pid)
	}
	return s
}

// processCPU is pid's user and system CPU time from /proc (zero when it
// cannot be read).
func processCPU(pid int) time.Duration {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	// Fields after the command (which may hold spaces) start after ") ".
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticksPerSecond
}

// balancer is a running HAProxy.
type balancer struct {
	url  string
	cmd  *exec.Cmd
	done chan struct{}
}

// startHAProxy runs haproxy in front of hubs with o.config and waits until
// it forwards /readyz.
func startHAProxy(ctx context.Context, o fleetOptions, hubs []*benchHub, logs io.Writer) (*balancer, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	stats, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(o.haproxy, "-db", "-f", o.config)
	cmd.Env = append(os.Environ(), "MARCONI_LB_BIND="+addr, "MARCONI_LB_STATS="+stats)
	for i, h := range hubs {
		cmd.Env = append(cmd.Env, fmt.Sprintf("MARCONI_HUB_%d=%s", i+1, strings.TrimPrefix(h.url, "http://")))
	}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", o.haproxy, err)
	}
	lb := &balancer{url: "http://" + addr, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(lb.done) }()
	deadline := time.Now().Add(haproxyStartWait)
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		err := httpJSON(rctx, "GET", lb.url+"/readyz", nil, nil, nil)
		cancel()
		if err == nil {
			return lb, nil
		}
		select {
		case <-lb.done:
			return nil, fmt.Errorf("haproxy exited before it forwarded")
		case <-ctx.Done():
			lb.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			lb.stop()
			return nil, fmt.Errorf("haproxy not forwarding within %s", haproxyStartWait)
		}
	}
}

// stop ends haproxy.
func (b *balancer) stop() {
	_ = b.cmd.Process.Kill()
	<-b.done
}
