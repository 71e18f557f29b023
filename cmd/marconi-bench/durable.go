package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
)

// The durable subcommand measures durable sends on Postgres: it starts hub
// processes of its own (the marconi binary given) on loopback ports against
// the database given, attaches pairs of agents, and has each sender send to
// its own attached recipient, closed loop (the next send after the answer),
// at 1, 8 and 64 concurrent senders; with group commit on and off, so that
// the gain is a ratio of one run; then with the recipients attached to a
// second instance, so that the wake-up (NOTIFY) path is paid. With -jetstream
// it measures Marconi beside NATS JetStream instead (jetstream.go).
// docs/benchmarks.md shows its numbers.

// Bounds of a durable run.
const (
	maxDurableSenders  = 256
	maxDurableStep     = time.Minute
	maxDurablePayload  = 65536
	durableWarmup      = time.Second
	hubStartTimeout    = 30 * time.Second
	durableAPIKey      = "mak_durable_bench_local_only"
	durableSendTimeout = 10 * time.Second
)

type durableOptions struct {
	marconi     string
	databaseURL string
	senders     []int
	step        time.Duration
	payload     int
	// jetstream is a nats-server binary: when set, durable measures Marconi
	// and JetStream in interleaved rounds instead of its own matrix.
	jetstream  string
	peerRounds int // rounds of that comparison
	// busURL is the NATS server the hubs wake each other through
	// (MARCONI_BUS_URL); empty: Postgres LISTEN/NOTIFY.
	busURL string
	// env is more of the hubs' environment (NAME=value), after the
	// defaults: fleet's GOMAXPROCS and MARCONI_PPROF.
	env []string
	// loadProfile is the file this process's CPU profile of each measured
	// window goes to (loadProfilePath); empty: none.
	loadProfile string
	// ackInterval is the load's clients' Config.AckInterval; zero: the
	// client's default.
	ackInterval time.Duration
	// projects is how many projects the load's sessions are spread over
	// (fleet's -projects): sender i and its recipient in project i mod
	// projects; zero or one: one project.
	projects int
}

// maxBenchProjects bounds -projects.
const maxBenchProjects = 64

// benchProjectKey is the API key of the load's project p (from 0): the
// first is durableAPIKey, for project bench/durable, as before there were
// several.
func benchProjectKey(p int) string {
	if p == 0 {
		return durableAPIKey
	}
	return fmt.Sprintf("%s_p%d", durableAPIKey, p+1)
}

// benchAPIKeys is the hubs' MARCONI_API_KEYS for n projects: bench/durable,
// then bench/durable-2 .. bench/durable-n.
func benchAPIKeys(n int) string {
	keys := []string{durableAPIKey + "=bench/durable"}
	for p := 1; p < n; p++ {
		keys = append(keys, fmt.Sprintf("%s=bench/durable-%d", benchProjectKey(p), p+1))
	}
	return strings.Join(keys, ",")
}

