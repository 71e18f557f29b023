package fabric_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/internal/testproxy"
	"github.com/marconihub/marconi/internal/testwait"
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
		_ = pgstore.NewBus(storeA, nil).Listen(ctx, "a", a.Members.StartedAt(), func(sessionstore.Wake) {}, func() {})
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, f := range []*fabric.Fabric{a, old} {
		if err := f.Tick(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, "b to see a's listener connected", 10*time.Second, func() bool { return process(t, b, "a") == fabric.ProcessConnected })
	if got := process(t, b, "old"); got != fabric.ProcessUnknown || !b.Members.Healthy(context.Background(), "old") {
		t.Errorf("an instance that never held the lock: process %q, healthy %v; want unknown and healthy by its heartbeat",
			got, b.Members.Healthy(context.Background(), "old"))
	}
	attachedAt := time.Now()
	if !b.Members.HoldsQueue(context.Background(), "a", attachedAt) {
		t.Fatal("a healthy, connected instance does not hold its queue")
	}

	proxy.Cut() // a's connections end, and it cannot reconnect
	took := testwait.For(t, "b to see a dead", 3*time.Second, func() bool {
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
	testwait.For(t, "b to see a back", 10*time.Second, func() bool {
		return b.Members.Probe(context.Background()) == nil && b.Members.Healthy(context.Background(), "a")
	})
}

// listen runs st's wake-up listener for the process of instance started at
// startedAt (its liveness locks) until the returned stop is called or the
// test ends; stop returns once the listener has closed its connection.
func listen(t *testing.T, st *pgstore.Store, instance string, startedAt time.Time) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = pgstore.NewBus(st, nil).Listen(ctx, instance, startedAt, func(sessionstore.Wake) {}, func() {})
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// A process restarted with the same instance id while the backend of the
// process before it still holds that one's connection (Postgres has not yet
// seen it end: its host lost, a partition) is not taken for connected
// through that connection, and is not declared dead when that connection
// ends before its own listener has connected: until then its heartbeat
// judges it. From its own connection on, that connection does.
func TestPGRestartWithTheSameIDIsJudgedByItsOwnConnection(t *testing.T) {
	t.Parallel()
	base := pgtest.Schema(t)
	ctx := context.Background()
	storeB := openPG(t, base)
	b := newPGFabric(t, storeB, "b", pgstore.NewBus(storeB, nil))
	storeFirst, storeSecond := openPG(t, base), openPG(t, base)
	first := newPGFabric(t, storeFirst, "a", nil)
	stopFirst := listen(t, storeFirst, "a", first.Members.StartedAt())
	if err := first.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "b to see a's first process connected", 10*time.Second, func() bool { return process(t, b, "a") == fabric.ProcessConnected })
	admin := adminConn(t, base)
	pid := listenerPID(t, storeB, admin, "a")

	// a restarts: a second process of the same id heartbeats; its listener
	// is not connected yet, and the first's backend is still there.
	second := newPGFabric(t, storeSecond, "a", nil)
	if !second.Members.StartedAt().Truncate(time.Microsecond).After(first.Members.StartedAt()) {
		t.Fatalf("second process started at %v, not after the first's %v", second.Members.StartedAt(), first.Members.StartedAt())
	}
	if err := second.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if got := process(t, b, "a"); got != fabric.ProcessUnknown || !b.Members.Healthy(ctx, "a") {
		t.Errorf("restarted, its listener not connected, the first's connection still there: process %q, healthy %v; want unknown (judged by its heartbeat), healthy",
			got, b.Members.Healthy(ctx, "a"))
	}

	stopFirst() // the first process's connection ends at last
	testwait.For(t, "the first listener's locks to be released", 10*time.Second, func() bool { return heldLocks(t, admin, pid) == 0 })
	if got := process(t, b, "a"); got != fabric.ProcessUnknown || !b.Members.Healthy(ctx, "a") {
		t.Fatalf("the first process's connection ended, the second's listener not yet connected: process %q, healthy %v; want unknown, healthy (the second process is alive)",
			got, b.Members.Healthy(ctx, "a"))
	}

	stopSecond := listen(t, storeSecond, "a", second.Members.StartedAt())
	testwait.For(t, "b to see a's second process connected", 10*time.Second, func() bool { return process(t, b, "a") == fabric.ProcessConnected })
	stopSecond()
	testwait.For(t, "b to see a's second process gone", 10*time.Second, func() bool { return process(t, b, "a") == fabric.ProcessGone })
	if b.Members.Healthy(ctx, "a") {
		t.Error("a's second process is gone, and a is still healthy")
	}
}

// listenerPID is the backend pid of instance's wake-up listener in the
// schema of st (the one listening on its channel).
func listenerPID(t *testing.T, st *pgstore.Store, admin *pgx.Conn, instance string) int32 {
	t.Helper()
	pid := findListener(t, st, admin, instance)
	if pid == 0 {
		t.Fatalf("no listener of %s", instance)
	}
	return pid
}

// findListener is listenerPID, or 0 while there is none: the newest, when a
// terminated one is still on its way out.
func findListener(t *testing.T, st *pgstore.Store, admin *pgx.Conn, instance string) int32 {
	t.Helper()
	ctx := context.Background()
	ch, err := pgstore.NewBus(st, nil).Channel(ctx, instance)
	if err != nil {
		t.Fatal(err)
	}
	var pid int32
	err = admin.QueryRow(ctx, `SELECT coalesce((SELECT pid FROM pg_stat_activity
		WHERE application_name = $1 AND query LIKE 'LISTEN %' || $2 || '%' ORDER BY backend_start DESC LIMIT 1), 0)`,
		pgstore.ListenerApplicationName, ch).Scan(&pid)
	if err != nil {
		t.Fatalf("listener of %s: %v", instance, err)
	}
	return pid
}

// findLivenessConn is the backend pid of the liveness connection
// (pgstore.LivenessApplicationName) that holds the process lock beside the
// listener of backend pid listener, or 0 while there is none.
func findLivenessConn(t *testing.T, admin *pgx.Conn, listener int32) int32 {
	t.Helper()
	var pid int32
	err := admin.QueryRow(context.Background(), `SELECT coalesce(max(o.pid), 0)
		FROM pg_locks l JOIN pg_locks o USING (locktype, database, classid, objid, objsubid)
		JOIN pg_stat_activity s ON s.pid = o.pid
		WHERE l.locktype = 'advisory' AND l.granted AND o.granted AND l.pid = $1 AND o.pid <> $1
		  AND s.application_name = $2`, listener, pgstore.LivenessApplicationName).Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// terminate ends backend pid, as an operator's pg_terminate_backend does.
func terminate(t *testing.T, admin *pgx.Conn, pid int32) {
	t.Helper()
	var ok bool
	if err := admin.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("terminate backend %d: %v, %v", pid, ok, err)
	}
}

// heldLocks counts the advisory locks the backend pid holds.
func heldLocks(t *testing.T, admin *pgx.Conn, pid int32) int {
	t.Helper()
	var n int
	err := admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = $1`, pid).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// adminConn is a connection of the test's own to u, for its checks.
func adminConn(t *testing.T, u string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// A process whose connections to Postgres drop one at a time while it lives
// (an operator's pg_terminate_backend, a network blip, an idle timeout) is
// not taken for dead: a peer probing all the while never sees it unhealthy
// and never takes its sticky session over, whichever connection was lost,
// because the other still holds the process's lock while the lost one comes
// back. When both end (the process stops), it is dead at once, and its
// session is taken over.
func TestPGReconnectWithinAProcessIsNotADeath(t *testing.T) {
	t.Parallel()
	base := pgtest.Schema(t)
	ctx := context.Background()
	storeA, storeB := openPG(t, base), openPG(t, base)
	a, b := newPGFabric(t, storeA, "a", nil), newPGFabric(t, storeB, "b", pgstore.NewBus(storeB, nil))
	stopA := listen(t, storeA, "a", a.Members.StartedAt())
	if err := a.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "sticky"}
	now := time.Now()
	_, err := storeA.CreateSession(ctx, sessionstore.Session{Key: k, RuntimeMode: fabric.ModeSticky, TokenHash: []byte("x"),
		RegisteredAt: now, ExpiresAt: now.Add(time.Hour), AssignedInstance: "a"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := storeA.SetQueue(ctx, k, "a", now); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "b to see a's process connected", 10*time.Second, func() bool { return process(t, b, "a") == fabric.ProcessConnected })
	admin := adminConn(t, base)
	listener := func() int32 { return findListener(t, storeB, admin, "a") }
	liveness := func() int32 { return findLivenessConn(t, admin, listener()) }

	for _, c := range []struct {
		conn string
		pid  func() int32
	}{{"listener", listener}, {"liveness connection", liveness}} {
		pid := c.pid()
		if pid == 0 {
			t.Fatalf("a has no %s, or no liveness connection that holds the process's lock beside its listener's", c.conn)
		}
		w := watchPeer(t, b, storeB, k)
		terminate(t, admin, pid)
		took := testwait.For(t, "a's "+c.conn+" to be back", 10*time.Second, func() bool {
			p := c.pid()
			return p != 0 && p != pid
		})
		probes, bad := w.stop()
		t.Logf("%s back %v after its backend was terminated; %d probes meanwhile", c.conn, took, probes)
		if bad != "" {
			t.Errorf("%s terminated, its process alive: %s", c.conn, bad)
		}
	}

	stopA() // both connections end, as when the process is killed
	took := testwait.For(t, "b to see a dead", 3*time.Second, func() bool {
		return b.Members.Probe(ctx) == nil && !b.Members.Healthy(ctx, "a")
	})
	t.Logf("death seen %v after both connections ended (heartbeat window: 1h)", took)
	if got := process(t, b, "a"); got != fabric.ProcessGone {
		t.Errorf("summary process of a = %q, want gone", got)
	}
	sess, err := storeB.GetSession(ctx, k, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if p, err := b.Placer.Place(ctx, sess, false); err != nil || !p.AffinityReset {
		t.Errorf("attach on b of a's sticky session, a dead: %+v, %v; want it taken over", p, err)
	}
}

// peerWatch probes in a loop, as a busy peer does, until stopped.
type peerWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	probes int
	bad    string // the first thing the peer did that it must not have
}

// watchPeer has b probe in a loop and, after each probe, read a's health
// and decide on an attach of k, a's sticky session, until stopped: a must
// stay healthy, and the attach must be sent to a (wrong_instance).
func watchPeer(t *testing.T, b *fabric.Fabric, st *pgstore.Store, k sessionstore.Key) *peerWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &peerWatch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil && w.bad == "" {
			if err := b.Members.Probe(ctx); err != nil {
				continue
			}
			w.probes++
			if !b.Members.Healthy(ctx, "a") {
				w.bad = "b saw a unhealthy"
				return
			}
			sess, err := st.GetSession(ctx, k, time.Now())
			if err != nil {
				continue
			}
			_, err = b.Placer.Place(ctx, sess, false)
			if me := (*marconi.Error)(nil); !errors.As(err, &me) || me.Code != marconi.CodeWrongInstance {
				if ctx.Err() == nil {
					w.bad = fmt.Sprintf("an attach of a's sticky session on b answered %v, not wrong_instance", err)
				}
				return
			}
		}
	}()
	t.Cleanup(func() { w.stop() })
	return w
}

// stop ends the loop and reports how many probes it made and what went
// wrong ("" when nothing).
func (w *peerWatch) stop() (probes int, bad string) {
	w.cancel()
	<-w.done
	return w.probes, w.bad
}
