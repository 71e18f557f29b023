package storetest

import (
	"bytes"
	"encoding/json"
	"fmt"
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

// testAckAs: an ack made as a holder applies only while that holder still
// speaks for the session: the same registration, live, with the same
// token. Otherwise it says why (gone, or another token) and acknowledges
// nothing, so that a connection of an earlier registration or token can
// never acknowledge the signals of the one that replaced it.
func testAckAs(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "bob")
	sess := mustCreate(t, s, k)
	appendN(t, s, k, 4)
	holder := sessionstore.Holder{RegisteredAt: sess.RegisteredAt, TokenHash: sess.TokenHash}
	pending := func(want int) {
		t.Helper()
		n, err := s.CountPending(ctx, k)
		noErr(t, "CountPending", err)
		wantInt(t, "pending", n, want)
	}

	n, err := s.AckSignalsAs(ctx, k, holder, 1, at(time.Minute))
	noErr(t, "AckSignalsAs(the holder)", err)
	wantInt(t, "acked by the holder", n, 1)
	pending(3)

	other := holder
	other.TokenHash = hash("another token")
	_, err = s.AckSignalsAs(ctx, k, other, 2, at(time.Minute))
	wantErr(t, "AckSignalsAs(another token)", err, sessionstore.ErrTokenMismatch)
	earlier := holder
	earlier.RegisteredAt = at(-time.Hour)
	_, err = s.AckSignalsAs(ctx, k, earlier, 2, at(time.Minute))
	wantErr(t, "AckSignalsAs(another registration)", err, sessionstore.ErrNotFound)
	_, err = s.AckSignalsAs(ctx, k, holder, 2, at(25*time.Hour))
	wantErr(t, "AckSignalsAs(after expiry)", err, sessionstore.ErrNotFound)
	_, err = s.AckSignalsAs(ctx, key("t", "p", "nobody"), holder, 2, at(time.Minute))
	wantErr(t, "AckSignalsAs(no such session)", err, sessionstore.ErrNotFound)
	pending(3)

	// A resume gives the session another token: the old one acks nothing.
	_, err = s.ResumeSession(ctx, k, sess.TokenHash, hash("resumed"), sessionstore.Touch{}, at(time.Minute))
	noErr(t, "ResumeSession", err)
	_, err = s.AckSignalsAs(ctx, k, holder, 2, at(2*time.Minute))
	wantErr(t, "AckSignalsAs(the token a resume replaced)", err, sessionstore.ErrTokenMismatch)
	pending(3)
	resumed := holder
	resumed.TokenHash = hash("resumed")
	n, err = s.AckSignalsAs(ctx, k, resumed, 3, at(2*time.Minute))
	noErr(t, "AckSignalsAs(the resumed token)", err)
	wantInt(t, "acked by the resumed token", n, 2)
	pending(1)

	// Deregistered, then registered again: the earlier registration is gone.
	noErr(t, "DeleteSession", s.DeleteSession(ctx, k))
	_, err = s.AckSignalsAs(ctx, k, resumed, 4, at(2*time.Minute))
	wantErr(t, "AckSignalsAs(deregistered)", err, sessionstore.ErrNotFound)
	again := newSession(k, hash("again"), at(24*time.Hour))
	again.RegisteredAt = at(3 * time.Minute)
	again = mustCreateSession(t, s, again)
	appendN(t, s, k, 2)
	_, err = s.AckSignalsAs(ctx, k, resumed, 2, at(4*time.Minute))
	wantErr(t, "AckSignalsAs(the registration before)", err, sessionstore.ErrNotFound)
	pending(2)
	n, err = s.AckSignalsAs(ctx, k, sessionstore.Holder{RegisteredAt: again.RegisteredAt, TokenHash: again.TokenHash}, 2, at(4*time.Minute))
	noErr(t, "AckSignalsAs(the new registration)", err)
	wantInt(t, "acked by the new registration", n, 2)
	pending(0)
}

