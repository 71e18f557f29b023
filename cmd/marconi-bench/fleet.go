package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
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
// that alternate the two, on one Postgres. The load's clients name their
// project on every request (X-Marconi-Project); deploy/haproxy.cfg hashes on
// it, so one project's senders and recipients meet on one instance, and
// -projects N spreads the load over N projects (sender i and its recipient
// in project i mod N). Behind a balancer that does not (-alt-haproxy-config
// with balance leastconn) a sender and its recipient mostly attach to
// different instances, so the cross-instance path is what is paid. Per run it reports sends/s, send p50/p99, the p99
// of the time sends spent in the hubs (hub_p99: marconi_send_duration_seconds, the group commit included, HTTP not;
// far below p99, the tail is made outside the hubs), Postgres
// commits per send (pg_stat_database) and hub CPU per send (/proc), and the
// three-instance figures as ratios of the one-instance ones. With -bus-url
// each round also runs the three instances waking each other through NATS
// (MARCONI_BUS_URL) instead of LISTEN/NOTIFY, and reports both buses'
// ratios, and NATS's against NOTIFY's. With -before, an earlier build runs
// in the same rounds and the after/before ratios are printed too;
// -instances 1 runs one instance alone, a quick before/after of one hub's
// cost per send. With -gomaxprocs N each round also runs the three
// instances with GOMAXPROCS=N each (on NATS with -bus-url), the operator's
// remedy for three Go schedulers on few cores; with -alt-haproxy-config
// FILE, three instances behind that balancer configuration instead of
// -haproxy-config (and, with both, a run of the two together). With
// -profile DIR every hub's CPU profile over each measured window is written
// to DIR for go tool pprof, with the run's sends beside it to read it per
// send. With -statements N each run lists the N statements Postgres spent
// the most time on, per send (statements.go). With -public-url direct each
// instance's MARCONI_PUBLIC_URL is its own address instead of its balancer
// path (<balancer>/i/<id>), so that the senders' holder-routed sends
// (recipient_instance_url) skip the balancer; with -public-url both each
// three-instance run is made twice in a round, through the balancer then
// direct, and their ratios are printed. With -ack-interval D the load's
// clients pace their acks at D (Config.AckInterval) instead of the client's
// default (each row gives the recipients' acks per send); -hub-env
// NAME=value (repeatable) adds to every hub's environment (GOGC=400).

// Bounds of a fleet run.
const (
	maxFleetRounds   = 10
	fleetInstances   = 3
	haproxyStartWait = 10 * time.Second
	maxFleetProcs    = 64
	// maxFleetStatements bounds -statements.
	maxFleetStatements = 20
	// benchAdminToken is the hubs' admin token, which their pprof
	// endpoint asks for.
	benchAdminToken = "madm_durable_bench_local_only"
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
	// procs is the GOMAXPROCS of an extra three-instance run in each
	// round; zero: none.
	procs int
	// altConfig is the HAProxy configuration of an extra three-instance
	// run in each round; empty: none.
	altConfig string
	// profileDir receives each hub's CPU profile of each run; empty: none.
	profileDir string
	// profileTag names one run's profile files; set by runFleet.
	profileTag string
	// statements is how many of Postgres's statements each run lists
	// (pg_stat_statements); zero: none.
	statements int
	// loadProfilePath is where one run's load profile goes; set by
	// runFleet when -load-profile is.
	loadProfilePath string
	// publish is what the three instances' MARCONI_PUBLIC_URL names:
	// publishBalancer, publishDirect or publishBoth (a run of each).
	publish string
	// direct makes one run's instances publish their own addresses; set
	// by runFleet.
	direct bool
	// hubEnv is what -hub-env adds to every hub's environment.
	hubEnv envFlag
}

// envFlag is a repeatable NAME=value flag.
type envFlag []string

func (e *envFlag) String() string { return strings.Join(*e, " ") }