func parseDurableOptions(args []string, stderr io.Writer) (durableOptions, error) {
	var o durableOptions
	fs := flag.NewFlagSet("marconi-bench durable", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.marconi, "marconi", "marconi", "the marconi binary to start the hubs with")
	fs.StringVar(&o.databaseURL, "database-url", "", "Postgres URL (loopback only) the hubs use; it is migrated")
	senders := fs.String("senders", "1,8,64", fmt.Sprintf("comma list of concurrent senders per step (each 1..%d)", maxDurableSenders))
	fs.DurationVar(&o.step, "duration", 5*time.Second, fmt.Sprintf("how long each step sends, after a %s warm-up (at most %s)", durableWarmup, maxDurableStep))
	fs.IntVar(&o.payload, "payload", 60, "payload bytes of each signal")
	fs.StringVar(&o.jetstream, "jetstream", "", "a nats-server binary ("+jetstreamVersion+"): measure its JetStream beside Marconi, rounds interleaved, instead of the group commit and second-instance matrix")
	fs.IntVar(&o.peerRounds, "rounds", 2, fmt.Sprintf("with -jetstream: rounds of one Marconi run then one JetStream run per senders count (1..%d)", maxPeerRounds))
	fs.StringVar(&o.loadProfile, "load-profile", "", loadProfileUsage)
	fs.DurationVar(&o.ackInterval, "ack-interval", 0, ackIntervalUsage)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if err := checkLoadProfile(o.loadProfile); err != nil {
		return o, err
	}
	if err := checkAckInterval(o.ackInterval); err != nil {
		return o, err
	}
	if o.loadProfile != "" && o.jetstream != "" {
		return o, fmt.Errorf("-load-profile: not with -jetstream (its publishers share the process)")
	}
	if err := loopbackPostgres("-database-url", o.databaseURL); err != nil {
		return o, err
	}
	for _, f := range strings.Split(*senders, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > maxDurableSenders {
			return o, fmt.Errorf("-senders %q: want a comma list of 1..%d", *senders, maxDurableSenders)
		}
		o.senders = append(o.senders, n)
	}
	switch {
	case o.step <= 0 || o.step > maxDurableStep:
		return o, fmt.Errorf("-duration %s: want more than 0 and at most %s", o.step, maxDurableStep)
	case o.payload < 2 || o.payload > maxDurablePayload:
		return o, fmt.Errorf("-payload %d: want 2..%d", o.payload, maxDurablePayload)
	case o.peerRounds < 1 || o.peerRounds > maxPeerRounds:
		return o, fmt.Errorf("-rounds %d: want 1..%d", o.peerRounds, maxPeerRounds)
	}
	if o.jetstream != "" {
		if err := checkNATSServer(o.jetstream); err != nil {
			return o, err
		}
	}
	return o, nil
}

// durableCmd is the durable subcommand.
func durableCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseDurableOptions(args, stderr)
	if err != nil {
		return err
	}
	return durable(ctx, o, stdout, stderr)
}

// durableResult is one step's outcome.
type durableResult struct {
	sends    int64
	failed   int64
	perSec   float64
	p50, p99 time.Duration
	// loadProfile is the file the step's load profile went to; "" for
	// none.
	loadProfile string
	// holderSends are the senders' sends that went straight to the
	// recipient's instance (recipient_instance_url), warm-up included;
	// holderFallbacks those that found it unreachable.
	holderSends, holderFallbacks int
	// acks are the acknowledgements the recipients sent in the measured
	// window (their clients' Stats.Acks).
	acks int64
}

// ackIntervalUsage is the -ack-interval flag's usage.
const ackIntervalUsage = "the load's clients' AckInterval, the least time between two of a recipient's acks (0: the client's default)"

// maxAckInterval bounds -ack-interval.
const maxAckInterval = time.Minute

// checkAckInterval checks -ack-interval's value.
func checkAckInterval(d time.Duration) error {
	if d < 0 || d > maxAckInterval {
		return fmt.Errorf("-ack-interval %s: want 0 (the client's default) to %s", d, maxAckInterval)
	}
	return nil
}

// acksPerSend is r's acknowledgements per send (0 when it made none).
func (r durableResult) acksPerSend() float64 {
	if r.sends == 0 {
		return 0
	}
	return float64(r.acks) / float64(r.sends)
}

// sumAcks is the acknowledgements cs have sent so far.
func sumAcks(cs []*bootstrap.Client) int64 {
	var n int64
	for _, c := range cs {
		n += int64(c.Stats().Acks)
	}
	return n
}

