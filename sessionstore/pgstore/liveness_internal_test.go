package pgstore

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi/internal/metrictest"
	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/internal/testwait"
	"github.com/marconihub/marconi/sessionstore"
)

// The liveness locks as Postgres holds them: a process's, shared by its
// listener's and its liveness connection, so that either alone keeps it;
// the instance's, exclusively by the liveness connection of one process of
// that id at a time, and by the next process of the same id once the first
// is gone.
func TestLivenessLocksSharedByAProcessExclusiveToAnInstance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, admin := storeAndAdmin(t)
	first := time.Now().UTC().Truncate(time.Microsecond)
	second := first.Add(time.Second)
	holders := func(startedAt time.Time) (instance, process []lockHolder) {
		var ik, pk int64
		if err := admin.QueryRow(ctx, `SELECT `+livenessKeySQL+`, `+processKeySQL, "a", startedAt).Scan(&ik, &pk); err != nil {
			t.Fatal(err)
		}
		return lockHolders(t, admin, ik), lockHolders(t, admin, pk)
	}
	shared := []string{LivenessApplicationName + " ShareLock", ListenerApplicationName + " ShareLock"}

	stopFirst := listenAs(t, st, "a", first)
	var owner int32
	testwait.For(t, "the first process's locks", 10*time.Second, func() bool {
		inst, proc := holders(first)
		if len(inst) == 1 {
			owner = inst[0].pid
		}
		return slices.Equal(modes(proc), shared) &&
			slices.Equal(modes(inst), []string{LivenessApplicationName + " ExclusiveLock"})
	})

	// A second process of the same id: its own process lock at once, the
	// instance's not while the first holds it.
	listenAs(t, st, "a", second)
	testwait.For(t, "the second process's lock", 10*time.Second, func() bool {
		_, proc := holders(second)
		return slices.Equal(modes(proc), shared)
	})
	if inst, _ := holders(second); len(inst) != 1 || inst[0].pid != owner {
		t.Fatalf("instance lock held by %+v with two processes of one id, want the first's liveness connection (pid %d) alone", inst, owner)
	}

	stopFirst()
	testwait.For(t, "the second process to take the instance's lock", 10*time.Second, func() bool {
		inst, proc := holders(second)
		return len(inst) == 1 && inst[0].pid != owner && slices.ContainsFunc(proc, func(h lockHolder) bool { return h.pid == inst[0].pid })
	})
}

// storeAndAdmin opens a store with opts on a schema of its own, and a
// connection of the test's own to that schema, for its checks.
func storeAndAdmin(t *testing.T, opts ...Option) (*Store, *pgx.Conn) {
	t.Helper()
	u := pgtest.Schema(t)
	st, err := Open(context.Background(), u, append([]Option{WithMaxConns(2)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	admin, err := pgx.Connect(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	return st, admin
}

// lockHolder is a backend that holds an advisory lock.
type lockHolder struct {
	pid  int32
	app  string // its application_name
	mode string // pg_locks.mode
}

// lockHolders lists the backends that hold the advisory lock of key, by
// application_name.
func lockHolders(t *testing.T, admin *pgx.Conn, key int64) []lockHolder {
	t.Helper()
	rows, err := admin.Query(context.Background(), `SELECT l.pid, s.application_name, l.mode
		FROM pg_locks l JOIN pg_stat_activity s ON s.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND l.classid::bigint = ($1::bigint >> 32) & 4294967295 AND l.objid::bigint = $1::bigint & 4294967295
		ORDER BY s.application_name, l.pid`, key)
	if err != nil {
		t.Fatal(err)
	}
	var hs []lockHolder
	for rows.Next() {
		var h lockHolder
		if err := rows.Scan(&h.pid, &h.app, &h.mode); err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return hs
}

// modes names each holder's application and lock mode.
func modes(hs []lockHolder) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.app+" "+h.mode)
	}
	return out
}

// listenAs runs a bus of st for the process of instance started at
// startedAt until the returned stop is called or the test ends; stop
// returns once its connections are closed.
func listenAs(t *testing.T, st *Store, instance string, startedAt time.Time) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = NewBus(st, nil).Listen(ctx, instance, startedAt, func(sessionstore.Wake) {}, func() {})
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// A dedicated connection ended under a live process (an operator's
// pg_terminate_backend, as here) reconnects, and the reconnect is counted
// in that connection's series alone, where an operator can alert on it.
func TestDedicatedConnectionReconnectsAreCounted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ app, counter, other string }{
		{LivenessApplicationName, "marconi_liveness_connects_total", "marconi_pg_listener_connects_total"},
		{ListenerApplicationName, "marconi_pg_listener_connects_total", "marconi_liveness_connects_total"},
	} {
		t.Run(tc.app, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			reg := prometheus.NewRegistry()
			st, admin := storeAndAdmin(t, WithRegisterer(reg))
			started := time.Now().UTC().Truncate(time.Microsecond)
			var key int64
			if err := admin.QueryRow(ctx, `SELECT `+processKeySQL, "a", started).Scan(&key); err != nil {
				t.Fatal(err)
			}
			connects := func(name string) float64 {
				v, ok := metrictest.Lookup(t, reg, name)
				if !ok {
					t.Fatalf("%s not registered", name)
				}
				return v
			}
			// holder is tc.app's backend once it holds the process's
			// lock, or 0.
			holder := func() int32 {
				for _, h := range lockHolders(t, admin, key) {
					if h.app == tc.app {
						return h.pid
					}
				}
				return 0
			}
			if n := connects(tc.counter); n != 0 {
				t.Fatalf("%s before Listen = %v, want 0", tc.counter, n)
			}

			listenAs(t, st, "a", started)
			// Each counts a connect just after it takes its locks: wait
			// for both.
			var first int32
			testwait.For(t, "both connections", 10*time.Second, func() bool {
				first = holder()
				return first != 0 && connects(tc.counter) >= 1 && connects(tc.other) >= 1
			})
			if n := connects(tc.counter); n != 1 {
				t.Fatalf("%s after the first connection = %v, want 1", tc.counter, n)
			}
			var ok bool
			if err := admin.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, first).Scan(&ok); err != nil || !ok {
				t.Fatalf("terminate %s's backend %d: %v, %v", tc.app, first, ok, err)
			}
			testwait.For(t, tc.app+" back", 10*time.Second, func() bool {
				p := holder()
				return p != 0 && p != first && connects(tc.counter) >= 2
			})
			if n := connects(tc.counter); n != 2 {
				t.Fatalf("%s after one reconnect = %v, want 2", tc.counter, n)
			}
			if n := connects(tc.other); n != 1 {
				t.Fatalf("%s after a reconnect of %s = %v, want 1", tc.other, tc.app, n)
			}
		})
	}
}

