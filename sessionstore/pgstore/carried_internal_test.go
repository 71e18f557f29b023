package pgstore

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

var fuzzBusKey = bytes.Repeat([]byte{7}, 32)

// sameWake reports whether a and b are the same wake-up, carried signal
// included.
func sameWake(a, b Wake) bool {
	if a.Key != b.Key || a.Seq != b.Seq || (a.Signal == nil) != (b.Signal == nil) {
		return false
	}
	if a.Signal == nil {
		return true
	}
	x, y := *a.Signal, *b.Signal
	return a.Incarnation.Equal(b.Incarnation) && x.ID == y.ID && x.Seq == y.Seq && x.To == y.To &&
		x.FromSession == y.FromSession && x.Kind == y.Kind && bytes.Equal(x.Payload, y.Payload) &&
		x.CreatedAt.Equal(y.CreatedAt) && x.IdempotencyKey == y.IdempotencyKey &&
		x.Delivery == y.Delivery && x.RouteState == y.RouteState
}

// FuzzDecodeCarriedWake: a payload anyone may NOTIFY never panics the
// decoder with a key; a signal it accepts carried came sealed under that
// key, and encodes and decodes back to the same wake-ups.
func FuzzDecodeCarriedWake(f *testing.F) {
	bob := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	at := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	sig := sessionstore.Signal{ID: "s1", Seq: 4, To: bob, FromSession: "alice", Kind: "note",
		Payload: []byte(`{"a": [1, 2]}`), CreatedAt: at, Delivery: "pushed_to_ws", RouteState: "attached"}
	codec := wakeCodec{key: fuzzBusKey}
	for _, ws := range [][]Wake{
		{{Key: bob, Seq: 4, Signal: &sig, Incarnation: at}},
		{{Key: bob, Seq: 4, Signal: &sig, Incarnation: at}, {Key: bob, Seq: 5}},
	} {
		ps, err := codec.encode(ws)
		if err != nil {
			f.Fatal(err)
		}
		for _, p := range ps {
			f.Add(p)
			f.Add(strings.Replace(p, `"alice"`, `"mallory"`, 1)) // tampered: goes bare
		}
	}
	f.Add(`{"tenant":"t1","project":"p1","session":"bob","seq":3,"signal":{"id":"x"},"mac":"AAAA"}`)
	f.Fuzz(func(t *testing.T, payload string) {
		wakes, err := codec.decode(payload)
		if err != nil {
			return
		}
		for _, w := range wakes {
			if w.Signal != nil && (w.Signal.Seq != w.Seq || w.Signal.To != w.Key) {
				t.Fatalf("carried signal %+v does not match its wake-up %v/%d", *w.Signal, w.Key, w.Seq)
			}
		}
		ps, err := codec.encode(wakes)
		if err != nil {
			t.Fatalf("decode accepted %q as %v, which encode refuses: %v", payload, wakes, err)
		}
		var again []Wake
		for _, p := range ps {
			ws, err := codec.decode(p)
			if err != nil {
				t.Fatalf("re-decoding %q: %v", p, err)
			}
			again = append(again, ws...)
		}
		if len(again) != len(wakes) {
			t.Fatalf("round trip of %q: %d wake-ups, want %d", payload, len(again), len(wakes))
		}
		for i := range wakes {
			// A carried signal too large to carry again goes bare; otherwise
			// the round trip keeps it.
			if !sameWake(again[i], wakes[i]) && !(again[i].Signal == nil && again[i].Key == wakes[i].Key && again[i].Seq == wakes[i].Seq) {
				t.Fatalf("round trip of %q: wake-up %d is %+v, want %+v", payload, i, again[i], wakes[i])
			}
		}
	})
}

// A sealed wake-up decodes with its signal under the key it was sealed
// with, and bare under another key or none.
func TestCarriedWakeNeedsTheKey(t *testing.T) {
	bob := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	sig := sessionstore.Signal{ID: "s1", Seq: 2, To: bob, FromSession: "alice", Kind: "note", Payload: []byte(`"hi"`),
		CreatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	ps, err := wakeCodec{key: fuzzBusKey}.encode([]Wake{{Key: bob, Seq: 2, Signal: &sig}})
	if err != nil || len(ps) != 1 {
		t.Fatalf("encode: %v, %d payloads", err, len(ps))
	}
	for _, tc := range []struct {
		name    string
		key     []byte
		carried bool
	}{{"same key", fuzzBusKey, true}, {"another key", bytes.Repeat([]byte{8}, 32), false}, {"no key", nil, false}} {
		ws, err := wakeCodec{key: tc.key}.decode(ps[0])
		if err != nil || len(ws) != 1 || ws[0].Seq != 2 || (ws[0].Signal != nil) != tc.carried {
			t.Errorf("%s: decode = %+v, %v; want seq 2, carried %v", tc.name, ws, err, tc.carried)
		}
	}
}

// BenchmarkSealOpenWake: what one carried wake-up costs the sender's
// instance (seal) and the holder's (open), as on the NATS bus: one wake-up
// per payload, a signal of a typical size.
func BenchmarkSealOpenWake(b *testing.B) {
	bob := sessionstore.Key{TenantID: "tenant-0001", ProjectID: "project-0001", SessionID: "session-bench-0042"}
	at := time.Date(2026, 12, 1, 15, 4, 5, 123456789, time.UTC)
	sig := sessionstore.Signal{ID: "0193c1d2-7f4e-7a3b-9c1d-2e3f4a5b6c7d", Seq: 1234, To: bob, FromSession: "session-bench-0007",
		Kind: "message", Payload: []byte(`{"text":"hello from the bench","n":42,"tags":["a","b"]}`), CreatedAt: at,
		IdempotencyKey: "idem-0001", Delivery: "pushed_to_ws", RouteState: "attached"}
	wakes := []Wake{{Key: bob, Seq: 1234, Signal: &sig, Incarnation: at.Add(-time.Hour)}}
	codec := wakeCodec{key: fuzzBusKey}
	ps, err := codec.encode(wakes)
	if err != nil || len(ps) != 1 {
		b.Fatalf("encode: %v, %d payloads", err, len(ps))
	}
	b.Run("seal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := codec.encode(wakes); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("open", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ws, err := codec.decode(ps[0])
			if err != nil || len(ws) != 1 || ws[0].Signal == nil {
				b.Fatalf("decode: %v, %v", ws, err)
			}
		}
	})
}
