package pgstore_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/internal/testwait"
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
		{sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "s"}, -1},
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

func TestEncodeWakesPacksAsFewPayloadsAsFit(t *testing.T) {
	key := func(i, pad int) sessionstore.Key {
		return sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: fmt.Sprintf("s%03d-%s", i, strings.Repeat("x", pad))}
	}
	for _, tc := range []struct {
		name     string
		n, pad   int
		payloads int
	}{
		{"one wake-up is the old object", 1, 0, 1},
		{"several fit one array", 40, 0, 1},
		{"the entry bound splits", 2*pgstore.MaxWakeBatch + 3, 0, 3},
		{"the byte bound splits", 100, 200, 4}, // ≈ 266 bytes a wake-up: 28 fit
		{"the longest fields, escaped", 3, -1, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var wakes []pgstore.Wake
			for i := range tc.n {
				var k sessionstore.Key
				if tc.pad < 0 { // every byte escaped: about 4.6 KB, more than one object may hold
					f := strings.Repeat("\x01", 256)
					k = sessionstore.Key{TenantID: f, ProjectID: f, SessionID: f[:255] + string(rune('a'+i))}
				} else {
					k = key(i, tc.pad)
				}
				wakes = append(wakes, pgstore.Wake{Key: k, Seq: int64(i + 1)})
			}
			ps, err := pgstore.EncodeWakes(wakes)
			if err != nil {
				t.Fatal(err)
			}
			if len(ps) != tc.payloads {
				t.Fatalf("%d payloads, want %d", len(ps), tc.payloads)
			}
			var got []pgstore.Wake
			for i, p := range ps {
				if len(p) > pgstore.MaxWakeBatchPayload {
					t.Fatalf("payload %d has %d bytes, over %d", i, len(p), pgstore.MaxWakeBatchPayload)
				}
				ws, err := pgstore.DecodeWakes(p)
				if err != nil {
					t.Fatalf("DecodeWakes(payload %d): %v", i, err)
				}
				if len(ws) > pgstore.MaxWakeBatch {
					t.Fatalf("payload %d carries %d wake-ups, over %d", i, len(ws), pgstore.MaxWakeBatch)
				}
				// Full: the next payload's first wake-up would not have fit.
				if i+1 < len(ps) && len(ws) < pgstore.MaxWakeBatch {
					next, _ := pgstore.DecodeWakes(ps[i+1])
					more, _ := pgstore.EncodeWakes(append(slices.Clone(ws), next[0]))
					if len(more) == 1 {
						t.Fatalf("payload %d (%d bytes, %d wake-ups) had room for the next one", i, len(p), len(ws))
					}
				}
				got = append(got, ws...)
			}
			if !slices.Equal(got, wakes) {
				t.Fatalf("decoded %d wake-ups, want the %d encoded, in order", len(got), len(wakes))
			}
		})
	}
	// A lone wake-up keeps the form instances before the array understand.
	ps, _ := pgstore.EncodeWakes([]pgstore.Wake{{Key: sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}, Seq: 3}})
	if want := `{"tenant":"t1","project":"p1","session":"bob","seq":3}`; len(ps) != 1 || ps[0] != want {
		t.Fatalf("payloads = %q, want [%s]", ps, want)
	}
	ps, _ = pgstore.EncodeWakes([]pgstore.Wake{
		{Key: sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}, Seq: 3},
		{Key: sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "eve"}, Seq: 5}})
	if want := `[{"tenant":"t1","project":"p1","session":"bob","seq":3},{"tenant":"t1","project":"p1","session":"eve","seq":5}]`; len(ps) != 1 || ps[0] != want {
		t.Fatalf("payloads = %q, want [%s]", ps, want)
	}
	if ps, err := pgstore.EncodeWakes([]pgstore.Wake{{Key: sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "s"}, Seq: -1}}); err == nil {
		t.Fatalf("EncodeWakes of seq -1 = %q, want an error", ps)
	}
	// Seq 0 is a check wake-up (fabric.CheckSeq), not a signal.
	if k, seq, err := pgstore.DecodeWake(`{"tenant":"t","project":"p","session":"s","seq":0}`); err != nil || seq != 0 || k.SessionID != "s" {
		t.Fatalf("DecodeWake of a check wake-up: %v %d %v", k, seq, err)
	}
}

