package bootstrap

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestDecodeSendResponse(t *testing.T) {
	body := `{"signal_id":"s1","seq":17,"delivery":"queued_offline","recipient_route_state":"route_without_queue",
	 "selfheal_outcome":"attempted","recipient_route_stale":true,"sender_route_stale":true,
	 "selfheal":{"recipient":"attempted","sender":"attempted"},"duplicate":false,
	 "pending":[{"id":"p1","seq":3,"from_session":"b","to_session":"a","kind":"signal","payload":{"x":1},"created_at":"2026-06-04T10:00:00Z"}]}`
	var r sendResponse
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	want := SendResult{SignalID: "s1", Delivery: "queued_offline", RecipientRouteState: "route_without_queue",
		SelfhealOutcome: "attempted", Seq: 17, RecipientRouteStale: true, SenderRouteStale: true}
	if got := r.result(); got != want {
		t.Errorf("result = %+v, want %+v", got, want)
	}
	if len(r.Pending) != 1 {
		t.Fatalf("pending = %d signals, want 1", len(r.Pending))
	}
	p := r.Pending[0]
	if p.ID != "p1" || p.Seq != 3 || p.FromSession != "b" || p.ToSession != "a" || p.Kind != "signal" ||
		string(p.Payload) != `{"x":1}` || !p.CreatedAt.Equal(time.Date(2026, 6, 4, 10, 0, 0, 0, time.UTC)) {
		t.Errorf("pending signal = %+v", p)
	}

	// Self-heal off: null outcome and no stale fields.
	var plain sendResponse
	if err := json.Unmarshal([]byte(`{"signal_id":"s2","seq":1,"delivery":"pushed_to_ws","recipient_route_state":"attached","selfheal_outcome":null,"selfheal":{"recipient":null,"sender":null},"duplicate":true,"pending":[]}`), &plain); err != nil {
		t.Fatal(err)
	}
	if got := plain.result(); got != (SendResult{SignalID: "s2", Seq: 1, Delivery: "pushed_to_ws", RecipientRouteState: "attached", Duplicate: true}) {
		t.Errorf("result = %+v", got)
	}
}

func TestDecodeError(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		body    string
		want    Error
		wantURL string
	}{
		{"hub error", 410, `{"error":{"code":"session_expired","message":"register again"}}`,
			Error{Status: 410, Code: "session_expired", Message: "register again"}, ""},
		{"wrong instance", 409, `{"error":{"code":"wrong_instance","message":"elsewhere","instance_id":"i2","instance_url":"http://h2:8080"}}`,
			Error{Status: 409, Code: "wrong_instance", Message: "elsewhere"}, "http://h2:8080"},
		{"not the hub's body", 502, `<html>bad gateway</html>`,
			Error{Status: 502, Code: "unexpected_response", Message: "<html>bad gateway</html>"}, ""},
		{"empty body", 503, ``, Error{Status: 503, Code: "unexpected_response", Message: "Service Unavailable"}, ""},
		{"error without code", 500, `{"error":{}}`, Error{Status: 500, Code: "unexpected_response", Message: `{"error":{}}`}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := decodeError(tt.status, []byte(tt.body))
			if e.Status != tt.want.Status || e.Code != tt.want.Code || e.Message != tt.want.Message || e.instanceURL != tt.wantURL {
				t.Errorf("got %+v, want %+v (url %q)", *e, tt.want, tt.wantURL)
			}
			var target *Error
			if !errors.As(fmt.Errorf("call: %w", e), &target) || target != e {
				t.Error("*Error not found by errors.As through wrapping")
			}
		})
	}
}

func TestDecodeFrames(t *testing.T) {
	var f frame
	if err := json.Unmarshal([]byte(`{"type":"signal","id":"x","seq":4,"from_session":"a","to_session":"b","kind":"k","payload":"hi","created_at":"2026-01-02T03:04:05Z"}`), &f); err != nil {
		t.Fatal(err)
	}
	if f.Type != "signal" || f.ID != "x" || f.Seq != 4 || string(f.Payload) != `"hi"` {
		t.Errorf("frame = %+v", f)
	}
	var w struct {
		Type string `json:"type"`
		welcome
	}
	if err := json.Unmarshal([]byte(`{"type":"welcome","session_id":"s","instance_id":"i","resumed":false,"affinity_reset":true,"replayed":2,"dropped":1}`), &w); err != nil {
		t.Fatal(err)
	}
	if w.Type != "welcome" || !w.AffinityReset || w.Replayed != 2 || w.Dropped != 1 || w.InstanceID != "i" {
		t.Errorf("welcome = %+v", w)
	}
}

func FuzzDecodeError(f *testing.F) {
	f.Add(409, []byte(`{"error":{"code":"wrong_instance","message":"m","instance_url":"http://x"}}`))
	f.Add(500, []byte(`not json`))
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		e := decodeError(status, body)
		if e == nil || e.Code == "" || e.Status != status {
			t.Fatalf("decodeError(%d, %q) = %+v", status, body, e)
		}
	})
}
