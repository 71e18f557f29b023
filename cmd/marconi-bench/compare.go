package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sync/errgroup"
)

// Bounds of a comparison run.
const (
	maxIdle      = 10000
	maxSends     = 10000
	maxRounds    = 10
	compareDials = 32
)

// compareOptions are the parameters of `marconi-bench compare`.
type compareOptions struct {
	marconi    string // path of the marconi binary
	centrifugo string // path of a centrifugo binary; empty: no Centrifugo column
	idle       int
	sends      int
	rounds     int
	settle     time.Duration
	// hubEnv is added to the marconi hub's environment (-hub-env).
	hubEnv envFlag
}

func parseCompare(args []string, stderr io.Writer) (compareOptions, error) {
	var o compareOptions
	fs := flag.NewFlagSet("marconi-bench compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.marconi, "marconi", siblingBinary("marconi"), "path of the marconi binary to run as the hub")
	fs.StringVar(&o.centrifugo, "centrifugo", "", "path of a centrifugo binary (v6) to compare with; empty: none")
	fs.IntVar(&o.idle, "idle", 3000, fmt.Sprintf("idle attached sessions per server (1..%d)", maxIdle))
	fs.IntVar(&o.sends, "sends", 3000, fmt.Sprintf("sequential sends per round and server (1..%d)", maxSends))
	fs.IntVar(&o.rounds, "rounds", 3, fmt.Sprintf("interleaved rounds (1..%d)", maxRounds))
	fs.Var(&o.hubEnv, "hub-env", "NAME=value added to the marconi hub's environment (GOGC=400, GOMEMLIMIT=…); repeatable")
	fs.DurationVar(&o.settle, "settle", 3*time.Second, "wait before each RSS reading, for the servers' allocations to settle")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.idle < 1 || o.idle > maxIdle:
		return o, fmt.Errorf("-idle %d: want 1..%d", o.idle, maxIdle)
	case o.sends < 1 || o.sends > maxSends:
		return o, fmt.Errorf("-sends %d: want 1..%d", o.sends, maxSends)
	case o.rounds < 1 || o.rounds > maxRounds:
		return o, fmt.Errorf("-rounds %d: want 1..%d", o.rounds, maxRounds)
	case o.settle < 0 || o.settle > time.Minute:
		return o, fmt.Errorf("-settle %s: want 0..1m", o.settle)
	}
	return o, nil
}

// siblingBinary is name beside this executable, when it is there, else name
// (looked up in PATH).
func siblingBinary(name string) string {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return name
}

// server is one side of the comparison, run as a process of its own.
type server interface {
	name() string
	start(ctx context.Context, dir string) (*exec.Cmd, error)
	// receiver attaches the connection that the sends reach; each push it
	// reads is reported on got.
	receiver(ctx context.Context, got chan time.Time) error
	// idle attaches one idle session (or subscription) numbered i.
	idle(ctx context.Context, i int) error
	// send makes one send (publish) to the receiver.
	send(ctx context.Context, i int) error
}

// result is what a run measured of one server.
type result struct {
	lat              []time.Duration
	rssBefore, rssAt int64 // bytes, before and after the idle sessions attached
	threadsAt        int
}

func compare(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseCompare(args, stderr)
	if err != nil {
		return err
	}
	raiseFileLimit()
	dir, err := os.MkdirTemp("", "marconi-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	servers := []server{&marconiServer{bin: o.marconi, env: o.hubEnv}}
	if o.centrifugo != "" {
		servers = append(servers, &centrifugoServer{bin: o.centrifugo})
	}
	servers = append(servers, &floorServer{bin: self})

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
			_ = p.Wait()
		}
	}()
	results := make([]*result, len(servers))
	got := make([]chan time.Time, len(servers))
	defer clients.close()
	for i, s := range servers {
		p, err := s.start(ctx, dir)
		if err != nil {
			return fmt.Errorf("start %s: %w", s.name(), err)
		}
		procs = append(procs, p)
		got[i] = make(chan time.Time, 16)
		if err := s.receiver(ctx, got[i]); err != nil {
			return fmt.Errorf("%s: attach the receiver: %w", s.name(), err)
		}
		// Warm up the send path before anything is measured.
		if _, err := sendRound(ctx, s, got[i], 200); err != nil {
			return fmt.Errorf("%s: warm-up: %w", s.name(), err)
		}
		r := &result{}
		results[i] = r
		sleepCtx(ctx, o.settle)
		r.rssBefore = rss(p.Process.Pid)
		fmt.Fprintf(stderr, "%s: attaching %d idle sessions\n", s.name(), o.idle)
		if err := attachIdle(ctx, s, o.idle); err != nil {
			return fmt.Errorf("%s: attach idle sessions: %w", s.name(), err)
		}
		sleepCtx(ctx, o.settle)
		r.rssAt = rss(p.Process.Pid)
		r.threadsAt = threads(p.Process.Pid)
	}
	for round := range o.rounds {
		for i, s := range servers {
			fmt.Fprintf(stderr, "round %d: %s\n", round+1, s.name())
			lat, err := sendRound(ctx, s, got[i], o.sends)
			if err != nil {
				return fmt.Errorf("%s: round %d: %w", s.name(), round+1, err)
			}
			results[i].lat = append(results[i].lat, lat...)
		}
	}
	printComparison(stdout, o, servers, results)
	return nil
}

