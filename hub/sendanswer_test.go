package hub

import (
	"bytes"
	"encoding/json"
	"testing"
)

// encoded is a as c.JSON writes it: a json.Encoder, HTML escaping on, and
// its newline.
func encoded(t testing.TB, a sendResponse) []byte {
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(a); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func strp(s string) *string { return &s }

// TestAppendSendAnswer: every answer appendSendAnswer writes is the bytes
// encoding/json writes, and it declines those it cannot write so.
func TestAppendSendAnswer(t *testing.T) {
	tests := []struct {
		name   string
		a      sendResponse
		writes bool
	}{
		{"pushed", sendResponse{SignalID: "0b6f2d1e-9c1a-4a52-8d8e-3f1f7c2b9a10", Seq: 42, Delivery: "pushed_to_ws", RecipientRouteState: "attached", Pending: []signalJSON{}}, true},
		{"nil pending", sendResponse{SignalID: "s", Seq: 1, Delivery: "queued_offline", RecipientRouteState: "offline"}, true},
		{"duplicate", sendResponse{SignalID: "s", Seq: 1, Delivery: "queued_offline", RecipientRouteState: "offline", Duplicate: true}, true},
		{"selfheal", sendResponse{SignalID: "s", Seq: -3, Delivery: "queued_offline", RecipientRouteState: "stale",
			SelfhealOutcome: strp("nudged"), RecipientRouteStale: true, SenderRouteStale: true,
			Selfheal: selfhealJSON{Recipient: strp("reattach"), Sender: strp("")}}, true},
		{"recipient stale only", sendResponse{SignalID: "s", RecipientRouteStale: true, Selfheal: selfhealJSON{Sender: strp("x")}}, true},
		{"empty", sendResponse{}, true},
		{"holder", sendResponse{SignalID: "s", Seq: 2, Delivery: "pushed_to_ws", RecipientRouteState: "attached",
			RecipientInstanceURL: "http://lb.example:8080/i/hub-2"}, true},
		{"history", sendResponse{SignalID: "s", Seq: 3, Delivery: "queued_offline", RecipientRouteState: "route_without_queue",
			Pending: []signalJSON{}, History: "9f86d081884c7d65"}, true},
		{"html in a string", sendResponse{SignalID: "a<b>&c", Delivery: "pushed_to_ws"}, false},
		{"quote in a string", sendResponse{SignalID: `a"b`}, false},
		{"unicode in a string", sendResponse{SignalID: "é"}, false},
		{"escaped outcome", sendResponse{SelfhealOutcome: strp("a\nb")}, false},
		{"pending", sendResponse{SignalID: "s", Pending: []signalJSON{{ID: "p", Seq: 1, Kind: "k"}}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := appendSendAnswer([]byte("prefix"), &tt.a)
			if ok != tt.writes {
				t.Fatalf("appendSendAnswer wrote it: %v, want %v", ok, tt.writes)
			}
			if want := append([]byte("prefix"), encoded(t, tt.a)...); ok && !bytes.Equal(got, want) {
				t.Fatalf("appendSendAnswer:\n got %s\nwant %s", got, want)
			}
		})
	}
}

// FuzzAppendSendAnswer: for any strings and flags, appendSendAnswer either
// declines or writes exactly what encoding/json writes.
func FuzzAppendSendAnswer(f *testing.F) {
	f.Add("0b6f2d1e-9c1a-4a52-8d8e-3f1f7c2b9a10", int64(7), "pushed_to_ws", "attached", "", "", "", uint8(0))
	f.Add("a<b", int64(-1), "queued_offline", "stale", "nudged", "x", "\u2028", uint8(0xff))
	f.Fuzz(func(t *testing.T, id string, seq int64, delivery, state, outcome, recipient, sender string, flags uint8) {
		opt := func(s string, bit uint8) *string {
			if flags&bit == 0 {
				return nil
			}
			return &s
		}
		a := sendResponse{SignalID: id, Seq: seq, Delivery: delivery, RecipientRouteState: state,
			SelfhealOutcome: opt(outcome, 1), RecipientRouteStale: flags&2 != 0, SenderRouteStale: flags&4 != 0,
			Selfheal: selfhealJSON{Recipient: opt(recipient, 8), Sender: opt(sender, 16)}, Duplicate: flags&32 != 0}
		if flags&64 != 0 {
			a.Pending, a.History = []signalJSON{}, outcome
		}
		if flags&128 != 0 {
			a.RecipientInstanceURL = recipient
		}
		got, ok := appendSendAnswer(nil, &a)
		if ok && !bytes.Equal(got, encoded(t, a)) {
			t.Fatalf("appendSendAnswer:\n got %s\nwant %s", got, encoded(t, a))
		}
		if !ok && plainASCII(id, delivery, state, outcome, recipient, sender) {
			t.Fatalf("appendSendAnswer declined %+v, all plain ASCII", a)
		}
	})
}

// plainASCII reports whether every s is printable ASCII json writes as is.
func plainASCII(ss ...string) bool {
	for _, s := range ss {
		for i := 0; i < len(s); i++ {
			if b := s[i]; b < 0x20 || b > 0x7e || b == '"' || b == '\\' || b == '<' || b == '>' || b == '&' {
				return false
			}
		}
	}
	return true
}
