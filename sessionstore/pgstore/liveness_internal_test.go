package pgstore

import (
	"context"
	"slices"
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

// A liveness connection ended under a live process (an operator's
// pg_terminate_backend, as here) reconnects, and the reconnect is counted
// where an operator can alert on it.
func TestLivenessConnectionReconnectsAreCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	st, admin := storeAndAdmin(t, WithRegisterer(reg))
	var key int64
	if err := admin.QueryRow(ctx, `SELECT `+livenessKeySQL, "a").Scan(&key); err != nil {
		t.Fatal(err)
	}
	connects := func() float64 {
		v, ok := metrictest.Lookup(t, reg, "marconi_liveness_connects_total")
		if !ok {
			t.Fatal("marconi_liveness_connects_total not registered")
		}
		return v
	}
	// holder is the liveness connection's backend once it holds the
	// instance's lock, or 0.
	holder := func() int32 {
		if hs := lockHolders(t, admin, key); len(hs) == 1 {
			return hs[0].pid
		}
		return 0
	}
	if n := connects(); n != 0 {
		t.Fatalf("connects before Listen = %v, want 0", n)
	}

	listenAs(t, st, "a", time.Now())
	// It counts a connect just after it takes its locks: wait for both.
	var first int32
	testwait.For(t, "the liveness connection", 10*time.Second, func() bool { first = holder(); return first != 0 && connects() >= 1 })
	if n := connects(); n != 1 {
		t.Fatalf("connects after the first connection = %v, want 1", n)
	}
	var ok bool
	if err := admin.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, first).Scan(&ok); err != nil || !ok {
		t.Fatalf("terminate the liveness connection's backend %d: %v, %v", first, ok, err)
	}
	testwait.For(t, "the liveness connection back", 10*time.Second, func() bool {
		p := holder()
		return p != 0 && p != first && connects() >= 2
	})
	if n := connects(); n != 2 {
		t.Fatalf("connects after one reconnect = %v, want 2", n)
	}
}