// Set takes one NAME=value: NAME a non-empty word of letters, digits and
// underscores, not starting with a digit.
func (e *envFlag) Set(v string) error {
	name, _, ok := strings.Cut(v, "=")
	if !ok || name == "" || strings.IndexFunc(name, func(r rune) bool {
		return !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9')
	}) >= 0 || name[0] >= '0' && name[0] <= '9' {
		return fmt.Errorf("want NAME=value, got %q", v)
	}
	*e = append(*e, v)
	return nil
}

// What -public-url makes the instances behind the balancer publish.
const (
	publishBalancer = "balancer" // <balancer>/i/<id>: holder-routed sends cross it
	publishDirect   = "direct"   // http://<instance's own address>: they skip it
	publishBoth     = "both"     // a run of each, balancer then direct
)

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
	fs.IntVar(&o.procs, "gomaxprocs", 0, fmt.Sprintf("when set (1..%d), each round also runs the three instances with GOMAXPROCS set to it (on NATS with -bus-url); -marconi only", maxFleetProcs))
	fs.StringVar(&o.altConfig, "alt-haproxy-config", "", "another balancer configuration: each round also runs the three instances behind it (on NATS with -bus-url); -marconi only")
	fs.StringVar(&o.profileDir, "profile", "", "a directory to write every hub's CPU profile of every run into (MARCONI_PPROF=on; one file per hub and run, and runs.tsv with each run's sends)")
	fs.IntVar(&o.statements, "statements", 0, fmt.Sprintf("when set (1..%d), each run lists that many of the database's statements that took the most time, per send (pg_stat_statements: the server must preload it; its statistics are reset at each run's start)", maxFleetStatements))
	fs.StringVar(&o.loadProfile, "load-profile", "", loadProfileUsage)
	fs.DurationVar(&o.ackInterval, "ack-interval", 0, ackIntervalUsage)
	fs.IntVar(&o.projects, "projects", 1, fmt.Sprintf("how many projects the senders and recipients are spread over (1..%d): sender i and its recipient in project i mod N; the balancer (deploy/haproxy.cfg) keeps each project on one instance", maxBenchProjects))
	fs.Var(&o.hubEnv, "hub-env", "NAME=value added to every hub's environment, after the tool's own (GOGC=400, GOMEMLIMIT=…, MARCONI_…); repeatable; -marconi and -before alike")
	fs.IntVar(&o.rounds, "rounds", 2, fmt.Sprintf("rounds of one run each, one instance then three (1..%d)", maxFleetRounds))
	fs.StringVar(&o.publish, "public-url", publishBalancer, "what each of the three instances publishes as MARCONI_PUBLIC_URL (the send answers' recipient_instance_url): balancer (<balancer>/i/<id>, so holder-routed sends cross the balancer), direct (the instance's own address: they skip it) or both (each three-instance run twice, balancer then direct)")
	instances := fs.String("instances", fmt.Sprintf("1,%d", fleetInstances), fmt.Sprintf("the fleet sizes each round runs: 1, %d or 1,%d (1 alone for a quick before/after of one instance)", fleetInstances, fleetInstances))
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if err := loopbackPostgres("-database-url", o.databaseURL); err != nil {
		return o, err
	}
	switch {
	case *senders < 1 || *senders > maxDurableSenders:
		return o, fmt.Errorf("-senders %d: want 1..%d", *senders, maxDurableSenders)
	case o.step <= 0 || o.step > maxDurableStep:
		return o, fmt.Errorf("-duration %s: want more than 0 and at most %s", o.step, maxDurableStep)
	case o.payload < 2 || o.payload > maxDurablePayload:
		return o, fmt.Errorf("-payload %d: want 2..%d", o.payload, maxDurablePayload)
	case o.rounds < 1 || o.rounds > maxFleetRounds:
		return o, fmt.Errorf("-rounds %d: want 1..%d", o.rounds, maxFleetRounds)
	case o.procs < 0 || o.procs > maxFleetProcs:
		return o, fmt.Errorf("-gomaxprocs %d: want 1..%d, or 0 for none", o.procs, maxFleetProcs)
	case o.projects < 1 || o.projects > maxBenchProjects:
		return o, fmt.Errorf("-projects %d: want 1..%d", o.projects, maxBenchProjects)
	case o.statements < 0 || o.statements > maxFleetStatements:
		return o, fmt.Errorf("-statements %d: want 1..%d, or 0 for none", o.statements, maxFleetStatements)
	case o.profileDir != "" && o.step < time.Second:
		return o, fmt.Errorf("-profile: a CPU profile needs -duration of at least 1s")
	}
	if err := checkLoadProfile(o.loadProfile); err != nil {
		return o, err
	}
	if err := checkAckInterval(o.ackInterval); err != nil {
		return o, err
	}
	o.env = slices.Clip(append(o.env, o.hubEnv...))
	if o.altConfig != "" {
		if _, err := os.Stat(o.altConfig); err != nil {
			return o, fmt.Errorf("-alt-haproxy-config: %w", err)
		}
	}
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return o, fmt.Errorf("-profile: %w", err)
		}
	}
	if o.beforeDB == "" {
		o.beforeDB = o.databaseURL
	} else if err := loopbackPostgres("-before-database-url", o.beforeDB); err != nil {
		return o, err
	}
	if o.natsURL != "" {
		if u, err := url.Parse(o.natsURL); err != nil || u.Scheme != "nats" || !loopback(u.Hostname()) {
			return o, fmt.Errorf("-bus-url %q: want a nats:// URL on this machine (loopback)", o.natsURL)
		}
	}
	if _, err := os.Stat(o.config); err != nil {
		return o, fmt.Errorf("-haproxy-config: %w", err)
	}
	switch o.publish {
	case publishBalancer, publishDirect, publishBoth:
	default:
		return o, fmt.Errorf("-public-url %q: want %s, %s or %s", o.publish, publishBalancer, publishDirect, publishBoth)
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

// ackIntervalName says which ack interval d is.
func ackIntervalName(d time.Duration) string {
	if d == 0 {
		return "the client's default"
	}
	return d.String()
}

// fleetResult is one run's outcome.
type fleetResult struct {
	durableResult
	commitsPerSend float64
	cpuPerSend     time.Duration
	// pgPerSend is the Postgres server's CPU per send (all of it: other
	// databases' backends count too); loadPerSend this process's (the
	// load: senders and recipients).
	pgPerSend, loadPerSend time.Duration
	// idle is the share of the machine's CPU time left idle in the window:
	// near 0, the run was bound by the machine's cores, not by a lock or
	// a round trip.
	idle float64
	// busyPerSend is the machine's busy CPU time per send: every process.
	busyPerSend time.Duration
	// statements are the run's costliest statements (-statements).
	statements []statementCost
	// hubShares are each hub's share of the hubs' CPU time in the window,
	// in their order: how the balancer spread the load.
	hubShares []float64
	// hubP99 is the p99 of the time the window's sends spent in a hub
	// (marconi_send_duration_seconds: from validation to the answer, the
	// group commit included, HTTP not), from the hubs' histogram buckets.
	hubP99 time.Duration
}

func runFleet(ctx context.Context, o fleetOptions, out, logs io.Writer) error {
	n := o.senders[0]
	fmt.Fprintf(out, "fleet: %d senders, each to its own attached recipient (acking over its WebSocket), payload %d B, %s per run after a %s warm-up, %d rounds\n",
		n, o.payload, o.step, durableWarmup, o.rounds)
	if o.projects > 1 {
		fmt.Fprintf(out, "senders and recipients spread over %d projects (sender i and its recipient in project i mod %d)\n", o.projects, o.projects)
	}
	if o.ackInterval > 0 || len(o.hubEnv) > 0 {
		fmt.Fprintf(out, "clients' ack interval %s; hubs' extra environment: %s\n", ackIntervalName(o.ackInterval), cmp.Or(o.hubEnv.String(), "none"))
	}
	fmt.Fprintf(out, "%-6s %-7s %-10s %-16s %10s %10s %10s %10s %14s %14s %13s %14s %6s %8s %10s\n", "round", "build", "instances", "bus", "sends/s", "p50", "p99", "hub_p99", "commits/send", "hub_cpu/send", "pg_cpu/send", "load_cpu/send", "idle", "failed", "acks/send")
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
				if c.altLB {
					run.config = o.altConfig
				}
				run.direct = c.direct
				if c.procs > 0 {
					run.env = append(run.env, fmt.Sprintf("GOMAXPROCS=%d", c.procs))
				}
				name := buildName(o, bin)
				tag := fmt.Sprintf("r%d-%s-%d-%s", round, name, c.instances, c.label())
				if o.profileDir != "" {
					run.env = append(run.env, "MARCONI_PPROF=on")
					run.profileTag = tag
				}
				if o.loadProfile != "" {
					if fleetRuns(o) == 1 {
						tag = "" // one run: the file itself
					}
					run.loadProfilePath = loadProfilePath(o.loadProfile, tag)
				}
				r, err := fleetRun(ctx, run, c.instances, logs)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "%-6d %-7s %-10d %-16s %10.0f %10s %10s %10s %14.2f %14s %13s %14s %5.0f%% %8d %10.2f\n", round, name, c.instances, c.label(), r.perSec,
					r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond), r.hubP99.Round(10*time.Microsecond), r.commitsPerSend, r.cpuPerSend.Round(time.Microsecond),
					r.pgPerSend.Round(time.Microsecond), r.loadPerSend.Round(time.Microsecond), 100*r.idle, r.failed, r.acksPerSend())
				if c.instances > 1 {
					fmt.Fprintf(out, "       holder-routed (to recipient_instance_url): %d sends, warm-up included; %d found it unreachable; hub CPU shares %s\n", r.holderSends, r.holderFallbacks, formatShares(r.hubShares))
				}
				printStatements(out, r)
				if run.loadProfilePath != "" {
					fmt.Fprintf(out, "       load profile: %s (%d sends)\n", run.loadProfilePath, r.sends)
				}
				key := fmt.Sprintf("%s/%d/%s", name, c.instances, c.label())
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
			fmt.Fprintln(out, fleetRatios(fmt.Sprintf("%s: three instances on %s / one", name, c.label()), o.rounds,
				meanFleet(results[fmt.Sprintf("%s/%d/%s", name, c.instances, c.label())]), one))
		}
		for _, p := range fleetConfigs(o, bin) {
			if bin != o.marconi || (p.procs == 0 && !p.altLB) {
				continue
			}
			d := fleetConfig{instances: fleetInstances, bus: p.bus, direct: p.direct}
			fmt.Fprintln(out, fleetRatios(fmt.Sprintf("%s: three instances on %s / on %s (three each)", name, p.label(), d.label()), o.rounds,
				meanFleet(results[fmt.Sprintf("%s/%d/%s", name, fleetInstances, p.label())]),
				meanFleet(results[fmt.Sprintf("%s/%d/%s", name, fleetInstances, d.label())])))
		}
		for _, d := range fleetConfigs(o, bin) {
			if !d.direct || o.publish != publishBoth {
				continue
			}
			b := d
			b.direct = false
			fmt.Fprintln(out, fleetRatios(fmt.Sprintf("%s: three instances on %s / on %s", name, d.label(), b.label()), o.rounds,
				meanFleet(results[fmt.Sprintf("%s/%d/%s", name, fleetInstances, d.label())]),
				meanFleet(results[fmt.Sprintf("%s/%d/%s", name, fleetInstances, b.label())])))
		}
		if bin == o.marconi && o.natsURL != "" && withThree {
			for _, direct := range fleetPublishes(o) {
				nats, notify := fleetConfig{bus: busNATS, direct: direct}, fleetConfig{bus: busNOTIFY, direct: direct}
				fmt.Fprintln(out, fleetRatios(fmt.Sprintf("%s: three instances on %s / three on %s", name, nats.label(), notify.label()), o.rounds,
					meanFleet(results[fmt.Sprintf("%s/%d/%s", name, fleetInstances, nats.label())]),
					meanFleet(results[fmt.Sprintf("%s/%d/%s", name, fleetInstances, notify.label())])))
			}
		}
	}
	if o.before != "" {
		for _, c := range fleetConfigs(o, o.before) { // the runs both builds made
			key := fmt.Sprintf("/%d/%s", c.instances, c.label())
			fmt.Fprintln(out, fleetRatios(fmt.Sprintf("%d instance(s) on %s: after / before", c.instances, c.label()), o.rounds,
				meanFleet(results["after"+key]), meanFleet(results["before"+key])))
		}
	}
	return nil
}

