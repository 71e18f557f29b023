package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// durable -jetstream refuses, before starting anything, a nats-server path
// that is not an executable, and says how to build one.
func TestDurableJetStreamMissingBinary(t *testing.T) {
	const db = "postgres://postgres@127.0.0.1:5432/x?sslmode=disable"
	notExec := filepath.Join(t.TempDir(), "nats-server")
	if err := os.WriteFile(notExec, []byte("not a program"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, bin := range []string{filepath.Join(t.TempDir(), "absent", "nats-server"), notExec, "no-such-nats-server-in-path"} {
		_, err := parseDurableOptions([]string{"-database-url", db, "-jetstream", bin}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "-jetstream") || !strings.Contains(err.Error(), "no nats-server binary") ||
			!strings.Contains(err.Error(), "go install github.com/nats-io/nats-server/v2@"+jetstreamVersion) {
			t.Errorf("-jetstream %s: error %v, want one naming the flag and how to build the server", bin, err)
		}
	}
}

func TestParseDurableJetStreamOptions(t *testing.T) {
	const db = "postgres://postgres@127.0.0.1:5432/x?sslmode=disable"
	server := filepath.Join(t.TempDir(), "nats-server")
	if err := os.WriteFile(server, []byte("#!/bin/sh\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	o, err := parseDurableOptions([]string{"-database-url", db, "-jetstream", server, "-senders", "64", "-duration", "10s", "-rounds", "3"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.jetstream != server || o.peerRounds != 3 || len(o.senders) != 1 || o.senders[0] != 64 || o.step != 10*time.Second {
		t.Errorf("options %+v", o)
	}
	if o, err := parseDurableOptions([]string{"-database-url", db}, io.Discard); err != nil || o.jetstream != "" || o.peerRounds != 2 {
		t.Errorf("defaults: %+v, %v; want no JetStream, 2 rounds", o, err)
	}
	for _, rounds := range []string{"0", "11"} {
		if _, err := parseDurableOptions([]string{"-database-url", db, "-jetstream", server, "-rounds", rounds}, io.Discard); err == nil || !strings.Contains(err.Error(), "-rounds") {
			t.Errorf("-rounds %s: error %v, want one naming -rounds", rounds, err)
		}
	}
}

// The summary is the mean of each side over the rounds, and the ratio is
// Marconi's throughput over JetStream's.
func TestSummarizePeers(t *testing.T) {
	ms := time.Millisecond
	s := summarizePeers([]peerRun{
		{marconi: durableResult{sends: 30000, perSec: 3000, p50: 10 * ms, p99: 40 * ms},
			jetstream: durableResult{sends: 40000, perSec: 4000, p50: 8 * ms, p99: 30 * ms, failed: 1}},
		{marconi: durableResult{sends: 50000, perSec: 5000, p50: 12 * ms, p99: 20 * ms},
			jetstream: durableResult{sends: 20000, perSec: 2000, p50: 6 * ms, p99: 50 * ms, failed: 2}},
	})
	want := peerSummary{
		marconi:   durableResult{sends: 80000, perSec: 4000, p50: 11 * ms, p99: 30 * ms},
		jetstream: durableResult{sends: 60000, perSec: 3000, p50: 7 * ms, p99: 40 * ms, failed: 3},
	}
	if s.marconi != want.marconi || s.jetstream != want.jetstream {
		t.Errorf("means %+v, want %+v", s, want)
	}
	if s.ratio < 1.3333 || s.ratio > 1.3334 {
		t.Errorf("ratio %v, want 4000/3000", s.ratio)
	}
	if z := summarizePeers([]peerRun{{marconi: durableResult{perSec: 10}}}); z.ratio != 0 {
		t.Errorf("ratio with no JetStream publish: %v, want 0 (no figure)", z.ratio)
	}
}

// The server's configuration listens on the loopback address given, keeps
// its store where it is told, and fsyncs every write.
func TestNATSServerConfig(t *testing.T) {
	c := natsServerConfig("127.0.0.1:4333", "/tmp/x/js")
	for _, want := range []string{`listen: "127.0.0.1:4333"`, `store_dir: "/tmp/x/js"`, "sync_interval: always"} {
		if !strings.Contains(c, want) {
			t.Errorf("config lacks %q:\n%s", want, c)
		}
	}
	if strings.Contains(c, "http") || strings.Contains(c, "cluster") {
		t.Errorf("config opens more than the client port:\n%s", c)
	}
}
