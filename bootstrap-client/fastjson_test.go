package bootstrap

import (
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// hubSendAnswers are send answers as the hub writes them
// (hub/sendanswer.go), and others encoding/json reads alike.
var hubSendAnswers = []string{
	`{"signal_id":"0193a1f2-7c4e-7b3a-9d2e-5f6a7b8c9d0e","seq":17,"delivery":"pushed_to_ws","recipient_route_state":"attached","recipient_instance_url":"http://127.0.0.1:8080","selfheal_outcome":null,"selfheal":{"recipient":null,"sender":null},"duplicate":false,"pending":null}` + "\n",
	`{"signal_id":"s2","seq":1,"delivery":"queued_offline","recipient_route_state":"route_without_queue","selfheal_outcome":"attempted","recipient_route_stale":true,"sender_route_stale":true,"selfheal":{"recipient":"attempted","sender":"attempted"},"duplicate":true,"pending":[]}` + "\n",
}

// hubFrames are signal frames as the hub writes them (hub/conns/frames.go).
var hubFrames = []string{
	`{"type":"signal","id":"0193a1f2-7c4e-7b3a-9d2e-000000000017","seq":17,"from_session":"s-1","to_session":"r-1","kind":"bench","payload":"xxxxxxxx","created_at":"2026-12-01T21:40:32.123456Z"}`,
	`{"type":"signal","id":"a","seq":9007199254740993,"from_session":"s","to_session":"r","kind":"signal","payload":{"x":[1,2.5e3,{"y":"\u00e9"}],"z":null},"created_at":"2026-12-01T21:40:32Z"}`,
	`{"type":"welcome","session_id":"r-1","instance_id":"hub-1","resumed":false,"affinity_reset":false,"replayed":0}`,
}

// Inputs the hand-written decoders must leave to encoding/json, or read
// exactly as it does.
var oddJSON = []string{
	``, `null`, `[]`, `{}`, ` { } `, `{"seq":1}x`, `{"seq":1,}`, `{"seq":}`, `{"seq" 1}`, `{"seq":1 "kind":"a"}`,
	`{"SEQ":3}`, `{"Seq":3,"seq":4}`, `{"seq":1e3}`, `{"seq":01}`, `{"seq":-0}`, `{"seq":-}`, `{"seq":1.0}`,
	`{"seq":99999999999999999999}`, `{"seq":null}`, `{"seq":"3"}`, `{"seq":3,"seq":4}`,
	`{"id":"a\"b"}`, `{"id":"a\u0041"}`, `{"id":"\u00e9t\u00e9"}`, "{\"id\":\"\xff\"}", "{\"id\":\"\t\"}", `{"id":"été"}`,
	`{"id":null}`, `{"id":"a","id":null}`, `{"id":1}`, `{"i\u0064":"a"}`, "{\"\u212aind\":\"a\"}",
	`{"payload":null}`, `{"payload":[1,2}`, `{"payload":{"a":1}}`, `{"payload":tru}`, `{"payload": 1 }`,
	`{"created_at":null}`, `{"created_at":"2026-12-01"}`, `{"created_at":"2026-12-01T21:40:32.1+01:00"}`,
	`{"duplicate":1}`, `{"duplicate":null}`, `{"duplicate":true,"duplicate":false}`,
	`{"selfheal_outcome":"a","selfheal_outcome":null}`, `{"selfheal_outcome":null,"selfheal_outcome":"a"}`,
	`{"pending":[ ]}`, `{"pending":[{"id":"p"}]}`, `{"pending":{}}`, `{"pending":null}`,
	`{"unknown":{"a":[1,{"b":"]"}]},"seq":2}`, `{"unknown":"\"}","seq":2}`, `{"unknown":[1,]}`, `{"unknown":}`,
	`{"type":"signal","type":null}`, `{"kind":"a"}`, `{"a":"b"`, `{"a"`, `{"a":"b`, `{`, `"a"`,
}

func TestFastSendResponseMatchesEncodingJSON(t *testing.T) {
	for _, in := range hubSendAnswers {
		var r sendResponse
		if !fastSendResponse([]byte(in), &r) {
			t.Errorf("the hub's answer %s went to encoding/json", in)
		}
		checkSendResponse(t, []byte(in))
	}
	for _, in := range oddJSON {
		checkSendResponse(t, []byte(in))
	}
}

func TestFrameDecoderMatchesEncodingJSON(t *testing.T) {
	var d frameDecoder
	for _, in := range hubFrames[:2] {
		var f frame
		if !d.fast([]byte(in), &f) {
			t.Errorf("the hub's frame %s went to encoding/json", in)
		}
	}
	for _, in := range append(append([]string{}, hubFrames...), oddJSON...) {
		checkFrame(t, &d, []byte(in))
	}
}

// A signal frame costs its id and its payload; the sessions and kind of
// the frame before are shared.
func TestFrameDecoderAllocations(t *testing.T) {
	var d frameDecoder
	data := []byte(hubFrames[0])
	var f frame
	allocs := testing.AllocsPerRun(100, func() {
		if err := d.decode(data, &f); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 2 {
		t.Errorf("%.0f allocations a frame, want 2 (its id and its payload)", allocs)
	}
	if f.FromSession != "s-1" || f.ToSession != "r-1" || f.Kind != "bench" || string(f.Payload) != `"xxxxxxxx"` {
		t.Errorf("decoded %+v", f)
	}
}

func TestAppendSendRequestMatchesEncodingJSON(t *testing.T) {
	for _, tc := range []struct{ to, kind, key string }{
		{"r-1", "bench", "bc-ABCDEFGHIJKLMNOPQRSTUVWXYZ"},
		{"r-1", "", ""},
		{`a"b\c`, "<&>", "\u2028\xff\x01é"},
	} {
		for _, payload := range []any{"xxxx", map[string]any{"a": []int{1, 2}, "h": "<b>"}, nil, json.RawMessage(`{ "a" : 1 }`)} {
			checkSendRequest(t, tc.to, tc.kind, tc.key, payload)
		}
	}
}

func TestAppendAckFrameMatchesEncodingJSON(t *testing.T) {
	for _, n := range []int64{1, 17, 9007199254740993} {
		want, _ := json.Marshal(ackRequest{Type: "ack", UpToSeq: n})
		if got := appendAckFrame(nil, n); string(got) != string(want) {
			t.Errorf("ack %d: %s, want %s", n, got, want)
		}
	}
}

func checkSendResponse(t *testing.T, in []byte) {
	t.Helper()
	var want sendResponse
	wantErr := json.Unmarshal(in, &want)
	var got sendResponse
	if fastSendResponse(in, &got) {
		if wantErr != nil {
			t.Fatalf("%q: read by hand as %+v; encoding/json: %v", in, got, wantErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: read by hand as %+v, by encoding/json as %+v", in, got, want)
		}
	}
	err := decodeSendResponse(in, &got)
	if (err == nil) != (wantErr == nil) || (err == nil && !reflect.DeepEqual(got, want)) {
		t.Fatalf("%q: decodeSendResponse %+v, %v; encoding/json %+v, %v", in, got, err, want, wantErr)
	}
}

func checkFrame(t *testing.T, d *frameDecoder, in []byte) {
	t.Helper()
	var want frame
	wantErr := json.Unmarshal(in, &want)
	for _, dec := range []*frameDecoder{d, {}} { // one that has seen frames before, and a fresh one
		var got frame
		if dec.fast(in, &got) {
			if wantErr != nil {
				t.Fatalf("%q: read by hand as %+v; encoding/json: %v", in, got, wantErr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%q: read by hand as %+v, by encoding/json as %+v", in, got, want)
			}
		}
		err := dec.decode(in, &got)
		if (err == nil) != (wantErr == nil) || (err == nil && !reflect.DeepEqual(got, want)) {
			t.Fatalf("%q: decode %+v, %v; encoding/json %+v, %v", in, got, err, want, wantErr)
		}
	}
}

func checkSendRequest(t *testing.T, to, kind, key string, payload any) {
	t.Helper()
	raw, err := json.Marshal(payload)
	if err != nil {
		return // Send refuses it before encoding
	}
	req := sendRequest{ToSession: to, Kind: kind, Payload: raw, IdempotencyKey: key}
	want, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := appendSendRequest(nil, &req); string(got) != string(want) {
		t.Fatalf("appendSendRequest %s, json.Marshal %s", got, want)
	}
}

func FuzzSendResponse(f *testing.F) {
	for _, s := range append(append([]string{}, hubSendAnswers...), oddJSON...) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) { checkSendResponse(t, in) })
}

func FuzzFrame(f *testing.F) {
	for _, s := range append(append([]string{}, hubFrames...), oddJSON...) {
		f.Add([]byte(s))
	}
	var d frameDecoder
	f.Fuzz(func(t *testing.T, in []byte) { checkFrame(t, &d, in) })
}

func FuzzSendRequest(f *testing.F) {
	f.Add("r-1", "bench", "bc-1", "xxxx")
	f.Add(`a"<`, "\u2028", "\xff", `{"a":1}`)
	f.Fuzz(func(t *testing.T, to, kind, key, payload string) {
		checkSendRequest(t, to, kind, key, payload)
		if json.Valid([]byte(payload)) {
			checkSendRequest(t, to, kind, key, json.RawMessage(payload))
		}
		checkSendRequest(t, to, kind, key, map[string]string{"text": payload, strings.ToUpper(payload): to})
	})
}

// A generated idempotency key is "bc-" and a UUIDv7, never the same twice,
// and each one made sorts after the one before (in byte order, as in the
// store's index), so that a sender's keys are added at the end of it.
func TestNewIdempotencyKey(t *testing.T) {
	seen := map[string]bool{}
	last := ""
	for range 1000 {
		k := newIdempotencyKey()
		if !idempotencyKeyForm.MatchString(k) {
			t.Fatalf("key %q, want bc- and a UUIDv7", k)
		}
		if u, err := uuid.Parse(k[3:]); err != nil || u.Version() != 7 || u.String() != k[3:] {
			t.Fatalf("key %q: not bc- and a UUIDv7 as uuid writes it (%v)", k, err)
		}
		if seen[k] {
			t.Fatalf("key %q made twice", k)
		}
		if k <= last {
			t.Fatalf("key %q made after %q sorts before it", k, last)
		}
		seen[k], last = true, k
	}
}

var idempotencyKeyForm = regexp.MustCompile(`^bc-[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
