package natsbus_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi/fabric/natsbus"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/natstest"
	"github.com/marconihub/marconi/internal/testwait"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// fakeStore stands for pgstore.Bus: bare wake-ups, a channel of its own
// per test, and a listener that only waits. OpenWakes blocks until gate is
// closed, as a listener stuck behind a slow hub would, and says on entered
// that it does.
type fakeStore struct {
	prefix  string
	gate    chan struct{}
	entered chan struct{}
}

func newFakeStore() *fakeStore {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &fakeStore{prefix: "t" + hex.EncodeToString(b), gate: make(chan struct{}), entered: make(chan struct{}, 1)}
}

func (f *fakeStore) Publish(context.Context, string, sessionstore.Wake) error { return nil }
func (f *fakeStore) Listen(ctx context.Context, _ string, _ time.Time, _ func(sessionstore.Wake), _ func()) error {
	<-ctx.Done()
	return nil
}
func (f *fakeStore) ConnectedInstances(context.Context) (map[string]time.Time, string, error) {
	return nil, "", nil
}
func (f *fakeStore) SealWakes(_ context.Context, wakes []sessionstore.Wake) ([]string, error) {
	return pgstore.EncodeWakes(wakes)
}
func (f *fakeStore) OpenWakes(ctx context.Context, payload string) ([]sessionstore.Wake, error) {
	select {
	case f.entered <- struct{}{}:
	default:
	}
	select {
	case <-f.gate:
	case <-ctx.Done():
	}
	return pgstore.DecodeWakes(payload)
}
func (f *fakeStore) Channel(_ context.Context, instance string) (string, error) {
	return f.prefix + "_" + instance, nil
}

var _ natsbus.Store = (*fakeStore)(nil)

// listenOn runs b.Listen for instance until the test ends, counting what it
// hands on.
func listenOn(t *testing.T, b *natsbus.Bus, instance string) (wakes, connects *atomic.Int64) {
	t.Helper()
	wakes, connects = new(atomic.Int64), new(atomic.Int64)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := b.Listen(ctx, instance, time.Time{}, func(sessionstore.Wake) { wakes.Add(1) }, func() { connects.Add(1) }); err != nil {
			t.Errorf("Listen: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return wakes, connects
}

// The queue between NATS and the hub is bounded: past MARCONI_BUS_QUEUE_SIZE
// the client drops wake-ups, the overflow is counted, and the listener
// catches every queue up (onConnect) once it can.
func TestNATSBusQueueIsBounded(t *testing.T) {
	url := natstest.URL(t)
	st, reg := newFakeStore(), prometheus.NewRegistry()
	b, err := natsbus.New(natsbus.Config{URL: url, QueueSize: 4}, st, reg, testLog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close) // after Listen ends (cleanups run last first)
	wakes, connects := listenOn(t, b, "b")
	hubtest.WaitFor(t, "the listener's first catch-up", func() bool { return connects.Load() >= 1 })

	const n = 100
	k := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	publish := func(seq int) {
		t.Helper()
		if err := b.Publish(context.Background(), "b", sessionstore.Wake{Key: k, Seq: int64(seq)}); err != nil {
			t.Fatal(err)
		}
	}
	// The listener takes the first wake-up and is stuck on it before the
	// others come. Were it not, a catch-up already under way when the queue
	// overflows (such as the one the client's connect handler asks for)
	// could take the overflow's signal and end before connects is read
	// here, and no catch-up would follow (a CI run saw it).
	publish(1)
	testwait.Receive(t, "the listener stuck on the first wake-up", 15*time.Second, st.entered)
	before := connects.Load() // no catch-up runs until the gate opens
	for i := 2; i <= n; i++ {
		publish(i)
	}
	hubtest.WaitFor(t, "the queue to overflow", func() bool { return metric(t, reg, "marconi_nats_bus_slow_consumer_total") >= 1 })
	close(st.gate)
	hubtest.WaitFor(t, "a catch-up after the overflow", func() bool { return connects.Load() > before })
	if got := wakes.Load(); got >= n {
		t.Errorf("%d wake-ups handed on through a queue of 4 with the listener stuck, want fewer than %d", got, n)
	}
}

// NATS unreachable: New does not wait for it, and Publish fails at once
// rather than buffer, so the hub counts the failure and the sweep delivers.
func TestNATSBusUnreachable(t *testing.T) {
	natstest.URL(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	reg := prometheus.NewRegistry()
	b, err := natsbus.New(natsbus.Config{URL: "nats://" + addr}, newFakeStore(), reg, testLog)
	if err != nil {
		t.Fatalf("New with NATS down: %v", err)
	}
	t.Cleanup(b.Close)
	_, connects := listenOn(t, b, "b")
	err = b.Publish(context.Background(), "b", sessionstore.Wake{Key: sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "s"}, Seq: 1})
	if err == nil || !strings.Contains(err.Error(), "NATS") {
		t.Errorf("Publish with NATS down: err %v, want a NATS error", err)
	}
	if b.Connected() || metric(t, reg, "marconi_nats_bus_connected") != 0 || connects.Load() != 0 {
		t.Errorf("connected %v, gauge %v, catch-ups %d with NATS down", b.Connected(), metric(t, reg, "marconi_nats_bus_connected"), connects.Load())
	}
}

func TestNATSBusConfigRefused(t *testing.T) {
	for _, c := range []natsbus.Config{{}, {URL: "nats://127.0.0.1:1", QueueSize: -1}} {
		if _, err := natsbus.New(c, newFakeStore(), prometheus.NewRegistry(), nil); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
	if _, err := natsbus.New(natsbus.Config{URL: "nats://127.0.0.1:1"}, nil, prometheus.NewRegistry(), nil); err == nil {
		t.Error("no store accepted")
	}
}