// fleetRuns is how many runs o makes in all.
func fleetRuns(o fleetOptions) int {
	n := len(fleetConfigs(o, o.marconi))
	if o.before != "" {
		n += len(fleetConfigs(o, o.before))
	}
	return n * o.rounds
}

// The wake-up buses a fleet run can use.
const (
	busNOTIFY = "NOTIFY" // Postgres LISTEN/NOTIFY, the default
	busNATS   = "NATS"   // MARCONI_BUS_URL
)

// fleetConfig is one run of a round: how many instances, on which bus,
// with which GOMAXPROCS (zero: Go's default, the machine's cores).
type fleetConfig struct {
	instances int
	bus       string
	procs     int
	altLB     bool // behind -alt-haproxy-config
	// direct: the instances publish their own addresses, not their
	// balancer paths (-public-url).
	direct bool
}

// label names c's bus, and its GOMAXPROCS when set, in rows and files.
func (c fleetConfig) label() string {
	l := c.bus
	if c.procs > 0 {
		l += fmt.Sprintf("-P%d", c.procs)
	}
	if c.altLB {
		l += "-altLB"
	}
	if c.direct {
		l += "-direct"
	}
	return l
}

// fleetPublishes are the values of fleetConfig.direct that -public-url
// asks three-instance runs to be made with, in a round's order.
func fleetPublishes(o fleetOptions) []bool {
	switch o.publish {
	case publishDirect:
		return []bool{true}
	case publishBoth:
		return []bool{false, true}
	}
	return []bool{false}
}

