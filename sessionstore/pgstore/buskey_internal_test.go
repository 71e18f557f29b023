package pgstore

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi/internal/metrictest"
	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/internal/testwait"
	"github.com/marconihub/marconi/sessionstore"
)

// TestBusKeyPreviousOpensOnlyWithinItsGrace: after a rotation the key
// before opens a carried signal until the grace is over on the database's
// clock, then never (the wake-up arrives bare, counted as opened under
// none); the new key is 32 fresh bytes and never reaches the log.
func TestBusKeyPreviousOpensOnlyWithinItsGrace(t *testing.T) {
	u := pgtest.Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg := prometheus.NewRegistry()
	s, err := Open(ctx, u, WithRegisterer(reg),
		WithBusKeyTimings(BusKeyTimings{Refresh: time.Hour, Grace: time.Minute, Recheck: time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	clock := time.Now()
	s.busKeys.now = func() time.Time { return clock }
	var logs bytes.Buffer
	bus := NewBus(s, slog.New(slog.NewTextHandler(&logs, nil)))

	bob := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	sig := sessionstore.Signal{ID: "s1", Seq: 1, To: bob, FromSession: "alice", Kind: "note", CreatedAt: clock.UTC()}
	old, err := bus.SealWakes(ctx, []Wake{{Key: bob, Seq: 1, Signal: &sig, Incarnation: clock}})
	if err != nil || len(old) != 1 {
		t.Fatalf("seal: %q, %v", old, err)
	}
	oldKey := s.busKeys.keys.current

	v, _, err := s.RotateBusKey(ctx)
	if err != nil || v != 2 {
		t.Fatalf("rotate: version %d, %v", v, err)
	}
	var key, prev []byte
	if err := s.pool.QueryRow(ctx, `SELECT key, previous FROM bus_key`).Scan(&key, &prev); err != nil {
		t.Fatal(err)
	}
	if len(key) != busKeySize || bytes.Equal(key, oldKey) || !bytes.Equal(prev, oldKey) {
		t.Fatalf("after a rotation: key of %d bytes (same as before: %v), previous the old key: %v",
			len(key), bytes.Equal(key, oldKey), bytes.Equal(prev, oldKey))
	}
	open := func() *sessionstore.Signal {
		t.Helper()
		ws, err := bus.OpenWakes(ctx, old[0])
		if err != nil || len(ws) != 1 {
			t.Fatalf("open: %v, %v", ws, err)
		}
		return ws[0].Signal
	}
	if open() == nil {
		t.Fatal("a signal sealed under the previous key, within its grace, was not carried")
	}

	// The grace passes on the database's clock and on this one: the next
	// signal that fails to open has the row read again, which says so.
	if _, err := s.pool.Exec(ctx, `UPDATE bus_key SET rotated_at = now() - interval '61 seconds'`); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(61 * time.Second)
	if open() != nil {
		t.Fatal("a signal sealed under the previous key was carried after its grace")
	}
	for result, want := range map[string]float64{openedPrevious: 1, openedNone: 1, openedCurrent: 0} {
		if got, _ := metrictest.Lookup(t, reg, "marconi_bus_key_opened_total", "result", result); got != want {
			t.Errorf("marconi_bus_key_opened_total{result=%q} = %v, want %v", result, got, want)
		}
	}

	// An instance that first reads the row after the grace never opens
	// the previous key, whatever its own clock says.
	late, err := Open(ctx, u, WithBusKeyTimings(BusKeyTimings{Grace: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if ws, err := NewBus(late, nil).OpenWakes(ctx, old[0]); err != nil || len(ws) != 1 || ws[0].Signal != nil {
		t.Fatalf("an instance that read the key after the grace opened %v, %v; want a bare wake-up", ws, err)
	}
	for _, k := range [][]byte{key, oldKey} {
		for _, form := range []string{string(k), hex.EncodeToString(k), base64.StdEncoding.EncodeToString(k)} {
			if bytes.Contains(logs.Bytes(), []byte(form)) {
				t.Fatalf("a bus key reached the log: %s", logs.String())
			}
		}
	}
}

// TestBusKeyDue: the listener sleeps until the key is due, a failed read
// included, so that a store it cannot read never has it spin.
func TestBusKeyDue(t *testing.T) {
	clock := time.Now()
	r := newKeyring(BusKeyTimings{Refresh: 30 * time.Second}, newBusKeyMetrics())
	r.now = func() time.Time { return clock }
	if d := r.due(); d != 0 {
		t.Fatalf("never read: due in %v, want now", d)
	}
	r.set(keyRow{key: fuzzBusKey, version: 1}, clock, nil)
	clock = clock.Add(10 * time.Second)
	if d := r.due(); d != 20*time.Second {
		t.Fatalf("read 10 s ago: due in %v, want 20s", d)
	}
	clock = clock.Add(25 * time.Second) // stale; a read now fails
	r.failedAt = clock
	if d := r.due(); d != keyRetry {
		t.Fatalf("stale, a read just failed: due in %v, want %v", d, keyRetry)
	}
	r.keys = busKeys{}
	if d := r.due(); d != keyRetry {
		t.Fatalf("never read, a read just failed: due in %v, want %v", d, keyRetry)
	}
}

// A carried signal that no known key opens has the bus key read again off
// the listener's goroutine: a re-read that hangs (a slow store) holds up no
// wake-up. The wake-up that forced it arrives bare (its signal is read from
// the store), before the next one, which arrives while the re-read still
// hangs.
func TestBusKeyRecheckHoldsUpNoWakeUp(t *testing.T) {
	t.Parallel()
	l := listenWithHangingKeyReads(t, BusKeyTimings{Refresh: time.Hour, Grace: time.Hour, Recheck: time.Millisecond})
	bob := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	sig := sessionstore.Signal{ID: "s1", Seq: 1, To: bob, FromSession: "alice", Kind: "note", CreatedAt: time.Now().UTC()}
	unknown := bytes.Repeat([]byte{7}, busKeySize) // a key this store never read
	sealed, err := wakeCodec{key: unknown}.encode([]Wake{{Key: bob, Seq: 1, Signal: &sig, Incarnation: time.Now()}})
	if err != nil || len(sealed) != 1 {
		t.Fatalf("seal: %q, %v", sealed, err)
	}
	l.notify(sealed[0])
	testwait.Receive(t, "the re-read of the bus key", 10*time.Second, l.entered)
	l.notify(bareWake(t, bob, 2))
	for seq := int64(1); seq <= 2; seq++ {
		w := testwait.Receive(t, "a wake-up while the re-read of the bus key hangs", 10*time.Second, l.wakes)
		if w.Key != bob || w.Seq != seq || w.Signal != nil {
			t.Fatalf("wake-up %+v, want bob's bare seq %d", w, seq)
		}
	}
}

// The bus key's periodic re-read (every Refresh) runs off the listener's
// goroutine too, once the key is known: one that hangs holds up no
// wake-up, and the listener does not spin while it is under way.
func TestBusKeyRefreshHoldsUpNoWakeUp(t *testing.T) {
	t.Parallel()
	l := listenWithHangingKeyReads(t, BusKeyTimings{Refresh: time.Millisecond, Grace: time.Hour})
	testwait.Receive(t, "the periodic re-read of the bus key", 10*time.Second, l.entered)
	bob := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	for seq := int64(1); seq <= 2; seq++ {
		l.notify(bareWake(t, bob, seq))
		w := testwait.Receive(t, "a wake-up while the re-read of the bus key hangs", 10*time.Second, l.wakes)
		if w.Key != bob || w.Seq != seq {
			t.Fatalf("wake-up %+v, want bob's seq %d", w, seq)
		}
	}
	if d := l.st.busKeys.due(); d != keyReadTimeout {
		t.Fatalf("the listener's next look at the bus key in %v while a read is under way, want the read's bound %v", d, keyReadTimeout)
	}
}

// hangingKeyReads is a listener on a store whose bus key was read once,
// and whose reads of it from then on hang until the test ends.
type hangingKeyReads struct {
	st      *Store
	entered chan struct{} // closed when a read starts
	wakes   chan Wake     // what the listener heard, in order
	notify  func(payload string)
}

func listenWithHangingKeyReads(t *testing.T, timings BusKeyTimings) *hangingKeyReads {
	t.Helper()
	ctx := context.Background()
	st, admin := storeAndAdmin(t, WithBusKeyTimings(timings))
	if k := st.busKeys.get(ctx, st, slog.New(slog.DiscardHandler)); k.current == nil {
		t.Fatal("the bus key was not read")
	}
	l := &hangingKeyReads{st: st, entered: make(chan struct{}), wakes: make(chan Wake, 8)}
	release := make(chan struct{})
	var once sync.Once
	st.busKeys.mu.Lock()
	st.busKeys.fetch = func(ctx context.Context, s *Store) (keyRow, error) {
		once.Do(func() { close(l.entered) })
		<-release // a store that does not answer, whatever the read's deadline
		return fetchKeyRow(ctx, s)
	}
	st.busKeys.mu.Unlock()

	connected := make(chan struct{}, 8)
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = NewBus(st, nil).Listen(lctx, "a", time.Now(), func(w Wake) { l.wakes <- w }, func() { connected <- struct{}{} })
	}()
	t.Cleanup(func() { cancel(); <-done })
	t.Cleanup(func() { close(release) }) // first: a listener stuck in a read can then stop
	testwait.Receive(t, "the listener", 10*time.Second, connected)
	l.notify = func(payload string) {
		t.Helper()
		if _, err := admin.Exec(ctx, `SELECT pg_notify(`+channelSQL+`, $2)`, "a", payload); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// bareWake is the payload of a bare wake-up of k's seq.
func bareWake(t *testing.T, k sessionstore.Key, seq int64) string {
	t.Helper()
	p, err := EncodeWake(k, seq)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