func durable(ctx context.Context, o durableOptions, out, logs io.Writer) error {
	if o.jetstream != "" {
		return durableBesideJetStream(ctx, o, out, logs)
	}
	fmt.Fprintf(out, "durable sends: payload %d B, %s per step after a %s warm-up, closed loop, each sender to its own attached recipient\n",
		o.payload, o.step, durableWarmup)
	fmt.Fprintf(out, "%-12s %-10s %8s %10s %10s %10s %8s %10s\n", "group_commit", "recipients", "senders", "sends/s", "p50", "p99", "failed", "acks/send")
	results := map[string]durableResult{}
	row := func(gc, where string, n int, r durableResult) {
		results[fmt.Sprintf("%s/%s/%d", gc, where, n)] = r
		fmt.Fprintf(out, "%-12s %-10s %8d %10.0f %10s %10s %8d %10.2f\n", gc, where, n, r.perSec,
			r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond), r.failed, r.acksPerSend())
		if r.loadProfile != "" {
			fmt.Fprintf(out, "             load profile: %s (%d sends)\n", r.loadProfile, r.sends)
		}
	}
	for _, gc := range []string{"on", "off"} {
		a, err := startHub(ctx, o, "bench-a-"+gc, gc, "", logs)
		if err != nil {
			return err
		}
		for _, n := range o.senders {
			r, err := durableStepProfiled(ctx, o, a.url, a.url, n, fmt.Sprintf("gc%s-local-%d", gc, n))
			if err != nil {
				a.stop()
				return err
			}
			row(gc, "local", n, r)
		}
		a.stop()
	}
	a, err := startHub(ctx, o, "bench-a-x", "on", "", logs)
	if err != nil {
		return err
	}
	defer a.stop()
	b, err := startHub(ctx, o, "bench-b-x", "on", "", logs)
	if err != nil {
		return err
	}
	defer b.stop()
	for _, n := range o.senders {
		r, err := durableStepProfiled(ctx, o, a.url, b.url, n, fmt.Sprintf("gcon-remote-%d", n))
		if err != nil {
			return err
		}
		row("on", "remote", n, r)
	}
	for _, n := range o.senders {
		on, off := results[fmt.Sprintf("on/local/%d", n)], results[fmt.Sprintf("off/local/%d", n)]
		if off.perSec > 0 {
			fmt.Fprintf(out, "group commit gain at %d senders: %.2fx throughput (on/off), p99 %s vs %s\n",
				n, on.perSec/off.perSec, on.p99.Round(10*time.Microsecond), off.p99.Round(10*time.Microsecond))
		}
		if l, r := on, results[fmt.Sprintf("on/remote/%d", n)]; r.perSec > 0 {
			fmt.Fprintf(out, "recipients on a second instance at %d senders: %.2fx the local throughput, p99 %s vs %s\n",
				n, r.perSec/l.perSec, r.p99.Round(10*time.Microsecond), l.p99.Round(10*time.Microsecond))
		}
	}
	return nil
}

// durableStep attaches n senders to senderHub and n recipients to
// recipientHub and measures closed-loop sends from each sender to its own
// recipient.
func durableStep(ctx context.Context, o durableOptions, senderHub, recipientHub string, n int) (durableResult, error) {
	return durableStepMarked(ctx, o, senderHub, recipientHub, n, nil)
}

// durableStepProfiled is durableStep that writes the load profile of its
// measured window (-load-profile, the file named with tag).
func durableStepProfiled(ctx context.Context, o durableOptions, senderHub, recipientHub string, n int, tag string) (durableResult, error) {
	if o.loadProfile == "" {
		return durableStep(ctx, o, senderHub, recipientHub, n)
	}
	path := loadProfilePath(o.loadProfile, tag)
	marks, done := withLoadProfile(nil, path)
	r, err := durableStepMarked(ctx, o, senderHub, recipientHub, n, marks)
	if perr := done(); err == nil {
		err = perr
	}
	r.loadProfile = path
	return r, err
}

// stepMarks are called when a step's measured window starts and ends.
type stepMarks struct{ start, end func() }