// fleetExtraConfig is an extra three-instance run (-gomaxprocs,
// -alt-haproxy-config): on NATS with -bus-url, else on NOTIFY.
func fleetExtraConfig(o fleetOptions, procs int, altLB bool) fleetConfig {
	c := fleetConfig{instances: fleetInstances, bus: busNOTIFY, procs: procs, altLB: altLB}
	if o.natsURL != "" {
		c.bus = busNATS
	}
	return c
}

// fleetConfigs are the runs of a round for bin: one instance, then three
// on NOTIFY, then (for -marconi with -bus-url) three on NATS, less the
// sizes -instances leaves out. One instance wakes nobody, so it has no NATS
// run; it has no balancer either, so -public-url leaves it alone. Each
// three-instance run is made with each of fleetPublishes, one after the
// other.
func fleetConfigs(o fleetOptions, bin string) []fleetConfig {
	var cs []fleetConfig
	if slices.Contains(o.instances, 1) {
		cs = append(cs, fleetConfig{instances: 1, bus: busNOTIFY})
	}
	if !slices.Contains(o.instances, fleetInstances) {
		return cs
	}
	for _, c := range fleetThreeConfigs(o, bin) {
		for _, direct := range fleetPublishes(o) {
			c.direct = direct
			cs = append(cs, c)
		}
	}
	return cs
}

