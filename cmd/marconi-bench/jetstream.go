package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// `marconi-bench durable -jetstream NATS_SERVER` measures Marconi's durable
// sends beside NATS JetStream, the peer a user would pick for durable
// messaging, in one run: a hub on Postgres and a nats-server of the
// benchmark's own (loopback, a store directory under a temporary directory,
// file storage with every acknowledged publish fsynced, as a Postgres commit
// is) take the same senders and duration in rounds that alternate the two.
// Marconi's senders each send to their own attached recipient, which acks
// over its WebSocket; JetStream's publishers each wait for the publish's ack,
// and one consumer acks every message. The client is nats.go, NATS's own.

// Bounds and fixed names of the JetStream comparison.
const (
	jetstreamVersion = "v2.15.2"
	maxPeerRounds    = 10
	jetstreamStream  = "MARCONI_BENCH"
	jetstreamSubject = "marconi.bench.durable"
)

// checkNATSServer says clearly when bin is not an executable file, before
// anything is started.
func checkNATSServer(bin string) error {
	if _, err := exec.LookPath(bin); err != nil {
		return fmt.Errorf("-jetstream %q: no nats-server binary there (%v); build one outside the repository: GOBIN=/tmp/ns go install github.com/nats-io/nats-server/v2@%s, then pass -jetstream /tmp/ns/nats-server",
			bin, err, jetstreamVersion)
	}
	return nil
}

// peerRun is one round's pair of results at one senders count.
type peerRun struct {
	marconi, jetstream durableResult
}

// peerSummary is the comparison's outcome at one senders count: the means of
// its rounds and Marconi's throughput as a multiple of JetStream's.
type peerSummary struct {
	marconi, jetstream durableResult
	ratio              float64 // Marconi's sends/s over JetStream's acked publishes/s; 0 when JetStream made none
}

// summarizePeers is the mean of each side over runs, and their ratio.
func summarizePeers(runs []peerRun) peerSummary {
	var ms, js []durableResult
	for _, r := range runs {
		ms, js = append(ms, r.marconi), append(js, r.jetstream)
	}
	s := peerSummary{marconi: meanDurable(ms), jetstream: meanDurable(js)}
	if s.jetstream.perSec > 0 {
		s.ratio = s.marconi.perSec / s.jetstream.perSec
	}
	return s
}

// meanDurable is the mean of rs: throughput and quantiles averaged, counts
// added up.
func meanDurable(rs []durableResult) durableResult {
	var m durableResult
	for _, r := range rs {
		m.sends += r.sends
		m.failed += r.failed
		m.perSec += r.perSec / float64(len(rs))
		m.p50 += r.p50 / time.Duration(len(rs))
		m.p99 += r.p99 / time.Duration(len(rs))
	}
	return m
}

// durableBesideJetStream is durable with -jetstream.
func durableBesideJetStream(ctx context.Context, o durableOptions, out, logs io.Writer) error {
	dir, err := os.MkdirTemp("", "marconi-bench-jetstream-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ns, err := startNATSServer(ctx, o.jetstream, dir, logs)
	if err != nil {
		return err
	}
	defer ns.stop()
	hub, err := startHub(ctx, o, "bench-peer", "on", "", logs)
	if err != nil {
		return err
	}
	defer hub.stop()

	fmt.Fprintf(out, "durable sends beside NATS JetStream (%s; file storage, sync_interval always): payload %d B, %s per run after a %s warm-up, closed loop, %d rounds\n",
		ns.version, o.payload, o.step, durableWarmup, o.peerRounds)
	fmt.Fprintln(out, "marconi: sends/s and send→answer, each sender to its own attached recipient acking over its WebSocket; jetstream: acked publishes/s and publish→ack, one consumer acking every message")
	fmt.Fprintf(out, "%-6s %-10s %8s %10s %10s %10s %8s\n", "round", "peer", "senders", "per_s", "p50", "p99", "failed")
	row := func(round int, peer string, n int, r durableResult) {
		fmt.Fprintf(out, "%-6d %-10s %8d %10.0f %10s %10s %8d\n", round, peer, n, r.perSec,
			r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond), r.failed)
	}
	runs := map[int][]peerRun{}
	for round := 1; round <= o.peerRounds; round++ {
		for _, n := range o.senders {
			var r peerRun
			if r.marconi, err = durableStep(ctx, o, hub.url, hub.url, n); err != nil {
				return fmt.Errorf("marconi, round %d, %d senders: %w", round, n, err)
			}
			row(round, "marconi", n, r.marconi)
			if r.jetstream, err = jetstreamStep(ctx, o, ns.url, n); err != nil {
				return fmt.Errorf("jetstream, round %d, %d senders: %w", round, n, err)
			}
			row(round, "jetstream", n, r.jetstream)
			runs[n] = append(runs[n], r)
		}
	}
	for _, n := range o.senders {
		s := summarizePeers(runs[n])
		fmt.Fprintf(out, "at %d senders, means of %d rounds: marconi %.0f sends/s (p50 %s, p99 %s), jetstream %.0f acked publishes/s (p50 %s, p99 %s): marconi/jetstream %.2fx\n",
			n, o.peerRounds, s.marconi.perSec, s.marconi.p50.Round(10*time.Microsecond), s.marconi.p99.Round(10*time.Microsecond),
			s.jetstream.perSec, s.jetstream.p50.Round(10*time.Microsecond), s.jetstream.p99.Round(10*time.Microsecond), s.ratio)
	}
	return nil
}