// sendRound makes n sequential sends and returns each one's latency: from
// before the HTTP request to the push read on the receiver.
func sendRound(ctx context.Context, s server, got <-chan time.Time, n int) ([]time.Duration, error) {
	lat := make([]time.Duration, 0, n)
	for i := range n {
		start := time.Now()
		if err := s.send(ctx, i); err != nil {
			return nil, err
		}
		select {
		case at := <-got:
			lat = append(lat, at.Sub(start))
		case <-time.After(10 * time.Second):
			return nil, fmt.Errorf("send %d: no push within 10 s", i)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return lat, nil
}

func attachIdle(ctx context.Context, s server, n int) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(compareDials)
	for i := range n {
		g.Go(func() error { return s.idle(ctx, i) })
	}
	return g.Wait()
}

func printComparison(w io.Writer, o compareOptions, servers []server, results []*result) {
	fmt.Fprintf(w, "%d rounds of %d sequential sends per server, interleaved; %d idle attached sessions each\n", o.rounds, o.sends, o.idle)
	if len(o.hubEnv) > 0 {
		fmt.Fprintf(w, "marconi's extra environment: %s\n", o.hubEnv.String())
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "figure\t"
	for _, s := range servers {
		head += s.name() + "\t"
	}
	for _, s := range servers[1:] {
		head += "marconi/" + s.name() + "\t"
	}
	fmt.Fprintln(tw, head)
	row := func(name string, vals []float64, unit string) {
		line := name + "\t"
		for _, v := range vals {
			line += fmt.Sprintf("%.1f %s\t", v, unit)
		}
		for _, v := range vals[1:] {
			line += fmt.Sprintf("%.2f\t", vals[0]/v)
		}
		fmt.Fprintln(tw, line)
	}
	pct := func(q float64) []float64 {
		out := make([]float64, len(results))
		for i, r := range results {
			out[i] = float64(percentile(r.lat, q)) / float64(time.Microsecond)
		}
		return out
	}
	row("send → push p50", pct(0.50), "µs")
	row("send → push p99", pct(0.99), "µs")
	perIdle := make([]float64, len(results))
	for i, r := range results {
		perIdle[i] = float64(r.rssAt-r.rssBefore) / float64(o.idle) / 1024
	}
	row("RSS per idle session", perIdle, "KiB")
	thr := make([]float64, len(results))
	for i, r := range results {
		thr[i] = float64(r.rssAt) / (1 << 20)
	}
	row("RSS with all attached", thr, "MiB")
	_ = tw.Flush()
}

func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// rss is the resident set size of process pid, in bytes (0 when unknown).
func rss(pid int) int64 { return procStatus(pid, "VmRSS:") * 1024 }

// threads is the number of OS threads of process pid.
func threads(pid int) int { return int(procStatus(pid, "Threads:")) }

func procStatus(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			n, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return n
		}
	}
	return 0
}

// raiseFileLimit lifts the soft limit on open files to the hard one, for
// this process and the servers it starts (each idle session is a socket on
// both sides).
func raiseFileLimit() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil && l.Cur < l.Max {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// freeAddr is a loopback address with a port free right now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startProcess starts bin with args and env, its output in a log file of
// dir, and waits until ready answers nil.
func startProcess(ctx context.Context, dir, name, bin string, args, env []string, ready func(context.Context) error) (*exec.Cmd, error) {
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	logf.Close()
	deadline := time.Now().Add(2 * time.Minute) // migrations on a busy Postgres take a while
	for {
		err := ready(ctx)
		if err == nil {
			return cmd, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			out, _ := os.ReadFile(filepath.Join(dir, name+".log"))
			return nil, fmt.Errorf("not ready within 2 min (%v); its output:\n%s", err, out)
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
}

// httpJSON does one request with a JSON body and decodes a JSON answer into out.
func httpJSON(ctx context.Context, method, url string, hdr map[string]string, body, out any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := benchClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %d %s", method, url, resp.StatusCode, bytes.TrimSpace(data))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// benchClient keeps enough idle connections for the dialers in flight.
var benchClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * compareDials}}

// wsDial dials a WebSocket with a generous read limit.
func wsDial(ctx context.Context, url string, hdr http.Header) (*websocket.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(dctx, url, &websocket.DialOptions{HTTPHeader: hdr, HTTPClient: benchClient})
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(1 << 20)
	return c, nil
}

// clients is the client side of the run.
var clients fleet

// fleet is the client side of every connection of a run: each one's reader
// runs in g, and close ends them all and waits for the readers.
type fleet struct {
	g     errgroup.Group
	mu    sync.Mutex
	conns []*websocket.Conn
}

// add keeps c open until close, with read reading it.
func (f *fleet) add(c *websocket.Conn, read func() error) {
	f.mu.Lock()
	f.conns = append(f.conns, c)
	f.mu.Unlock()
	// A reader's end is seen by the round waiting on its pushes.
	f.g.Go(func() error { _ = read(); return nil })
}

func (f *fleet) close() {
	f.mu.Lock()
	for _, c := range f.conns {
		c.CloseNow()
	}
	f.mu.Unlock()
	_ = f.g.Wait()
}

// discard reads and drops c's frames (answering pings) until it ends.
func discard(ctx context.Context, c *websocket.Conn) func() error {
	return func() error {
		for {
			if _, _, err := c.Read(ctx); err != nil {
				return err
			}
		}
	}
}