// fleetThreeConfigs are the three-instance runs of a round for bin, each
// as the balancer's paths name the instances: three on NOTIFY, then (for
// -marconi) three on NATS with -bus-url, and the -gomaxprocs and
// -alt-haproxy-config runs.
func fleetThreeConfigs(o fleetOptions, bin string) []fleetConfig {
	cs := []fleetConfig{{instances: fleetInstances, bus: busNOTIFY}}
	if o.natsURL != "" && bin == o.marconi {
		cs = append(cs, fleetConfig{instances: fleetInstances, bus: busNATS})
	}
	if o.procs > 0 && bin == o.marconi {
		cs = append(cs, fleetExtraConfig(o, o.procs, false))
	}
	if o.altConfig != "" && bin == o.marconi {
		cs = append(cs, fleetExtraConfig(o, 0, true))
		if o.procs > 0 {
			cs = append(cs, fleetExtraConfig(o, o.procs, true))
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
	machine := "machine CPU per send not read"
	if a.busyPerSend > 0 {
		machine = fmt.Sprintf("machine CPU per send %.2fx", float64(b.busyPerSend)/float64(a.busyPerSend))
	}
	return fmt.Sprintf("%s (means of %d rounds): sends/s %.2fx, p99 %.2fx, commits per send %.2fx, hub CPU per send %.2fx, %s",
		what, rounds, b.perSec/a.perSec, float64(b.p99)/float64(a.p99), b.commitsPerSend/a.commitsPerSend, float64(b.cpuPerSend)/float64(a.cpuPerSend), machine)
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
		m.busyPerSend += r.busyPerSend / time.Duration(len(rs))
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
	// Behind the balancer, each instance's public URL is <balancer>/i/<id>
	// (deploy/haproxy.cfg routes it there), as deploy/capacity.sh sets it:
	// the send answers' recipient_instance_url then reaches the instance.
	// Direct (-public-url), it is the instance's own address, startHub's
	// default.
	var lbAddr string
	if k > 1 {
		var err error
		if lbAddr, err = freeAddr(); err != nil {
			return fleetResult{}, err
		}
	}
	for i := 1; i <= k; i++ {
		id, public := fmt.Sprintf("hub-%d", i), ""
		if k > 1 {
			public = fleetPublicURL(lbAddr, id, o.direct)
		}
		h, err := startHub(ctx, o.durableOptions, id, "on", public, logs)
		if err != nil {
			return fleetResult{}, err
		}
		hubs = append(hubs, h)
	}
	target := hubs[0].url
	if k > 1 {
		lb, err := startHAProxy(ctx, o, lbAddr, hubs, logs)
		if err != nil {
			return fleetResult{}, err
		}
		defer lb.stop()
		target = lb.url
	}
	var before, after fleetSample
	var stmts []statementCost
	var stmtErr error
	if o.statements > 0 {
		if stmtErr = enableStatements(ctx, o.databaseURL); stmtErr != nil {
			return fleetResult{}, stmtErr
		}
	}
	profiles := make(chan error, len(hubs))
	marks := &stepMarks{
		start: func() {
			if o.statements > 0 {
				stmtErr = resetStatements(ctx, o.databaseURL)
			}
			before = sampleFleet(ctx, o.databaseURL, hubs)
			if o.profileTag != "" {
				for i, h := range hubs {
					path := filepath.Join(o.profileDir, fmt.Sprintf("%s-hub%d.pprof", o.profileTag, i+1))
					go func() { profiles <- fetchProfile(ctx, h.url, o.step, path) }()
				}
			}
		},
		end: func() {
			after = sampleFleet(ctx, o.databaseURL, hubs)
			if o.statements > 0 && stmtErr == nil {
				stmts, stmtErr = topStatements(ctx, o.databaseURL, o.statements)
			}
		},
	}
	marks, loadProfileDone := withLoadProfile(marks, o.loadProfilePath)
	r, err := durableStepMarked(ctx, o.durableOptions, target, target, o.senders[0], marks)
	if perr := loadProfileDone(); err == nil {
		err = perr
	}
	if o.profileTag != "" && before.started {
		// The fetches end within a second of the window (whole seconds).
		for range hubs {
			if perr := <-profiles; perr != nil && err == nil {
				err = perr
			}
		}
		if err == nil {
			err = appendRunsTSV(o.profileDir, o.profileTag, r.sends, after.cpu-before.cpu)
		}
	}
	if err == nil {
		err = stmtErr
	}
	if err != nil {
		return fleetResult{}, err
	}
	out := fleetResult{durableResult: r, statements: stmts}
	if r.sends > 0 {
		out.commitsPerSend = float64(after.commits-before.commits) / float64(r.sends)
		out.cpuPerSend = (after.cpu - before.cpu) / time.Duration(r.sends)
		out.pgPerSend = (after.pgCPU - before.pgCPU) / time.Duration(r.sends)
		out.loadPerSend = (after.selfCPU - before.selfCPU) / time.Duration(r.sends)
	}
	out.hubP99 = after.sends.since(before.sends).quantile(0.99)
	if total := after.cpu - before.cpu; total > 0 && len(after.hubCPU) == len(before.hubCPU) {
		for i := range after.hubCPU {
			out.hubShares = append(out.hubShares, float64(after.hubCPU[i]-before.hubCPU[i])/float64(total))
		}
	}
	if total := after.machine.total - before.machine.total; total > 0 {
		idle := after.machine.idle - before.machine.idle
		out.idle = float64(idle) / float64(total)
		if r.sends > 0 {
			const tick = time.Second / 100 // USER_HZ on Linux
			out.busyPerSend = time.Duration(total-idle) * tick / time.Duration(r.sends)
		}
	}
	return out, nil
}

// formatShares writes hub CPU shares as percentages, "hub-1 12%, …".
func formatShares(shares []float64) string {
	if len(shares) == 0 {
		return "not read"
	}
	parts := make([]string, len(shares))
	for i, f := range shares {
		parts[i] = fmt.Sprintf("hub-%d %.0f%%", i+1, 100*f)
	}
	return strings.Join(parts, ", ")
}

// fleetPublicURL is the MARCONI_PUBLIC_URL of instance id behind the
// balancer at lbAddr: its path on the balancer, or "" when direct (startHub
// then publishes the instance's own address).
func fleetPublicURL(lbAddr, id string, direct bool) string {
	if direct {
		return ""
	}
	return "http://" + lbAddr + "/i/" + id
}

// fleetSample is what a run's figures are deltas of: the database's
// committed transactions and the hubs' CPU time.
type fleetSample struct {
	commits int64
	cpu     time.Duration
	// hubCPU is each hub's CPU time, in the hubs' order (cpu is their sum).
	hubCPU []time.Duration
	// pgCPU is the Postgres server's CPU time, selfCPU this process's.
	pgCPU, selfCPU time.Duration
	machine        machineTicks
	// sends is the hubs' send-duration histogram, summed.
	sends   sendHistogram
	started bool // the sample was taken
}

// machineTicks are the machine's CPU time counters from /proc/stat, in
// ticks: all of it, and the idle part (idle and iowait).
type machineTicks struct{ total, idle int64 }

// readMachineTicks reads /proc/stat's first line (zero when it cannot).
func readMachineTicks() machineTicks {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineTicks{}
	}
	return parseMachineTicks(string(b))
}

// parseMachineTicks reads the machine's ticks from /proc/stat's text.
func parseMachineTicks(stat string) machineTicks {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return machineTicks{}
	}
	var t machineTicks
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i >= 8 { // guest time is already counted in user time
			break
		}
		t.total += n
		if i == 3 || i == 4 { // idle, iowait
			t.idle += n
		}
	}
	return t
}

