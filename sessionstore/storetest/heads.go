package storetest

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// SessionHeads: the pending sweep's one read for every connection of an
// instance.

func testSessionHeads(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	quiet, busy, other := key("t", "p", "quiet"), key("t", "p", "busy"), key("t2", "p", "busy")
	expired, unknown := key("t", "p", "expired"), key("t", "p", "unknown")
	mustCreate(t, s, quiet)
	mustCreate(t, s, busy)
	mustCreate(t, s, other)
	mustCreateSession(t, s, newSession(expired, hash("expired"), at(time.Minute)))
	appendN(t, s, busy, 5)
	appendN(t, s, expired, 1)
	_, err := s.AckSignals(ctx, busy, 2, t0)
	noErr(t, "AckSignals", err)

	heads := func(label string, now time.Time, keys ...sessionstore.Key) map[sessionstore.Key]sessionstore.SessionHead {
		t.Helper()
		got, err := s.SessionHeads(ctx, keys, now)
		noErr(t, "SessionHeads "+label, err)
		return got
	}
	wantHead := func(label string, got map[sessionstore.Key]sessionstore.SessionHead, k sessionstore.Key, last, acked int64) {
		t.Helper()
		h, ok := got[k]
		if !ok {
			t.Fatalf("%s: no head for %v", label, k)
		}
		if h.LastSeq != last || h.AckedSeq != acked {
			t.Errorf("%s: %v last %d acked %d, want %d and %d", label, k, h.LastSeq, h.AckedSeq, last, acked)
		}
		sess, err := s.GetSession(ctx, k, t0)
		noErr(t, "GetSession", err)
		if !reflect.DeepEqual(h.Session, sess) {
			t.Errorf("%s: %v session\n%+v\nwant (GetSession)\n%+v", label, k, h.Session, sess)
		}
	}

	got := heads("of five keys", at(2*time.Minute), quiet, busy, other, expired, unknown)
	wantInt(t, "heads of two live and one other tenant's, none expired or unknown", len(got), 3)
	wantHead("no signals", got, quiet, 0, 0)
	wantHead("5 signals, 2 acked", got, busy, 5, 2)
	wantHead("other tenant, same id", got, other, 0, 0)
	wantInt(t, "heads of no keys", len(heads("of no keys", t0)), 0)
	wantInt(t, "heads of an expired session, at its expiry", len(heads("at expiry", at(time.Minute), expired)), 1)
	wantInt(t, "heads of an expired session, after", len(heads("after expiry", at(2*time.Minute), expired)), 0)

	// Pruning the acknowledged signals moves neither seq.
	_, _, err = s.Prune(ctx, at(time.Hour), at(-time.Hour))
	noErr(t, "Prune", err)
	wantHead("after pruning the acked", heads("after prune", t0, busy), busy, 5, 2)
	_, err = s.DropPending(ctx, busy, t0)
	noErr(t, "DropPending", err)
	wantHead("after dropping the pending", heads("after drop", t0, busy), busy, 5, 5)
	appendN(t, s, busy, 1)
	wantHead("after one more", heads("after one more", t0, busy), busy, 6, 5)
}

func testSessionHeadsMany(t *testing.T, s sessionstore.Store) {
	const n = 300
	keys := make([]sessionstore.Key, n)
	for i := range keys {
		keys[i] = key("t", "p", fmt.Sprintf("s%03d", i))
		mustCreate(t, s, keys[i])
		if i%7 == 0 {
			appendN(t, s, keys[i], 1)
		}
	}
	got, err := s.SessionHeads(t.Context(), keys, t0)
	noErr(t, "SessionHeads", err)
	wantInt(t, "heads", len(got), n)
	for i, k := range keys {
		want := int64(0)
		if i%7 == 0 {
			want = 1
		}
		if h := got[k]; h.Key != k || h.LastSeq != want || h.AckedSeq != 0 {
			t.Fatalf("head of %v: key %v last %d acked %d, want last %d acked 0", k, h.Key, h.LastSeq, h.AckedSeq, want)
		}
	}
}
