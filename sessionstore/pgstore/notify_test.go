package pgstore_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

func TestWakePayloadRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		k   sessionstore.Key
		seq int64
	}{
		{sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}, 1},
		{sessionstore.Key{TenantID: "tenant with spaces", ProjectID: `quo"te\`, SessionID: "ünïcode-☃"}, 1<<62 + 7},
		{sessionstore.Key{TenantID: strings.Repeat("t", 256), ProjectID: strings.Repeat("p", 256), SessionID: strings.Repeat("s", 256)}, 42},
	} {
		p, err := pgstore.EncodeWake(tc.k, tc.seq)
		if err != nil {
			t.Fatalf("EncodeWake(%v, %d): %v", tc.k, tc.seq, err)
		}
		if len(p) > pgstore.MaxWakePayload {
			t.Fatalf("payload of %d bytes", len(p))
		}
		k, seq, err := pgstore.DecodeWake(p)
		if err != nil || k != tc.k || seq != tc.seq {
			t.Fatalf("DecodeWake(%q) = %v, %d, %v; want %v, %d", p, k, seq, err, tc.k, tc.seq)
		}
	}
	// The wire form is small, readable JSON.
	p, _ := pgstore.EncodeWake(sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}, 3)
	if want := `{"tenant":"t1","project":"p1","session":"bob","seq":3}`; p != want {
		t.Fatalf("payload = %s, want %s", p, want)
	}
}

func TestEncodeWakeRefusesWhatDecodeWouldRefuse(t *testing.T) {
	for _, tc := range []struct {
		k   sessionstore.Key
		seq int64
	}{
		{sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: ""}, 1},
		{sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "s"}, 0},
		{sessionstore.Key{TenantID: strings.Repeat("t", 257), ProjectID: "p", SessionID: "s"}, 1},
	} {
		if p, err := pgstore.EncodeWake(tc.k, tc.seq); err == nil {
			t.Errorf("EncodeWake(%v, %d) = %q, want an error", tc.k, tc.seq, p)
		}
	}
}

func TestDecodeWakeRejectsMalformed(t *testing.T) {
	for _, p := range []string{
		``,
		`null`,
		`[]`,
		`"bob"`,
		`{}`,
		`{"tenant":"t","project":"p","session":"s"}`,
		`{"tenant":"t","project":"p","session":"s","seq":0}`,
		`{"tenant":"t","project":"p","session":"s","seq":-1}`,
		`{"tenant":"t","project":"p","session":"s","seq":1.5}`,
		`{"tenant":"t","project":"p","session":"s","seq":"1"}`,
		`{"tenant":"","project":"p","session":"s","seq":1}`,
		`{"tenant":"t","project":"p","seq":1}`,
		`{"tenant":1,"project":"p","session":"s","seq":1}`,
		`{"tenant":"t","project":"p","session":"s","seq":1}{}`,
		`{"tenant":"t","project":"p","session":"s","seq":1} x`,
		`{"tenant":"t","project":"p","session":"s","seq":1}]`,
		`{"tenant":"t","project":"p","session":"s","seq":1}}`,
		`{"tenant":"t","project":"p","session":"s","seq":99999999999999999999}`,
		`{"tenant":"t","project":"p","session":"` + strings.Repeat("s", 257) + `","seq":1}`,
		`{"tenant":"t","project":"p","session":"s","seq":1,"pad":"` + strings.Repeat("x", pgstore.MaxWakePayload) + `"}`,
	} {
		if k, seq, err := pgstore.DecodeWake(p); err == nil {
			t.Errorf("DecodeWake(%.80q) = %v, %d; want an error", p, k, seq)
		}
	}
	// A field a newer instance might add is ignored.
	k, seq, err := pgstore.DecodeWake(`{"tenant":"t","project":"p","session":"s","seq":9,"v":2}`)
	if err != nil || k.SessionID != "s" || seq != 9 {
		t.Fatalf("payload with an extra field: %v, %d, %v", k, seq, err)
	}
}

// FuzzDecodeWake: the payload comes from anyone who can NOTIFY. Decoding
// never panics, and what it accepts encodes back to an equal wake-up.
func FuzzDecodeWake(f *testing.F) {
	f.Add(`{"tenant":"t1","project":"p1","session":"bob","seq":3}`)
	f.Add(`{"tenant":"t","project":"p","session":"s","seq":1,"x":[1,{"y":null}]}`)
	f.Add(`{"tenant":"\u0000","project":"\ud800","session":"s","seq":9223372036854775807}`)
	f.Add(`{`)
	f.Fuzz(func(t *testing.T, payload string) {
		k, seq, err := pgstore.DecodeWake(payload)
		if err != nil {
			return
		}
		p, err := pgstore.EncodeWake(k, seq)
		if err != nil {
			t.Fatalf("DecodeWake accepted %q as %v, %d, which EncodeWake refuses: %v", payload, k, seq, err)
		}
		k2, seq2, err := pgstore.DecodeWake(p)
		if err != nil || k2 != k || seq2 != seq {
			t.Fatalf("re-decoding %q: %v, %d, %v; want %v, %d", p, k2, seq2, err, k, seq)
		}
	})
}

type wakeup struct {
	k   sessionstore.Key
	seq int64
}

// listening runs bus.Listen for instance until the test ends and reports
// wake-ups and (re)connects on channels.
func listening(t *testing.T, bus *pgstore.Bus, instance string) (wakes <-chan wakeup, connects <-chan struct{}) {
	t.Helper()
	w := make(chan wakeup, 64)
	c := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := bus.Listen(ctx, instance,
			func(k sessionstore.Key, seq int64) {
				select {
				case w <- wakeup{k, seq}:
				case <-ctx.Done():
				}
			},
			func() {
				select {
				case c <- struct{}{}:
				case <-ctx.Done():
				}
			})
		if err != nil {
			t.Errorf("Listen: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return w, c
}

func receive[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func TestBusDeliversToTheNamedInstanceOnly(t *testing.T) {
	t.Parallel()
	u := pgtest.Schema(t)
	open := func(u string) *pgstore.Store {
		s, err := pgstore.Open(context.Background(), u, pgstore.WithMaxConns(2))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	busA, busB := pgstore.NewBus(open(u), nil), pgstore.NewBus(open(u), nil)
	other := pgstore.NewBus(open(pgtest.Schema(t)), nil) // another deployment in the same database
	wakes, connects := listening(t, busB, "b")
	receive(t, "the listener to connect", connects)

	ctx := context.Background()
	bob := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	for _, p := range []struct {
		bus      *pgstore.Bus
		instance string
		seq      int64
	}{{busA, "c", 1}, {other, "b", 2}, {busA, "b", 3}} {
		if err := p.bus.Publish(ctx, p.instance, bob, p.seq); err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	// Notifications of one sender arrive in order: had b heard seq 1 or 2,
	// it would have come before 3.
	if w := receive(t, "a wake-up", wakes); w != (wakeup{bob, 3}) {
		t.Fatalf("b heard %v, want only the wake-up addressed to it in its own schema (seq 3)", w)
	}

	// A malformed NOTIFY on b's channel is ignored, and the listener goes on.
	ch, err := busB.Channel(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SELECT pg_notify($1, 'not json')`, ch); err != nil {
		t.Fatal(err)
	}
	if err := busA.Publish(ctx, "b", bob, 4); err != nil {
		t.Fatal(err)
	}
	if w := receive(t, "a wake-up", wakes); w != (wakeup{bob, 4}) {
		t.Fatalf("after a malformed payload b heard %v, want seq 4", w)
	}
}

func TestBusListenerSurvivesATerminatedBackend(t *testing.T) {
	t.Parallel()
	u := pgtest.Schema(t)
	st, err := pgstore.Open(context.Background(), u, pgstore.WithMaxConns(2))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	bus := pgstore.NewBus(st, nil)
	wakes, connects := listening(t, bus, "b")
	receive(t, "the listener to connect", connects)

	ctx := context.Background()
	ch, err := bus.Channel(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	err = conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1 AND query LIKE 'LISTEN %' || $2 || '%'`, pgstore.ListenerApplicationName, ch).Scan(&n)
	if err != nil || n != 1 {
		t.Fatalf("terminated %d listener backends (%v), want 1", n, err)
	}
	// It reconnects (and says so, so that the hub wakes every local queue).
	receive(t, "the listener to reconnect", connects)
	bob := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	if err := bus.Publish(ctx, "b", bob, 7); err != nil {
		t.Fatal(err)
	}
	if w := receive(t, "a wake-up after the reconnect", wakes); w != (wakeup{bob, 7}) {
		t.Fatalf("heard %v, want seq 7", w)
	}
}