func TestDecodeWakesRejectsMalformed(t *testing.T) {
	entry := `{"tenant":"t","project":"p","session":"s","seq":1}`
	for _, p := range []string{
		``,
		`[]`,
		`[null]`,
		`[{}]`,
		`[` + entry + `,]`,
		`[` + entry + `,null]`,
		`[` + entry + `,{"tenant":"t","project":"p","session":"s","seq":-1}]`,
		`[` + entry + `,"s"]`,
		`[` + entry + `]]`,
		`[` + entry + `][]`,
		`[` + entry + `] x`,
		`[[` + entry + `]]`,
		`[` + entry,
		`[` + strings.TrimSuffix(strings.Repeat(entry+",", pgstore.MaxWakeBatch+1), ",") + `]`,
		`[` + entry + `,{"tenant":"t","project":"p","session":"s","seq":1,"pad":"` + strings.Repeat("x", pgstore.MaxWakeBatchPayload) + `"}]`,
		`{"tenant":"t","project":"p","session":"s","seq":1,"pad":"` + strings.Repeat("x", pgstore.MaxWakePayload) + `"}`,
	} {
		if ws, err := pgstore.DecodeWakes(p); err == nil {
			t.Errorf("DecodeWakes(%.80q) = %v; want an error", p, ws)
		}
	}
	// Both forms, and unknown fields in either, decode.
	for p, want := range map[string]int{
		entry: 1,
		` [` + entry + `,{"tenant":"t","project":"p","session":"u","seq":2,"v":2}] `:         2,
		`[` + strings.TrimSuffix(strings.Repeat(entry+",", pgstore.MaxWakeBatch), ",") + `]`: pgstore.MaxWakeBatch,
	} {
		if ws, err := pgstore.DecodeWakes(p); err != nil || len(ws) != want {
			t.Errorf("DecodeWakes(%.80q) = %d wake-ups, %v; want %d", p, len(ws), err, want)
		}
	}
}

// FuzzDecodeWake: the payload comes from anyone who can NOTIFY. Decoding
// (either form) never panics; what it accepts encodes back, within the
// bounds, to payloads that decode to the same wake-ups in the same order;
// and the array form's decoder agrees with the object form's.
func FuzzDecodeWake(f *testing.F) {
	f.Add(`{"tenant":"t1","project":"p1","session":"bob","seq":3}`)
	f.Add(`{"tenant":"t","project":"p","session":"s","seq":1,"x":[1,{"y":null}]}`)
	f.Add(`{"tenant":"\u0000","project":"\ud800","session":"s","seq":9223372036854775807}`)
	f.Add(`{`)
	f.Add(`[{"tenant":"t1","project":"p1","session":"bob","seq":3},{"tenant":"t1","project":"p1","session":"eve","seq":4}]`)
	f.Fuzz(func(t *testing.T, payload string) {
		wakes, err := pgstore.DecodeWakes(payload)
		if k, seq, oerr := pgstore.DecodeWake(payload); oerr == nil {
			if err != nil || len(wakes) != 1 || wakes[0] != (pgstore.Wake{Key: k, Seq: seq}) {
				t.Fatalf("DecodeWake(%q) = %v, %d but DecodeWakes = %v, %v", payload, k, seq, wakes, err)
			}
		}
		if err != nil {
			return
		}
		if len(wakes) < 1 || len(wakes) > pgstore.MaxWakeBatch {
			t.Fatalf("DecodeWakes(%q) accepted %d wake-ups", payload, len(wakes))
		}
		ps, err := pgstore.EncodeWakes(wakes)
		if err != nil {
			t.Fatalf("DecodeWakes accepted %q as %v, which EncodeWakes refuses: %v", payload, wakes, err)
		}
		var again []pgstore.Wake
		for _, p := range ps {
			if len(p) > pgstore.MaxWakeBatchPayload {
				t.Fatalf("re-encoded payload of %d bytes", len(p))
			}
			ws, err := pgstore.DecodeWakes(p)
			if err != nil {
				t.Fatalf("re-decoding %q: %v", p, err)
			}
			again = append(again, ws...)
		}
		if !slices.Equal(again, wakes) {
			t.Fatalf("re-decoding %q gave %v, want %v", ps, again, wakes)
		}
	})
}

