package pgstore

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// FuzzAppendWake holds the hand-written encoder to json.Marshal's bytes: a
// bare entry is the wakePayload json.Marshal writes, which every instance,
// old ones included, reads; a sealed part is the wakeSignal json.Marshal
// writes, the payload as it is aside (json.Marshal would compact it).
func FuzzAppendWake(f *testing.F) {
	f.Add("t1", "p1", "bob", int64(3), "sig-1", "alice", "note", `{"a": [1, 2]}`, "k1", "pushed_to_ws", "attached", int64(1764601445123456789))
	f.Add("<&>", "\u2028\u2029", "\x00\x1f\"\\\b\f\n\r\t", int64(0), "\xff\xfe", "é", "", `"x"`, "", "", "", int64(-62135596800))
	f.Add("t", "p", "s", int64(1<<62), "i", "f", "k", ` {}`, "", "d", "r", int64(253402300800))
	f.Fuzz(func(t *testing.T, tenant, project, session string, seq int64, id, from, kind, payload, idem, delivery, route string, unix int64) {
		k := sessionstore.Key{TenantID: tenant, ProjectID: project, SessionID: session}
		at := time.Unix(0, 0).Add(time.Duration(unix)).UTC()
		if unix%2 != 0 {
			at = time.Unix(unix, 0).UTC()
		}
		sig := sessionstore.Signal{ID: id, Seq: seq, To: k, FromSession: from, Kind: kind, Payload: []byte(payload),
			CreatedAt: at, IdempotencyKey: idem, Delivery: marconi.Delivery(delivery), RouteState: marconi.RouteState(route)}

		got, err := wakeCodec{}.entry(Wake{Key: k, Seq: seq})
		if validateWake(k, seq) != nil {
			if err == nil {
				t.Fatalf("entry accepted %v/%d, which validate refuses", k, seq)
			}
			return
		}
		want, merr := json.Marshal(wakePayload{Tenant: tenant, Project: project, Session: session, Seq: &seq})
		if err != nil || merr != nil || !bytes.Equal(got, want) {
			t.Fatalf("bare entry\n got %s, %v\nwant %s, %v", got, err, want, merr)
		}

		for _, p := range [][]byte{nil, []byte(payload)} {
			sig.Payload = p
			got, ok := appendWakeSignal(nil, &sig, at)
			want, merr := json.Marshal(wakeSignal{RegisteredAt: at, ID: id, From: from, Kind: kind, CreatedAt: at,
				IdempotencyKey: idem, Delivery: string(sig.Delivery), RouteState: string(sig.RouteState)})
			if merr != nil {
				if ok {
					t.Fatalf("appendWakeSignal wrote %s where json.Marshal fails: %v", got, merr)
				}
				continue
			}
			if !ok {
				if p == nil {
					t.Fatalf("appendWakeSignal refused a signal json.Marshal writes as %s", want)
				}
				continue
			}
			if p != nil { // the payload as it is, before "created_at"
				i := bytes.Index(want, []byte(`,"created_at":`))
				want = append(append(append(want[:i:i], `,"payload":`...), p...), want[i:]...)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("sealed part\n got %s\nwant %s", got, want)
			}
			var back wakeSignal
			if err := json.Unmarshal(got, &back); err != nil || !bytes.Equal(back.Payload, p) {
				t.Fatalf("sealed part %s decodes to payload %q, %v; want %q", got, back.Payload, err, p)
			}
		}
	})
}

// oldWakePayload and oldWakeSignal are the wake-up of the form before
// "sealed" and "tag" (up to f273fd3), which carried its signal in "signal"
// under a "mac" over the entry's JSON re-encoded; oldSeal seals one so.
type oldWakePayload struct {
	Tenant       string         `json:"tenant"`
	Project      string         `json:"project"`
	Session      string         `json:"session"`
	Seq          *int64         `json:"seq"`
	RegisteredAt *time.Time     `json:"registered_at,omitempty"`
	Signal       *oldWakeSignal `json:"signal,omitempty"`
	MAC          []byte         `json:"mac,omitempty"`
}