// durableStepMarked is durableStep that calls marks (when not nil) at the
// edges of the measured window.
func durableStepMarked(ctx context.Context, o durableOptions, senderHub, recipientHub string, n int, marks *stepMarks) (durableResult, error) {
	if err := settleDatabase(ctx, o.databaseURL); err != nil {
		return durableResult{}, err
	}
	var clients []*bootstrap.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	stamp := time.Now().UnixNano()
	// Senders on one hub and recipients on another measure the
	// cross-instance path: the senders do not follow the hub's hint to the
	// recipients' instance (recipient_instance_url), which would make the
	// step a local one.
	cross := senderHub != recipientHub
	projects := max(o.projects, 1)
	dial := func(hubURL, id string, project int) (*bootstrap.Client, error) {
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return bootstrap.Dial(dctx, bootstrap.Config{HubURL: hubURL, APIKey: benchProjectKey(project), Surface: "headless_cc",
			SessionID: id, OnSignal: func(bootstrap.Signal) {}, NoHolderRouting: cross, AckInterval: o.ackInterval})
	}
	senders := make([]*bootstrap.Client, n)
	recipients := make([]string, n)
	recipientClients := make([]*bootstrap.Client, n)
	var mu sync.Mutex
	g, _ := errgroup.WithContext(ctx)
	g.SetLimit(dialsInFlight)
	for i := range n {
		g.Go(func() error {
			r, err := dial(recipientHub, fmt.Sprintf("r-%d-%d", stamp, i), i%projects)
			if err != nil {
				return fmt.Errorf("attach recipient %d: %w", i, err)
			}
			s, err := dial(senderHub, fmt.Sprintf("s-%d-%d", stamp, i), i%projects)
			mu.Lock()
			clients = append(clients, r)
			if err == nil {
				clients = append(clients, s)
			}
			mu.Unlock()
			if err != nil {
				return fmt.Errorf("attach sender %d: %w", i, err)
			}
			senders[i], recipients[i], recipientClients[i] = s, r.SessionID(), r
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return durableResult{}, err
	}

	// The recipients' acks are counted over the measured window.
	var acks int64
	counted := &stepMarks{
		start: func() {
			acks = -sumAcks(recipientClients)
			if marks != nil {
				marks.start()
			}
		},
		end: func() {
			if marks != nil {
				marks.end()
			}
			acks += sumAcks(recipientClients)
		},
	}
	body := strings.Repeat("x", o.payload-2) // a JSON string of o.payload bytes
	r, err := closedLoop(ctx, o, n, counted, func(ctx context.Context, i int) error {
		_, err := senders[i].Send(ctx, recipients[i], "bench", body)
		return err
	})
	r.acks = acks
	for _, s := range senders {
		st := s.Stats()
		r.holderSends += st.HolderSends
		r.holderFallbacks += st.HolderFallbacks
	}
	return r, err
}

// settledTables are the tables a step writes, found by the URL's
// search_path like the hubs' own statements; those an older build's schema
// lacks (project_leases before migration 0015) are left out.
var settledTables = []string{"sessions", "signals", "project_usage", "project_usage_deltas", "project_leases", "instances"}

// settleDatabase vacuums the hubs' tables and checkpoints the server, so
// that every step starts from the same state: neither the dead rows of the
// steps before it (which a Postgres with autovacuum, as in production,
// would have cleaned) nor their dirty buffers (which this step's
// backends would otherwise write out themselves before they could read)
// weigh on it, as a fleet's second run (three instances) would otherwise
// pay for its first (one instance). (The quarter of the sends/s first seen
// in such runs came mostly from plans, since fixed: docs/benchmarks-history.md,
// "Issue 18, third session".)
func settleDatabase(ctx context.Context, databaseURL string) error {
	err := withConn(ctx, databaseURL, func(ctx context.Context, conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, `SELECT t FROM unnest($1::text[]) AS t WHERE to_regclass(t) IS NOT NULL`, settledTables)
		if err != nil {
			return fmt.Errorf("find the tables to vacuum: %w", err)
		}
		tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("find the tables to vacuum: %w", err)
		}
		if _, err := conn.Exec(ctx, `VACUUM `+strings.Join(tables, ", ")); err != nil {
			return fmt.Errorf("VACUUM: %w", err)
		}
		// CHECKPOINT also writes what other databases dirtied: it is the
		// server's buffers that a step would otherwise clean.
		if _, err := conn.Exec(ctx, `CHECKPOINT`); err != nil {
			return fmt.Errorf("CHECKPOINT (needs a superuser or the pg_checkpoint role): %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("settle the database before a step: %w", err)
	}
	return nil
}

// closedLoop runs n loops of send (the next call after the answer to the
// last), each for a warm-up and then o.step, and measures the calls made
// after the warm-up: their count per second and their latency. marks (when
// not nil) are called at the edges of the measured window. durable's
// Marconi sends and its JetStream publishes go through this one loop, so
// that both sides are timed alike.
func closedLoop(ctx context.Context, o durableOptions, n int, marks *stepMarks, send func(ctx context.Context, i int) error) (durableResult, error) {
	var (
		lat       recorder
		sent, bad atomic.Int64
		measuring atomic.Bool
		wg        sync.WaitGroup
	)
	lctx, cancel := context.WithTimeout(ctx, durableWarmup+o.step)
	defer cancel()
	for i := range n {
		wg.Go(func() {
			for lctx.Err() == nil {
				sctx, scancel := context.WithTimeout(lctx, durableSendTimeout)
				counted := measuring.Load()
				t0 := time.Now()
				err := send(sctx, i)
				d := time.Since(t0)
				scancel()
				switch {
				case !counted || lctx.Err() != nil:
				case err != nil:
					bad.Add(1)
				default:
					lat.add(d)
					sent.Add(1)
				}
			}
		})
	}
	warm := time.NewTimer(durableWarmup)
	select {
	case <-warm.C:
	case <-ctx.Done():
	}
	if marks != nil {
		marks.start()
	}
	measuring.Store(true)
	start := time.Now()
	wg.Wait()
	elapsed := time.Since(start)
	if marks != nil {
		marks.end()
	}
	if err := ctx.Err(); err != nil {
		return durableResult{}, err
	}
	r := durableResult{sends: sent.Load(), failed: bad.Load(), perSec: float64(sent.Load()) / elapsed.Seconds()}
	r.p50, r.p99 = lat.quantile(0.5), lat.quantile(0.99)
	return r, nil
}

// quantile is the q-quantile of the samples (0 when none).
func (r *recorder) quantile(q float64) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return percentile(r.samples, q)
}

// benchHub is a hub process started for the benchmark.
type benchHub struct {
	url  string
	cmd  *exec.Cmd
	done chan struct{}
}

// startHub starts marconi serve on a free loopback port with group commit
// gc, and waits until it is ready. public is its MARCONI_PUBLIC_URL; ""
// for its own address.
func startHub(ctx context.Context, o durableOptions, id, gc, public string, logs io.Writer) (*benchHub, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	if public == "" {
		public = "http://" + addr
	}
	cmd := exec.Command(o.marconi, "serve")
	cmd.Env = append(os.Environ(),
		"MARCONI_ADDR="+addr,
		"MARCONI_PUBLIC_URL="+public,
		"MARCONI_INSTANCE_ID="+id,
		"MARCONI_DATABASE_URL="+o.databaseURL,
		"MARCONI_API_KEYS="+benchAPIKeys(max(o.projects, 1)),
		"MARCONI_ADMIN_TOKEN="+benchAdminToken,
		"MARCONI_MODE=development",
		"MARCONI_SELFHEAL=off",
		"MARCONI_LOG_LEVEL=warn",
		"MARCONI_SEND_RATE_PER_SECOND=1000000",
		// A step registers two sessions per sender at once.
		"MARCONI_QUOTA_REGISTRATIONS_PER_SECOND=1000000",
		"MARCONI_GROUP_COMMIT="+gc,
		"MARCONI_BUS_URL="+o.busURL,
	)
	cmd.Env = append(cmd.Env, o.env...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", o.marconi, err)
	}
	h := &benchHub{url: "http://" + addr, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(h.done) }()
	deadline := time.Now().Add(hubStartTimeout)
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		err := httpJSON(rctx, http.MethodGet, h.url+"/readyz", nil, nil, nil)
		cancel()
		if err == nil {
			return h, nil
		}
		select {
		case <-h.done:
			return nil, fmt.Errorf("hub %s exited before it was ready", id)
		case <-ctx.Done():
			h.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			h.stop()
			return nil, fmt.Errorf("hub %s not ready within %s", id, hubStartTimeout)
		}
	}
}

// stop ends the hub gracefully (SIGTERM), then for good after a while.
func (h *benchHub) stop() {
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.done:
	case <-time.After(20 * time.Second):
		_ = h.cmd.Process.Kill()
		<-h.done
	}
}
