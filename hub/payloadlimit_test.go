package hub_test

import (
	"strings"
	"testing"

	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/signals"
)

// TestDefaultPayloadLimit: with MaxPayloadBytes unset, the send path's
// default is the limit both of the payload and of the body that carries it,
// so a payload of exactly the default size is stored and one byte more is
// refused with 413 payload_too_large.
func TestDefaultPayloadLimit(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	alice := register(t, h, "alice", "claude_code")
	register(t, h, "bob", "claude_code")
	// A JSON string payload encodes as its characters and two quotes.
	at := strings.Repeat("p", signals.DefaultMaxPayloadBytes-2)
	if st, r := call(t, "POST", h.URL+"/v1/signals", alice.Token, map[string]any{"to_session": "bob", "payload": at}); st != 200 {
		t.Fatalf("payload of the default limit: %d %v, want 200", st, r)
	}
	if st, r := call(t, "POST", h.URL+"/v1/signals", alice.Token, map[string]any{"to_session": "bob", "payload": at + "p"}); st != 413 || errCode(r) != "payload_too_large" {
		t.Fatalf("payload one byte over the default limit: %d %v, want 413 payload_too_large", st, r)
	}
}
