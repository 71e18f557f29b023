package hub

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestDecodeSendRequest: the plain form of a send decodes by hand to what
// json.Unmarshal reads; anything else is declined.
func TestDecodeSendRequest(t *testing.T) {
	tests := []struct {
		body    string
		decodes bool
	}{
		{`{"to_session":"bob","kind":"task.ready","payload":{"task":"T-1","note":"ready for review"}}`, true},
		{` { "to_session" : "bob" , "payload" : [1, "a\"]", {"b":null}] , "idempotency_key":"k-1" } `, true},
		{`{"to_session":"bob","payload":"x"}`, true},
		{`{"to_session":"bob","payload":null}`, true},
		{`{"to_session":"bob","payload":-1.5e3}`, true},
		{`{}`, true},
		{`{"to_session":"b\u00f6b"}`, false},           // an escape
		{`{"to_session":"böb"}`, false},                // not ASCII
		{`{"To_Session":"bob"}`, false},                // json matches keys without case
		{`{"to_session":"a","to_session":"b"}`, false}, // a key twice
		{`{"to_session":null}`, false},
		{`{"to_session":"bob","extra":1}`, false},
		{`{"to_session":"bob","payload":tru}`, false},
		{`{"to_session":"bob","payload":{"a":1]}`, false},
		{`{"to_session":"bob"} x`, false},
		{`{"to_session":"bob",}`, false},
		{`{"to_session":"bob"`, false},
	}
	for _, tt := range tests {
		var got sendRequest
		if ok := decodeSendRequest([]byte(tt.body), &got); ok != tt.decodes {
			t.Errorf("decodeSendRequest(%s) = %v, want %v", tt.body, ok, tt.decodes)
			continue
		}
		if !tt.decodes {
			continue
		}
		var want sendRequest
		if err := json.Unmarshal([]byte(tt.body), &want); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("decodeSendRequest(%s) = %+v; json.Unmarshal %+v, %v", tt.body, got, want, err)
		}
	}
}

// FuzzDecodeSendRequest: whatever decodeSendRequest decodes, json.Unmarshal
// decodes to the same value; it never panics.
func FuzzDecodeSendRequest(f *testing.F) {
	f.Add(`{"to_session":"bob","kind":"task.ready","payload":{"task":"T-1","note":"ready for review"}}`)
	f.Add(`{"payload":[1,"a\\\"]",{"b":null}],"idempotency_key":"k"}`)
	f.Add(`{"to_session":"bob","payload":{"a":1]}`)
	f.Fuzz(func(t *testing.T, body string) {
		var got sendRequest
		if !decodeSendRequest([]byte(body), &got) {
			return
		}
		var want sendRequest
		if err := json.Unmarshal([]byte(body), &want); err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("decodeSendRequest(%q) = %+v; json.Unmarshal %+v, %v", body, got, want, err)
		}
	})
}