// natsServer is a nats-server process started for the benchmark.
type natsServer struct {
	url     string
	version string
	cmd     *exec.Cmd
	done    chan struct{}
}

// natsServerConfig is the server's whole configuration: client connections
// on loopback only, no monitoring port, JetStream storing under storeDir and
// fsyncing every write before it is acknowledged.
func natsServerConfig(addr, storeDir string) string {
	return fmt.Sprintf("listen: %q\njetstream {\n  store_dir: %q\n  sync_interval: always\n}\n", addr, storeDir)
}

// startNATSServer starts bin on a free loopback port with its store in dir,
// waits until JetStream answers, and creates the stream the publishers use.
func startNATSServer(ctx context.Context, bin, dir string, logs io.Writer) (*natsServer, error) {
	version, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --version: %w", bin, err)
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(conf, []byte(natsServerConfig(addr, filepath.Join(dir, "jetstream"))), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-c", conf)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s := &natsServer{url: "nats://" + addr, version: strings.TrimSpace(string(version)), cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	if err := s.createStream(ctx); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// createStream waits (up to hubStartTimeout) for the server to take a
// connection, then creates the benchmark's stream: file storage, one
// replica, on jetstreamSubject.
func (s *natsServer) createStream(ctx context.Context) error {
	deadline := time.Now().Add(hubStartTimeout)
	for {
		nc, err := nats.Connect(s.url, nats.Name("marconi-bench"), nats.Timeout(time.Second))
		if err == nil {
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			sctx, cancel := context.WithTimeout(ctx, hubStartTimeout)
			defer cancel()
			_, err = js.CreateStream(sctx, jetstream.StreamConfig{
				Name: jetstreamStream, Subjects: []string{jetstreamSubject},
				Storage: jetstream.FileStorage, Replicas: 1,
			})
			if err != nil {
				return fmt.Errorf("nats-server: create the stream: %w", err)
			}
			return nil
		}
		select {
		case <-s.done:
			return errors.New("nats-server exited before it took a connection (its log is above)")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats-server took no connection within %s: %w", hubStartTimeout, err)
		}
	}
}

// stop ends the server gracefully (SIGTERM), then for good after a while.
func (s *natsServer) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// jetstreamStep connects n publishers and one consumer to the server at url
// and measures closed-loop publishes, each waiting for its ack, while the
// consumer acks every message it is given.
func jetstreamStep(ctx context.Context, o durableOptions, url string, n int) (durableResult, error) {
	var conns []*nats.Conn
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	connect := func() (jetstream.JetStream, error) {
		nc, err := nats.Connect(url, nats.Name("marconi-bench"), nats.Timeout(10*time.Second))
		if err != nil {
			return nil, err
		}
		conns = append(conns, nc)
		return jetstream.New(nc)
	}
	cjs, err := connect()
	if err != nil {
		return durableResult{}, fmt.Errorf("connect the consumer: %w", err)
	}
	cons, err := cjs.CreateOrUpdateConsumer(ctx, jetstreamStream, jetstream.ConsumerConfig{
		Durable: fmt.Sprintf("bench-%d", time.Now().UnixNano()), DeliverPolicy: jetstream.DeliverNewPolicy,
		AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		return durableResult{}, fmt.Errorf("create the consumer: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = cjs.DeleteConsumer(dctx, jetstreamStream, cons.CachedInfo().Name)
	}()
	consuming, err := cons.Consume(func(m jetstream.Msg) { _ = m.Ack() })
	if err != nil {
		return durableResult{}, fmt.Errorf("consume: %w", err)
	}
	defer consuming.Stop()

	pubs := make([]jetstream.JetStream, n)
	for i := range pubs {
		if pubs[i], err = connect(); err != nil {
			return durableResult{}, fmt.Errorf("connect publisher %d: %w", i, err)
		}
	}
	body := []byte(`"` + strings.Repeat("x", o.payload-2) + `"`) // the same bytes as a Marconi payload
	return closedLoop(ctx, o, n, nil, func(ctx context.Context, i int) error {
		_, err := pubs[i].Publish(ctx, jetstreamSubject, body)
		return err
	})
}
