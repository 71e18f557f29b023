package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
)

const (
	// maxStormSessions bounds a storm run. Each session is one WebSocket,
	// a descriptor on each side; the clients' HTTP calls share one pool of
	// at most stormHTTPConns connections, so 10 000 sessions fit under this
	// machine's 20 000 descriptors per process.
	maxStormSessions = 10000
	// stormHTTPConns bounds the HTTP connections (registrations,
	// heartbeats, sends, drains) that all the storm's clients share.
	stormHTTPConns = 64
)

type stormOptions struct {
	marconi  string
	database string
	sessions int
	signals  int
	dbConns  int
	sweep    int
	hbeat    int
}

func parseStorm(args []string, stderr io.Writer) (stormOptions, error) {
	var o stormOptions
	fs := flag.NewFlagSet("marconi-bench storm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.marconi, "marconi", siblingBinary("marconi"), "path of the marconi binary to run as the hub")
	fs.StringVar(&o.database, "database", "", "Postgres URL of a database for the hub (loopback); required")
	fs.IntVar(&o.sessions, "sessions", 1000, fmt.Sprintf("sessions attached with the Go client (1..%d)", maxStormSessions))
	fs.IntVar(&o.signals, "signals", 1000, "signals sent just before the restart, and as many after it (1..100000)")
	fs.IntVar(&o.dbConns, "database-conns", 16, "the hub's MARCONI_DATABASE_MAX_CONNS (1..64)")
	fs.IntVar(&o.hbeat, "heartbeat-seconds", 0, "the hub's MARCONI_HEARTBEAT_INTERVAL_SECONDS (0: the hub's default); each heartbeat is a store write")
	fs.IntVar(&o.sweep, "sweep-seconds", 0, "the hub's MARCONI_PENDING_SWEEP_SECONDS (0: the hub's default); each sweep reads the store twice per attached session")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if err := loopbackPostgres("-database", o.database); err != nil {
		return o, err
	}
	switch {
	case o.sessions < 1 || o.sessions > maxStormSessions:
		return o, fmt.Errorf("-sessions %d: want 1..%d", o.sessions, maxStormSessions)
	case o.signals < 1 || o.signals > 100000:
		return o, fmt.Errorf("-signals %d: want 1..100000", o.signals)
	case o.dbConns < 1 || o.dbConns > 64:
		return o, fmt.Errorf("-database-conns %d: want 1..64", o.dbConns)
	case o.sweep < 0 || o.sweep > 3600:
		return o, fmt.Errorf("-sweep-seconds %d: want 0..3600", o.sweep)
	case o.hbeat < 0 || o.hbeat > 3600:
		return o, fmt.Errorf("-heartbeat-seconds %d: want 0..3600", o.hbeat)
	}
	return o, nil
}

// storm is `marconi-bench storm`: the reconnect storm of issue 10. It runs
// the hub on Postgres, attaches -sessions sessions with the Go client,
// sends -signals signals (each answered 200, so durable), restarts the hub
// at once (SIGTERM: every WebSocket closes with 1012), and measures how long
// the clients take, with their own backoff, to be all attached again; then
// it sends as many signals again and checks that every one of them reached
// its recipient.
func storm(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseStorm(args, stderr)
	if err != nil {
		return err
	}
	raiseFileLimit()
	dir, err := os.MkdirTemp("", "marconi-storm-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	hubURL := "http://" + addr
	env := []string{
		"MARCONI_ADDR=" + addr, "MARCONI_DATABASE_URL=" + o.database, "MARCONI_INSTANCE_ID=storm",
		"MARCONI_API_KEYS=" + benchKey + "=t1/p1", "MARCONI_LOG_LEVEL=error", "MARCONI_ADMIN_TOKEN=bench-admin-token-local-only",
		"MARCONI_SEND_RATE_PER_SECOND=1000000", "MARCONI_MAX_CONNECTIONS_PER_ADDRESS=1000000",
		"MARCONI_QUOTA_SESSIONS_PER_PROJECT=1000000", "MARCONI_QUOTA_REGISTRATIONS_PER_SECOND=1000000",
		// Registrations run compareDials at a time; a pool as large as
		// that keeps them from timing out waiting for a connection.
		"MARCONI_DATABASE_MAX_CONNS=" + strconv.Itoa(o.dbConns),
	}
	if o.sweep > 0 {
		env = append(env, "MARCONI_PENDING_SWEEP_SECONDS="+strconv.Itoa(o.sweep))
	}
	if o.hbeat > 0 {
		env = append(env, "MARCONI_HEARTBEAT_INTERVAL_SECONDS="+strconv.Itoa(o.hbeat))
	}
	ready := func(ctx context.Context) error { return httpJSON(ctx, "GET", hubURL+"/readyz", nil, nil, nil) }
	hub, err := startProcess(ctx, dir, "marconi", o.marconi, []string{"serve"}, env, ready)
	if err != nil {
		return err
	}
	defer func() {
		if hub != nil {
			_ = hub.Process.Signal(syscall.SIGTERM)
			_ = hub.Wait()
		}
	}()

	var (
		mu       sync.Mutex
		received = map[string]bool{}
	)
	onSignal := func(s bootstrap.Signal) {
		mu.Lock()
		received[string(s.Payload)] = true
		mu.Unlock()
	}
	run := time.Now().UnixNano()
	// A client that gives up (the hub refused it for good) says why.
	clientLog := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	// One bounded pool for every client's HTTP calls: a client of its own
	// transport keeps an idle connection beside its WebSocket.
	tr := &http.Transport{MaxIdleConnsPerHost: stormHTTPConns, MaxConnsPerHost: stormHTTPConns}
	hc := &http.Client{Transport: tr}
	clients := make([]*bootstrap.Client, o.sessions+1)
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
		tr.CloseIdleConnections()
	}()
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(compareDials)
	var attached, retried atomic.Int64
	for i := range clients {
		g.Go(func() error {
			// Each attempt is bounded on its own, so that one request lost
			// under load costs an attempt, not the session.
			dctx, cancel := context.WithTimeout(gctx, 3*time.Minute)
			defer cancel()
			for {
				actx, acancel := context.WithTimeout(dctx, 30*time.Second)
				c, err := bootstrap.Dial(actx, bootstrap.Config{
					HubURL: hubURL, APIKey: benchKey, Surface: "claude_code",
					SessionID: fmt.Sprintf("storm-%d-%d", run, i), OnSignal: onSignal, Logger: clientLog,
					HTTPClient: hc,
				})
				acancel()
				if err == nil || dctx.Err() != nil {
					clients[i] = c
					if n := attached.Add(1); err == nil && n%1000 == 0 {
						fmt.Fprintf(stderr, "%d sessions attached after %s\n", n, time.Since(start).Round(time.Millisecond))
					}
					return err
				}
				if n := retried.Add(1); n <= 5 {
					fmt.Fprintf(stderr, "attach of session %d failed, made again: %v\n", i, err)
				}
				sleepCtx(dctx, 100*time.Millisecond) // a store timeout under load: register again
			}
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("attach: %w", err)
	}
	n := float64(len(clients))
	if err := waitConnections(ctx, hubURL, n, time.Minute); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d sessions attached with the Go client in %s (%d failed attempts made again)\n", len(clients), time.Since(start).Round(time.Millisecond), retried.Load())

	sender, recipients := clients[0], clients[1:]
	sent := make([]string, 0, 2*o.signals)
	refused := 0
	sendAll := func(phase string) error {
		for i := range o.signals {
			p := fmt.Sprintf(`"%s-%d-%d"`, phase, run, i)
			to := recipients[rand.IntN(len(recipients))].SessionID()
			// A send the hub refuses (a store timeout under the storm's
			// load answers 503) is made again with the same idempotency
			// key, as an application would; it is stored once.
			for attempt := 1; ; attempt++ {
				_, err := sender.Send(ctx, to, "storm", json.RawMessage(p), bootstrap.WithIdempotencyKey(p))
				if err == nil {
					break
				}
				if attempt == 10 || ctx.Err() != nil {
					return fmt.Errorf("send %s: %w", p, err)
				}
				refused++
				sleepCtx(ctx, time.Duration(attempt)*100*time.Millisecond)
			}
			sent = append(sent, p)
		}
		return nil
	}
	if err := sendAll("before"); err != nil {
		return err
	}

	// The restart: every WebSocket is dropped at once.
	down := time.Now()
	_ = hub.Process.Signal(syscall.SIGTERM)
	_ = hub.Wait()
	hub = nil
	restarted := time.Now()
	if hub, err = startProcess(ctx, dir, "marconi-restarted", o.marconi, []string{"serve"}, env, ready); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	up := time.Now()
	back, all, marks := reattached(ctx, hubURL, n, time.Minute)
	fmt.Fprintf(stdout, "hub stopped in %s, restarted (ready) in %s; %v of %d sessions attached again %s after it was ready (%s after the drop)\n",
		restarted.Sub(down).Round(time.Millisecond), up.Sub(restarted).Round(time.Millisecond), back, len(clients),
		all.Sub(up).Round(time.Millisecond), all.Sub(down).Round(time.Millisecond))
	for i, f := range reattachMarks {
		if !marks[i].IsZero() {
			fmt.Fprintf(stdout, "  %g %% attached again %s after ready\n", 100*f, marks[i].Sub(up).Round(time.Millisecond))
		}
	}

	if err := sendAll("after"); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		mu.Lock()
		var missing []string
		for _, p := range sent {
			if !received[p] {
				missing = append(missing, p)
			}
		}
		mu.Unlock()
		if len(missing) == 0 {
			fmt.Fprintf(stdout, "%d signals sent (%d before the restart, %d after; %d refused sends made again), every one received: none lost\n", len(sent), o.signals, o.signals, refused)
			return nil
		}
		if time.Now().After(deadline) {
			// A client that gave up reconnecting (logged above) reads
			// nothing more: its signals stay durable in the hub.
			return fmt.Errorf("%d of %d signals never reached their client, e.g. %s", len(missing), len(sent), strings.Join(missing[:min(5, len(missing))], ", "))
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// reattachMarks are the shares of the sessions whose return reattached
// times, so that the tail (the clients' backoff) shows apart from the bulk
// (the hub's attach rate).
var reattachMarks = []float64{0.5, 0.9, 0.99}

// reattached polls the hub's marconi_ws_connections for up to within, until
// it is n, and returns the most it saw, when it first saw that many, and
// when it first saw each of reattachMarks's shares of n (zero if never).
func reattached(ctx context.Context, hubURL string, n float64, within time.Duration) (float64, time.Time, []time.Time) {
	deadline := time.Now().Add(within)
	var most float64
	var at time.Time
	marks := make([]time.Time, len(reattachMarks))
	for time.Now().Before(deadline) && most < n {
		if m, err := scrape(ctx, hubURL); err == nil && m["marconi_ws_connections"] > most {
			most, at = m["marconi_ws_connections"], time.Now()
			for i, f := range reattachMarks {
				if marks[i].IsZero() && most >= f*n {
					marks[i] = at
				}
			}
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
	return most, at, marks
}

// waitConnections polls the hub's marconi_ws_connections until it is n.
func waitConnections(ctx context.Context, hubURL string, n float64, within time.Duration) error {
	deadline := time.Now().Add(within)
	var last float64
	for time.Now().Before(deadline) {
		m, err := scrape(ctx, hubURL)
		if err == nil {
			if last = m["marconi_ws_connections"]; last == n {
				return nil
			}
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
	return fmt.Errorf("%v of %v sessions attached after %s", last, n, within)
}
