package conns

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// The signal frame is written by appendSignalFrame, and pinned on the wire as
// json.Marshal writes signalFrame: the two must agree byte for byte, and on
// what they refuse.
func checkSignalFrame(t *testing.T, sig sessionstore.Signal) {
	t.Helper()
	want, wantErr := json.Marshal(signalFrame{Type: "signal", Signal: WireSignal(sig)})
	prefix := []byte("kept")
	got, err := appendSignalFrame(bytes.Clone(prefix), sig)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("%+v: error %v, json.Marshal's %v", sig, err, wantErr)
	}
	if !bytes.HasPrefix(got, prefix) {
		t.Fatalf("%+v: what dst held is gone: %q", sig, got)
	}
	if wantErr == nil && !bytes.Equal(got[len(prefix):], want) {
		t.Fatalf("%+v:\n got %s\nwant %s", sig, got[len(prefix):], want)
	}
}

func TestSignalFrameIsJSONMarshal(t *testing.T) {
	at := time.Date(2026, 11, 30, 16, 40, 5, 123456789, time.FixedZone("x", 3600))
	plain := sessionstore.Signal{
		ID: "0b7c2d4e-1f3a-4b5c-8d9e-0f1a2b3c4d5e", Seq: 42, FromSession: "agent-a.1",
		To: sessionstore.Key{SessionID: "agent_b"}, Kind: "task:done/v1", Payload: json.RawMessage(`{"n": 1, "s": "x y"}`),
		CreatedAt: at,
	}
	with := func(f func(*sessionstore.Signal)) sessionstore.Signal {
		s := plain
		f(&s)
		return s
	}
	for name, sig := range map[string]sessionstore.Signal{
		"plain":                plain,
		"nil payload":          with(func(s *sessionstore.Signal) { s.Payload = nil }),
		"empty payload":        with(func(s *sessionstore.Signal) { s.Payload = json.RawMessage{} }),
		"invalid payload":      with(func(s *sessionstore.Signal) { s.Payload = json.RawMessage(`{"a":`) }),
		"spaced payload":       with(func(s *sessionstore.Signal) { s.Payload = json.RawMessage(" [1,\n 2 ,\t{} ] ") }),
		"html in payload":      with(func(s *sessionstore.Signal) { s.Payload = json.RawMessage(`{"h":"<b>&</b>"}`) }),
		"separators":           with(func(s *sessionstore.Signal) { s.Payload = json.RawMessage("\"a\u2028b\u2029\"") }),
		"unicode payload":      with(func(s *sessionstore.Signal) { s.Payload = json.RawMessage(`"é\u00e9🙂"`) }),
		"escaped kind":         with(func(s *sessionstore.Signal) { s.Kind = "a\"b\\c<d>&\n\x01é\xff\u2028" }),
		"empty strings":        with(func(s *sessionstore.Signal) { s.ID, s.FromSession, s.To.SessionID, s.Kind = "", "", "", "" }),
		"negative seq":         with(func(s *sessionstore.Signal) { s.Seq = -1 }),
		"zero time":            with(func(s *sessionstore.Signal) { s.CreatedAt = time.Time{} }),
		"whole second":         with(func(s *sessionstore.Signal) { s.CreatedAt = time.Unix(1700000000, 0) }),
		"year json cannot say": with(func(s *sessionstore.Signal) { s.CreatedAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }),
	} {
		t.Run(name, func(t *testing.T) { checkSignalFrame(t, sig) })
	}
}

func FuzzSignalFrame(f *testing.F) {
	f.Add("id", int64(1), "from", "to", "kind", []byte(`{"a":[1,2]}`), int64(1764520805123456789), false)
	f.Add("<&>", int64(-7), "é", "\x00", "\u2028", []byte(" \"<\" "), int64(0), true)
	f.Fuzz(func(t *testing.T, id string, seq int64, from, to, kind string, payload []byte, nanos int64, nilPayload bool) {
		if nilPayload {
			payload = nil
		}
		checkSignalFrame(t, sessionstore.Signal{
			ID: id, Seq: seq, FromSession: from, To: sessionstore.Key{SessionID: to}, Kind: kind,
			Payload: payload, CreatedAt: time.Unix(0, nanos),
		})
	})
}

// BenchmarkSignalFrame is the encoding of a push's frame: as it was
// (json.Marshal) and as the writer does it (appendSignalFrame into a reused buffer).
func BenchmarkSignalFrame(b *testing.B) {
	sig := sessionstore.Signal{
		ID: "0b7c2d4e-1f3a-4b5c-8d9e-0f1a2b3c4d5e", Seq: 42, FromSession: "sender",
		To: sessionstore.Key{SessionID: "receiver"}, Kind: "bench", Payload: json.RawMessage(`{"n":1234}`),
		CreatedAt: time.Now(),
	}
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(signalFrame{Type: "signal", Signal: WireSignal(sig)}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			var err error
			if buf, err = appendSignalFrame(buf[:0], sig); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A client frame is decoded by decodeClientFrame as json.Unmarshal decodes
// it: the same frame, and an error exactly when json.Unmarshal errs, of the
// same type (the reader tells a field of the wrong type from bad JSON).
func FuzzDecodeClientFrame(f *testing.F) {
	for _, s := range []string{
		`{"type":"ack","up_to_seq":0}`, `{"type":"ack","up_to_seq":17}`, `{"type":"ack","up_to_seq":007}`,
		`{"type":"ack","up_to_seq":123456789012345678}`, `{"type":"ack","up_to_seq":9223372036854775808}`,
		`{"type":"ack","up_to_seq":-1}`, `{"type":"ack","up_to_seq":1.5}`, `{"type":"ack","up_to_seq":1} `,
		`{"type":"ack","up_to_seq":1}}`, `{"type":"ack","up_to_seq":}`, `{"type":"ack","up_to_seq":"1"}`,
		`{"type":"ack","up_to_seq":1,"up_to_seq":2}`, `{"type":"ping"}`, `{"up_to_seq":3,"type":"ack"}`, `not json`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := decodeClientFrame(data)
		var want clientFrame
		wantErr := json.Unmarshal(data, &want)
		if (err == nil) != (wantErr == nil) || (err != nil && fmt.Sprintf("%T", err) != fmt.Sprintf("%T", wantErr)) {
			t.Fatalf("%q: error %v, json.Unmarshal's %v", data, err, wantErr)
		}
		if err != nil {
			return
		}
		if got.Type != want.Type || (got.UpToSeq == nil) != (want.UpToSeq == nil) ||
			(got.UpToSeq != nil && *got.UpToSeq != *want.UpToSeq) {
			t.Fatalf("%q: %+v, json.Unmarshal's %+v", data, got, want)
		}
	})
}

// BenchmarkDecodeAck is the decoding of a client's ack: as it was
// (json.Unmarshal) and as the reader does it.
func BenchmarkDecodeAck(b *testing.B) {
	frame := []byte(`{"type":"ack","up_to_seq":123456}`)
	b.Run("json.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var f clientFrame
			if err := json.Unmarshal(frame, &f); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decodeClientFrame", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeClientFrame(frame); err != nil {
				b.Fatal(err)
			}
		}
	})
}