type oldWakeSignal struct {
	ID             string    `json:"id"`
	From           string    `json:"from"`
	Kind           string    `json:"kind"`
	Payload        *string   `json:"payload,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	Delivery       string    `json:"delivery"`
	RouteState     string    `json:"route_state"`
}

func oldSeal(t *testing.T, key []byte, p oldWakePayload) string {
	t.Helper()
	unsealed, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	h := hmac.New(sha256.New, key)
	h.Write(unsealed)
	p.MAC = h.Sum(nil)
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Old and new instances side by side (a rolling upgrade) lose no wake-up:
// each reads the other's carried wake-up as a bare one, whose holder then
// reads the signal from the store, and neither refuses the other's payload.
func TestCarriedWakeAcrossVersions(t *testing.T) {
	bob := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	at := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	sig := sessionstore.Signal{ID: "s1", Seq: 4, To: bob, FromSession: "alice", Kind: "note",
		Payload: []byte(`{"a": [1, 2]}`), CreatedAt: at, Delivery: "pushed_to_ws", RouteState: "attached"}
	codec := wakeCodec{key: fuzzBusKey}

	// New to old: the old decoder (the same json.Decoder into its struct,
	// validate, then its MAC check, which needs "signal" and "mac") gets a
	// well-formed bare wake-up, in either form.
	ps, err := codec.encode([]Wake{{Key: bob, Seq: 4, Signal: &sig, Incarnation: at}, {Key: bob, Seq: 5}})
	if err != nil || len(ps) != 1 || !strings.Contains(ps[0], `"sealed":`) {
		t.Fatalf("encode = %q, %v; want one payload with a sealed signal", ps, err)
	}
	single, err := codec.encode([]Wake{{Key: bob, Seq: 4, Signal: &sig, Incarnation: at}})
	if err != nil || len(single) != 1 {
		t.Fatalf("encode = %q, %v", single, err)
	}
	var old []oldWakePayload
	var one oldWakePayload
	if err := json.Unmarshal([]byte(ps[0]), &old); err != nil || len(old) != 2 {
		t.Fatalf("an old instance reads %q as %+v, %v; want 2 wake-ups", ps[0], old, err)
	}
	if err := json.Unmarshal([]byte(single[0]), &one); err != nil {
		t.Fatalf("an old instance refuses %q: %v", single[0], err)
	}
	for _, p := range append(old, one) {
		if p.Seq == nil || *p.Seq < 4 || p.Tenant != "t1" || p.Session != "bob" || p.Signal != nil || p.MAC != nil {
			t.Errorf("an old instance reads %+v; want a bare wake-up of bob", p)
		}
	}

	// Old to new: a carried wake-up correctly sealed the old way is bare
	// here, in either form.
	seq := int64(4)
	payload := string(sig.Payload)
	o := oldSeal(t, fuzzBusKey, oldWakePayload{Tenant: "t1", Project: "p1", Session: "bob", Seq: &seq, RegisteredAt: &at,
		Signal: &oldWakeSignal{ID: "s1", From: "alice", Kind: "note", Payload: &payload, CreatedAt: at, Delivery: "pushed_to_ws", RouteState: "attached"}})
	for _, p := range []string{o, "[" + o + `,{"tenant":"t1","project":"p1","session":"bob","seq":5}]`} {
		ws, err := codec.decode(p)
		if err != nil || len(ws) == 0 || ws[0].Key != bob || ws[0].Seq != 4 || ws[0].Signal != nil {
			t.Errorf("decode(%.60q) = %+v, %v; want a bare wake-up of bob, seq 4", p, ws, err)
		}
	}
}

// Any one byte of a sealed wake-up changed, its signal is not carried: the
// payload is refused, or the wake-up goes bare. The tag's base64 included:
// a text of the same tag with other padding bits is refused too.
func TestSealedWakeRefusesEveryAlteredByte(t *testing.T) {
	bob := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	at := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	sig := sessionstore.Signal{ID: "s1", Seq: 4, To: bob, FromSession: "alice", Kind: "note",
		Payload: []byte(`{"a": [1, 2]}`), CreatedAt: at, IdempotencyKey: "k", Delivery: "pushed_to_ws", RouteState: "attached"}
	want := Wake{Key: bob, Seq: 4, Signal: &sig, Incarnation: at}
	codec := wakeCodec{key: fuzzBusKey}
	ps, err := codec.encode([]Wake{want})
	if err != nil || len(ps) != 1 {
		t.Fatalf("encode = %q, %v", ps, err)
	}
	if ws, err := codec.decode(ps[0]); err != nil || len(ws) != 1 || !sameWake(ws[0], want) {
		t.Fatalf("decode = %+v, %v; want %+v", ws, err, want)
	}
	if _, ok := codec.openSealed(new(openTally), ps[0]); !ok {
		t.Fatalf("openSealed declines %q, as entry wrote it", ps[0])
	}
	for i := range len(ps[0]) {
		for _, c := range []byte{'0', 'a', '"', ' ', ps[0][i] ^ 1} {
			if c == ps[0][i] {
				continue
			}
			p := ps[0][:i] + string(c) + ps[0][i+1:]
			if ws, err := codec.decode(p); err == nil && len(ws) == 1 && ws[0].Signal != nil {
				t.Errorf("byte %d changed to %q: decode(%q) carried %+v; want it refused or bare", i, c, p, ws[0].Signal)
			}
		}
	}
	// A line break inside the tag's text, which base64 decoders skip.
	in := strings.Index(ps[0], `"tag":"`) + len(`"tag":"`) + 8
	for _, nl := range []string{`\n`, `\r\n`, `\u000a`} {
		p := ps[0][:in] + nl + ps[0][in:]
		if ws, err := codec.decode(p); err == nil && len(ws) == 1 && ws[0].Signal != nil {
			t.Errorf("decode(%q) carried %+v; want it refused or bare", p, ws[0].Signal)
		}
	}
}

// FuzzOpenSealed holds decode's way without reflection to its general way:
// a sealed wake-up of any fields, and any one byte of it changed, opens to
// the same wake-up both ways, carried signal included, or openSealed
// declines it.
func FuzzOpenSealed(f *testing.F) {
	f.Add("t1", "p1", "bob", int64(3), "sig-1", "alice", "note", `{"a": [1, 2]}`, "k1", "pushed_to_ws", "attached", int64(1764601445123456789), uint16(0), byte(0))
	f.Add("t", "p", "s", int64(0), "i", "f", "k", `",\"created_at\":\""`, "", "d", "r", int64(-1), uint16(200), byte('"'))
	f.Add("<&>", "é", "s", int64(9), "i\\", "f", "k", `null`, "x", "", "", int64(7), uint16(100), byte('}'))
	f.Fuzz(func(t *testing.T, tenant, project, session string, seq int64, id, from, kind, payload, idem, delivery, route string, unix int64, at uint16, to byte) {
		k := sessionstore.Key{TenantID: tenant, ProjectID: project, SessionID: session}
		created := time.Unix(0, unix).UTC()
		sig := sessionstore.Signal{ID: id, Seq: seq, To: k, FromSession: from, Kind: kind, CreatedAt: created,
			IdempotencyKey: idem, Delivery: marconi.Delivery(delivery), RouteState: marconi.RouteState(route)}
		if payload != "" {
			sig.Payload = []byte(payload)
		}
		codec := wakeCodec{key: fuzzBusKey}
		b, err := codec.entry(Wake{Key: k, Seq: seq, Signal: &sig, Incarnation: created.Add(-time.Hour)})
		if err != nil {
			return
		}
		for _, p := range []string{string(b), string(b[:int(at)%len(b)]) + string(to) + string(b[int(at)%len(b)+1:])} {
			w, ok := codec.openSealed(new(openTally), p)
			if !ok {
				continue
			}
			ws, err := codec.decodeJSON(new(openTally), p)
			if err != nil || len(ws) != 1 || !sameWake(ws[0], w) || !bytes.Equal(ws[0].Signal.Payload, w.Signal.Payload) {
				t.Fatalf("openSealed(%q) = %+v; decodeJSON = %+v, %v", p, w, ws, err)
			}
		}
	})
}