type wakeup struct {
	k           sessionstore.Key
	seq         int64
	sig         *sessionstore.Signal
	incarnation time.Time
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
		err := bus.Listen(ctx, instance, time.Time{},
			func(wk sessionstore.Wake) {
				select {
				case w <- wakeup{wk.Key, wk.Seq, wk.Signal, wk.Incarnation}:
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

// receive returns the next value from ch, failing t after 10 s.
func receive[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	return testwait.Receive(t, what, 10*time.Second, ch)
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
		if err := p.bus.Publish(ctx, p.instance, sessionstore.Wake{Key: bob, Seq: p.seq}); err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	// Notifications of one sender arrive in order: had b heard seq 1 or 2,
	// it would have come before 3.
	if w := receive(t, "a wake-up", wakes); w != (wakeup{k: bob, seq: 3}) {
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
	if err := busA.Publish(ctx, "b", sessionstore.Wake{Key: bob, Seq: 4}); err != nil {
		t.Fatal(err)
	}
	if w := receive(t, "a wake-up", wakes); w != (wakeup{k: bob, seq: 4}) {
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
	if err := bus.Publish(ctx, "b", sessionstore.Wake{Key: bob, Seq: 7}); err != nil {
		t.Fatal(err)
	}
	if w := receive(t, "a wake-up after the reconnect", wakes); w != (wakeup{k: bob, seq: 7}) {
		t.Fatalf("heard %v, want seq 7", w)
	}
}

// A wake-up carries its signal to the listener byte for byte, with the
// session's incarnation; one that is too large to carry goes bare; and a
// signal in a NOTIFY that any database role could send (no valid MAC) is
// dropped, leaving a bare wake-up that has the holder read the store.
func TestBusCarriesTheSignalOnlyWithAValidMAC(t *testing.T) {
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
	bob := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	registered := time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)
	sig := sessionstore.Signal{ID: "sig-1", Seq: 5, To: bob, FromSession: "alice", Kind: "note",
		Payload: []byte(`{ "spaced" :  [1, 2] }`), CreatedAt: registered.Add(time.Second),
		IdempotencyKey: "k1", Delivery: "pushed_to_ws", RouteState: "attached"}
	if err := bus.Publish(ctx, "b", sessionstore.Wake{Key: bob, Seq: 5, Signal: &sig, Incarnation: registered}); err != nil {
		t.Fatal(err)
	}
	w := receive(t, "a carried signal", wakes)
	if w.sig == nil || w.seq != 5 || !w.incarnation.Equal(registered) {
		t.Fatalf("heard %+v, want seq 5 with its signal and incarnation %v", w, registered)
	}
	got := *w.sig
	if string(got.Payload) != string(sig.Payload) || got.ID != sig.ID || got.FromSession != "alice" || got.Kind != "note" ||
		!got.CreatedAt.Equal(sig.CreatedAt) || got.IdempotencyKey != "k1" || got.Delivery != sig.Delivery || got.RouteState != sig.RouteState || got.To != bob {
		t.Fatalf("carried signal %+v (payload %s), want %+v (payload %s)", got, got.Payload, sig, sig.Payload)
	}

	big := sig
	big.Seq, big.Payload = 6, []byte(`"`+strings.Repeat("x", 8000)+`"`)
	if err := bus.Publish(ctx, "b", sessionstore.Wake{Key: bob, Seq: 6, Signal: &big, Incarnation: registered}); err != nil {
		t.Fatal(err)
	}
	if w := receive(t, "a bare wake-up", wakes); w.seq != 6 || w.sig != nil {
		t.Fatalf("a signal too large to carry: heard %+v, want seq 6, bare", w)
	}

	ch, err := bus.Channel(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	forged := `{"tenant":"t1","project":"p1","session":"bob","seq":7,"registered_at":"2026-01-02T03:04:05.123456Z",` +
		`"signal":{"id":"evil","from":"mallory","kind":"note","payload":"{}","created_at":"2026-01-02T03:04:05Z","delivery":"pushed_to_ws","route_state":"attached"},` +
		`"mac":"` + base64.StdEncoding.EncodeToString(make([]byte, 32)) + `"}`
	if _, err := conn.Exec(ctx, `SELECT pg_notify($1, $2)`, ch, forged); err != nil {
		t.Fatal(err)
	}
	if w := receive(t, "the forged wake-up", wakes); w.seq != 7 || w.sig != nil {
		t.Fatalf("a signal with a forged MAC: heard %+v, want seq 7, bare", w)
	}
}