// serverCPU is the CPU time of the Postgres server that runs backend (a
// backend's pid on this machine): its postmaster and every process the
// postmaster started (backends of every database, the WAL writer, the
// checkpointer). Another server on the machine is not counted; zero when
// /proc cannot say.
func serverCPU(backend int) time.Duration {
	postmaster := parentPID(backend)
	if postmaster <= 1 {
		return 0
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	sum := processCPU(postmaster)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && parentPID(pid) == postmaster {
			sum += processCPU(pid)
		}
	}
	return sum
}

// parentPID is pid's parent from /proc (zero when it cannot be read).
func parentPID(pid int) int {
	f := procStatFields(pid)
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// fetchProfile writes hub's CPU profile over the whole seconds of step to
// path.
func fetchProfile(ctx context.Context, hub string, step time.Duration, path string) error {
	secs := int(step / time.Second)
	pctx, cancel := context.WithTimeout(ctx, step+30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(pctx, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", hub, secs), nil)
	if err != nil {
		return fmt.Errorf("profile of %s: %w", hub, err)
	}
	req.Header.Set("Authorization", "Bearer "+benchAdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile of %s: %w", hub, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("profile of %s: %d %s", hub, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("profile of %s: %w", hub, err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return fmt.Errorf("profile of %s: %w", hub, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("profile of %s: %w", hub, err)
	}
	return nil
}

// appendRunsTSV records a profiled run's sends and hub CPU in dir/runs.tsv,
// what its profiles are divided by to read them per send.
func appendRunsTSV(dir, tag string, sends int64, cpu time.Duration) error {
	f, err := os.OpenFile(filepath.Join(dir, "runs.tsv"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("runs.tsv: %w", err)
	}
	_, err = fmt.Fprintf(f, "%s\t%d\t%d\n", tag, sends, cpu.Microseconds())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("runs.tsv: %w", err)
	}
	return nil
}

// sampleFleet reads the database's commit count and the hubs' CPU time;
// a figure it cannot read stays zero.
func sampleFleet(ctx context.Context, databaseURL string, hubs []*benchHub) fleetSample {
	s := fleetSample{started: true}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(cctx, databaseURL); err == nil {
		// Counters are flushed by each backend when it goes idle; clear
		// this backend's snapshot so the read is current.
		_, _ = conn.Exec(cctx, `SELECT pg_stat_clear_snapshot()`)
		_ = conn.QueryRow(cctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&s.commits)
		var backend int
		if conn.QueryRow(cctx, `SELECT pg_backend_pid()`).Scan(&backend) == nil {
			s.pgCPU = serverCPU(backend)
		}
		_ = conn.Close(cctx)
	}
	for _, h := range hubs {
		c := processCPU(h.cmd.Process.Pid)
		s.cpu += c
		s.hubCPU = append(s.hubCPU, c)
	}
	s.selfCPU = processCPU(os.Getpid())
	s.machine = readMachineTicks()
	for _, h := range hubs {
		s.sends = s.sends.add(readSendHistogram(ctx, h.url))
	}
	return s
}

// processCPU is pid's user and system CPU time from /proc (zero when it
// cannot be read).
func processCPU(pid int) time.Duration {
	f := procStatFields(pid)
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticksPerSecond
}

// procStatFields are the fields of /proc/PID/stat after the command (the
// state first); nil when it cannot be read.
func procStatFields(pid int) []string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil
	}
	// The command may hold spaces and parentheses: the fields after it
	// start after the last ") ".
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// balancer is a running HAProxy.
type balancer struct {
	url  string
	cmd  *exec.Cmd
	done chan struct{}
}

// startHAProxy runs haproxy on addr in front of hubs with o.config and
// waits until it forwards /readyz.
func startHAProxy(ctx context.Context, o fleetOptions, addr string, hubs []*benchHub, logs io.Writer) (*balancer, error) {
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
