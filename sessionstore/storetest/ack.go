package storetest

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// testAckDropsPayload: an acknowledged signal is never delivered again, so
// its payload is not kept; what a duplicate send needs is. A duplicate of an
// acknowledged signal still gets the first answer (id, seq, delivery, route
// state), without the payload; a duplicate of a pending one keeps it, and
// the recipient's other pending signals are untouched.
func testAckDropsPayload(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "bob")
	mustCreate(t, s, k)
	big := json.RawMessage(`"` + strings.Repeat("x", 60<<10) + `"`)
	sent := make([]sessionstore.NewSignal, 3)
	first := make([]sessionstore.Signal, 3)
	for i := range sent {
		ns := send(k, "alice")
		ns.Payload = big
		ns.IdempotencyKey = "key-" + string(rune('a'+i))
		ns.Delivery, ns.RouteState = "pushed_to_ws", "attached"
		sent[i], first[i] = ns, mustAppend(t, s, ns)
	}
	n, err := s.AckSignals(ctx, k, 2, at(time.Minute))
	noErr(t, "AckSignals", err)
	wantInt(t, "acked", n, 2)

	for i, ns := range sent {
		again := ns
		again.ID = "another-id"
		again.Delivery, again.RouteState = "queued_offline", "stale"
		sig, dup, err := s.AppendSignal(ctx, again, at(2*time.Minute))
		noErr(t, "AppendSignal(duplicate)", err)
		if !dup {
			t.Fatalf("repeat of %q after the ack: duplicate = false, want true", ns.IdempotencyKey)
		}
		f := first[i]
		if sig.ID != f.ID || sig.Seq != f.Seq || sig.Delivery != f.Delivery || sig.RouteState != f.RouteState || sig.FromSession != f.FromSession {
			t.Errorf("duplicate of %q = %s/%d/%s/%s, want the first answer %s/%d/%s/%s", ns.IdempotencyKey,
				sig.ID, sig.Seq, sig.Delivery, sig.RouteState, f.ID, f.Seq, f.Delivery, f.RouteState)
		}
		switch acked := f.Seq <= 2; {
		case acked && len(sig.Payload) != 0:
			t.Errorf("duplicate of acknowledged seq %d carries %d payload bytes, want none kept", f.Seq, len(sig.Payload))
		case !acked && !bytes.Equal(sig.Payload, big):
			t.Errorf("duplicate of pending seq %d carries %d payload bytes, want the %d sent", f.Seq, len(sig.Payload), len(big))
		}
	}
	pend, err := s.PendingSignals(ctx, k, 0, 10)
	noErr(t, "PendingSignals", err)
	if len(pend) != 1 || pend[0].Seq != 3 || !bytes.Equal(pend[0].Payload, big) {
		t.Fatalf("pending after the ack: %d signals, want seq 3 with its payload", len(pend))
	}
	// The next append goes on after the acknowledged ones.
	wantInt(t, "next seq", mustAppend(t, s, send(k, "alice")).Seq, 4)
}
