package fabric_test

import (
	"context"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/internal/testproxy"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

func openPG(t *testing.T, u string) *pgstore.Store {
	t.Helper()
	st, err := pgstore.Open(context.Background(), u, pgstore.WithMaxConns(2))
	if err != nil {
		t.Fatalf("open pgstore: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func newPGFabric(t *testing.T, st *pgstore.Store, id string, p fabric.Prober) *fabric.Fabric {
	t.Helper()
	// DeadAfter is far beyond the test: any death seen came from the probe.
	f, err := fabric.New(fabric.Config{InstanceID: id, PublicURL: "http://" + id, DeadAfter: time.Hour, HeartbeatEvery: time.Minute}, fabric.Deps{Store: st, Prober: p})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// process returns the summary's process state of instance as seen by f,
// after a tick.
func process(t *testing.T, f *fabric.Fabric, instance string) string {
	t.Helper()
	ctx := context.Background()
	if err := f.Tick(ctx); err != nil {
		t.Fatalf("tick: %v", err)
	}
	s, err := f.Summary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range s.Instances {
		if in.ID == instance {
			return in.Process
		}
	}
	return "absent"
}

func poll(t *testing.T, what string, within time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// An instance whose connection to Postgres ends (its process killed, or cut
// off as here) is dead to the others at the next probe, long before its
// heartbeat ages out; when its listener is back, so is its health. An
// instance that never held the liveness lock is judged by its heartbeat.
func TestPGDeathSeenThroughTheListenerConnection(t *testing.T) {
	t.Parallel()
	base := pgtest.Schema(t)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testproxy.Start(t, u.Host)
	viaProxy := *u
	viaProxy.Host = proxy.Addr()

	storeA, storeB := openPG(t, viaProxy.String()), openPG(t, base)
	a, b := newPGFabric(t, storeA, "a", nil), newPGFabric(t, storeB, "b", pgstore.NewBus(storeB, nil))
	old := newPGFabric(t, openPG(t, base), "old", nil) // an instance without a listener

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = pgstore.NewBus(storeA, nil).Listen(ctx, "a", func(sessionstore.Wake) {}, func() {})
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, f := range []*fabric.Fabric{a, old} {
		if err := f.Tick(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, "b to see a's listener connected", 10*time.Second, func() bool { return process(t, b, "a") == fabric.ProcessConnected })
	if got := process(t, b, "old"); got != fabric.ProcessUnknown || !b.Members.Healthy(context.Background(), "old") {
		t.Errorf("an instance that never held the lock: process %q, healthy %v; want unknown and healthy by its heartbeat",
			got, b.Members.Healthy(context.Background(), "old"))
	}
	attachedAt := time.Now()
	if !b.Members.HoldsQueue(context.Background(), "a", attachedAt) {
		t.Fatal("a healthy, connected instance does not hold its queue")
	}

	proxy.Cut() // a's connections end, and it cannot reconnect
	took := poll(t, "b to see a dead", 3*time.Second, func() bool {
		return b.Members.Probe(context.Background()) == nil && !b.Members.Healthy(context.Background(), "a")
	})
	t.Logf("death seen %v after the connection ended (heartbeat window: 1h)", took)
	if b.Members.HoldsQueue(context.Background(), "a", attachedAt) {
		t.Error("a dead instance still holds its queue")
	}
	if got := process(t, b, "a"); got != fabric.ProcessGone {
		t.Errorf("summary process of a = %q, want gone", got)
	}

	proxy.Restore() // the listener reconnects and takes its lock again
	poll(t, "b to see a back", 10*time.Second, func() bool {
		return b.Members.Probe(context.Background()) == nil && b.Members.Healthy(context.Background(), "a")
	})
}