// A server, database or role whose idle_session_timeout (or
// idle_in_transaction_session_timeout) is under the dedicated connections'
// keep-alive must not end them: both would end together, the process's
// lock would be released, and its peers would judge the live process dead.
// Here the store's connection string sets the timeouts (as a role's or a
// database's settings would), the dedicated connections idle well past
// them, and a peer, on a connection string of its own, still sees the
// process connected, on the same two backends.
func TestDedicatedConnectionsOutliveTheServersIdleTimeouts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const idleTimeout = 250 * time.Millisecond
	base := pgtest.Schema(t)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("options", fmt.Sprintf("-c idle_session_timeout=%d -c idle_in_transaction_session_timeout=%d",
		idleTimeout.Milliseconds(), idleTimeout.Milliseconds()))
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // pgx reads no "+" as a space
	st, err := Open(ctx, u.String(), WithMaxConns(2))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	peer, err := Open(ctx, base, WithMaxConns(2))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = peer.Close() })
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })

	started := time.Now().UTC().Truncate(time.Microsecond)
	if err := peer.HeartbeatInstance(ctx, sessionstore.Instance{ID: "a", URL: "http://a", StartedAt: started, LastHeartbeatAt: started}); err != nil {
		t.Fatal(err)
	}
	var key int64
	if err := admin.QueryRow(ctx, `SELECT `+processKeySQL, "a", started).Scan(&key); err != nil {
		t.Fatal(err)
	}
	listenAs(t, st, "a", started)
	shared := []string{LivenessApplicationName + " ShareLock", ListenerApplicationName + " ShareLock"}
	var first []lockHolder
	testwait.For(t, "both dedicated connections to hold the process's lock", 10*time.Second, func() bool {
		first = lockHolders(t, admin, key)
		return slices.Equal(modes(first), shared)
	})

	// Both backends idle for four times the timeout, still the same two.
	testwait.For(t, "the dedicated connections to idle past idle_session_timeout", 20*time.Second, func() bool {
		now := lockHolders(t, admin, key)
		if !slices.Equal(now, first) {
			t.Fatalf("the process's lock holders went from %+v to %+v: the server's idle timeout ended the dedicated connections", first, now)
		}
		var idle int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE pid = ANY($1) AND state = 'idle' AND now() - state_change > $2::interval`,
			[]int32{first[0].pid, first[1].pid}, (4 * idleTimeout).String()).Scan(&idle); err != nil {
			t.Fatal(err)
		}
		return idle == 2
	})
	live, _, err := NewBus(peer, nil).ConnectedInstances(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := live["a"]; !ok || !got.Equal(started) {
		t.Fatalf("a peer sees %v connected, want a's process started at %v", live, started)
	}
}