// testAppendSeen: an append that says what its sender saw of the recipient
// stores only while the recipient is still that: the same registration,
// its token and its queue where they were. An attach, a detach, a move, a
// resume or a registration again refuses it with ErrRecipientChanged, storing nothing; a duplicate
// still gets its first answer.
func testAppendSeen(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "bob")
	mustCreate(t, s, k)
	read := func() sessionstore.Session {
		t.Helper()
		sess, err := s.GetSession(ctx, k, at(time.Minute))
		noErr(t, "GetSession", err)
		return sess
	}
	seen := read()
	ns := send(k, "alice")
	ns.Seen = sessionstore.SeenOf(seen)
	ns.IdempotencyKey = "first"
	first := mustAppend(t, s, ns)
	wantInt(t, "seq", first.Seq, 1)

	refused := func(what string, seen sessionstore.Session) {
		t.Helper()
		ns := send(k, "alice")
		ns.Seen = sessionstore.SeenOf(seen)
		_, _, err := s.AppendSignal(ctx, ns, t0)
		wantErr(t, "AppendSignal(seen before "+what+")", err, sessionstore.ErrRecipientChanged)
		n, err := s.CountPending(ctx, k)
		noErr(t, "CountPending", err)
		wantInt(t, "pending after a refused append", n, 1)
	}
	noErr(t, "SetQueue", s.SetQueue(ctx, k, "hub-a", at(time.Second)))
	refused("an attach", seen)
	attached := read()
	noErr(t, "SetQueue", s.SetQueue(ctx, k, "hub-b", at(2*time.Second)))
	refused("a move", attached)
	moved := read()
	_, err := s.ClearQueue(ctx, k, "hub-b", moved.QueueAttachedAt, at(3*time.Second))
	noErr(t, "ClearQueue", err)
	refused("a detach", moved)
	detachedRow := read()
	_, err = s.ResumeSession(ctx, k, detachedRow.TokenHash, hash("resumed"), sessionstore.Touch{}, at(3*time.Second))
	noErr(t, "ResumeSession", err)
	refused("a resume", detachedRow)

	// The duplicate of the first send is answered whatever was seen.
	sig, dup, err := s.AppendSignal(ctx, ns, t0)
	noErr(t, "AppendSignal(duplicate)", err)
	if !dup || sig.ID != first.ID {
		t.Fatalf("duplicate after the recipient changed: dup %v id %s, want the first answer %s", dup, sig.ID, first.ID)
	}
	detached := read()
	ns = send(k, "alice")
	ns.Seen = sessionstore.SeenOf(detached)
	wantInt(t, "seq seen as it is", mustAppend(t, s, ns).Seq, 2)

	noErr(t, "DeleteSession", s.DeleteSession(ctx, k))
	again := newSession(k, hash("again"), at(24*time.Hour))
	again.RegisteredAt = at(4 * time.Second)
	mustCreateSession(t, s, again)
	ns = send(k, "alice")
	ns.Seen = sessionstore.SeenOf(detached)
	_, _, err = s.AppendSignal(ctx, ns, t0)
	wantErr(t, "AppendSignal(seen before a registration again)", err, sessionstore.ErrRecipientChanged)
}

// testAckCountsItsRange: each ack counts the signals it acknowledges, those
// after what was acknowledged before it: none when it does not move (up to
// a seq already acknowledged, or past the last one once all are), the
// signals an append added in between when it does, and after a
// registration again the new registration's from its first seq, however
// far the one before had gone.
func testAckCountsItsRange(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "bob")
	mustCreateSession(t, s, newSession(k, hash("first"), at(time.Minute)))
	appendN(t, s, k, 6)
	ack := func(upTo int64, want int, pending ...int64) {
		t.Helper()
		n, err := s.AckSignals(ctx, k, upTo, at(time.Second))
		noErr(t, "AckSignals", err)
		wantInt(t, fmt.Sprintf("acknowledged by the ack up to %d", upTo), n, want)
		wantPending(t, s, k, pending...)
		wantCount(t, s, k, len(pending))
	}
	ack(4, 4, 5, 6)
	ack(4, 0, 5, 6)
	ack(2, 0, 5, 6)
	ack(5, 1, 6)
	appendN(t, s, k, 2)
	ack(100, 3)
	ack(100, 0)
	appendN(t, s, k, 1)
	ack(9, 1)

	// Registered again once the first expired: seqs start at 1 again, and
	// nothing of the first registration's acks carries over.
	now := at(2 * time.Minute)
	again := newSession(k, hash("again"), at(time.Hour))
	again.RegisteredAt = now
	_, err := s.CreateSession(ctx, again, now)
	noErr(t, "CreateSession over the expired session", err)
	wantInt(t, "first seq after registering again", appendN(t, s, k, 3)[0].Seq, 1)
	ack(1, 1, 2, 3)
	ack(3, 2)
}
