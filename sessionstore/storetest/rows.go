package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// The session-row writes: AttachQueue, and TouchSession, SetQueue and
// AttachQueue called at once (group commit gathers them in pgstore).

func testAttachQueue(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k, want, check := queueFixture(t, s)

	// It counts the pending signals as CountPending does.
	appendN(t, s, k, 3)
	_, err := s.AckSignals(ctx, k, 1, t0)
	noErr(t, "AckSignals", err)
	pending, err := s.AttachQueue(ctx, k, "hub-1", at(time.Second),
		sessionstore.Touch{SeenAt: at(time.Second), ExpiresAt: at(48 * time.Hour)}, at(time.Second))
	noErr(t, "AttachQueue(hub-1, 1s)", err)
	wantInt(t, "AttachQueue's pending count", pending, 2)
	want.QueueInstance, want.QueueAttachedAt = "hub-1", at(time.Second)
	want.LastSeenAt, want.ExpiresAt = at(time.Second), at(48*time.Hour)
	check("after AttachQueue(hub-1)")

	// An older attach elsewhere lands late: the queue stays, the touch
	// applies.
	_, err = s.AttachQueue(ctx, k, "hub-2", at(500*time.Millisecond),
		sessionstore.Touch{SeenAt: at(2 * time.Second)}, at(2*time.Second))
	noErr(t, "late AttachQueue(hub-2, 0.5s)", err)
	want.LastSeenAt = at(2 * time.Second)
	check("after a late AttachQueue of an older attach")

	// Its own attach again after its detach names no instance again.
	ok, err := s.ClearQueue(ctx, k, "hub-1", at(time.Second), at(3*time.Second))
	noErr(t, "ClearQueue(hub-1)", err)
	if !ok {
		t.Fatal("ClearQueue(hub-1) = false, want true")
	}
	_, err = s.AttachQueue(ctx, k, "hub-1", at(time.Second),
		sessionstore.Touch{SeenAt: at(4 * time.Second)}, at(4*time.Second))
	noErr(t, "AttachQueue after its detach", err)
	want.QueueInstance, want.QueueAttachedAt, want.QueueDetachedAt = "", time.Time{}, at(3*time.Second)
	want.LastSeenAt = at(4 * time.Second)
	check("after an AttachQueue that arrived after its own detach")

	// A session that is not live at now: ErrNotFound, nothing written.
	bob := key("t", "p", "bob")
	wantBob := mustCreateSession(t, s, newSession(bob, hash("bob"), at(time.Minute)))
	_, err = s.AttachQueue(ctx, bob, "hub-1", at(2*time.Minute),
		sessionstore.Touch{SeenAt: at(2 * time.Minute), ExpiresAt: at(time.Hour)}, at(2*time.Minute))
	wantErr(t, "AttachQueue(expired)", err, sessionstore.ErrNotFound)
	got, err := s.GetSession(ctx, bob, at(30*time.Second))
	noErr(t, "GetSession(bob)", err)
	wantSession(t, "bob after a refused AttachQueue", got, wantBob)

	_, err = s.AttachQueue(ctx, key("t", "p", "nobody"), "hub-1", t0, sessionstore.Touch{SeenAt: t0}, t0)
	wantErr(t, "AttachQueue(unknown)", err, sessionstore.ErrNotFound)
}

func testRowWritesConcurrent(t *testing.T, s sessionstore.Store) {
	// Each of many sessions gets, all released at once: an attach, a late
	// SetQueue of an older attach (refused by the compare), touches of
	// their own, and SetQueues from two instances of which the newer wins
	// whatever the order. An expired session and an unknown one get the
	// same calls. Every call must get its own session's answer.
	ctx := t.Context()
	const n = 24
	now := at(time.Minute)
	expired := key("t", "p", "expired")
	mustCreateSession(t, s, newSession(expired, hash("expired"), at(30*time.Second)))
	unknown := key("t", "p", "unknown")
	keys := []sessionstore.Key{expired, unknown}
	pendingOf := map[sessionstore.Key]int{}
	for i := range n {
		k := key("t", "p", fmt.Sprintf("s%02d", i))
		mustCreate(t, s, k)
		appendN(t, s, k, i%3)
		pendingOf[k] = i % 3
		keys = append(keys, k)
	}
	type call struct {
		k    sessionstore.Key
		what string
		fn   func() error
	}
	var (
		calls    []call
		pmu      sync.Mutex
		attached = map[sessionstore.Key]int{} // AttachQueue's pending counts
	)
	for i, k := range keys {
		attach := at(time.Duration(i+1) * time.Millisecond)
		calls = append(calls,
			call{k, "AttachQueue", func() error {
				p, err := s.AttachQueue(ctx, k, "hub-a", attach, sessionstore.Touch{SeenAt: at(10 * time.Second)}, now)
				pmu.Lock()
				attached[k] = p
				pmu.Unlock()
				return err
			}},
			call{k, "SetQueue(older)", func() error { return s.SetQueue(ctx, k, "hub-old", attach.Add(-time.Microsecond)) }},
			call{k, "SetQueue(newer)", func() error { return s.SetQueue(ctx, k, "hub-b", attach.Add(time.Millisecond)) }},
		)
		for j := range 3 {
			calls = append(calls, call{k, "TouchSession", func() error {
				return s.TouchSession(ctx, k, sessionstore.Touch{VerbAt: at(time.Duration(20+j) * time.Second),
					ExpiresAt: at(time.Duration(48+j) * time.Hour)}, now)
			}})
		}
	}
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		errs  = make([]error, len(calls))
	)
	for i, c := range calls {
		wg.Go(func() {
			<-start
			errs[i] = c.fn()
		})
	}
	close(start)
	wg.Wait()
	for i, c := range calls {
		switch {
		case c.k == unknown, c.k == expired && c.what != "SetQueue(older)" && c.what != "SetQueue(newer)":
			// SetQueue asks only for the row; the others for a live session.
			wantErr(t, c.what+" of "+c.k.SessionID, errs[i], sessionstore.ErrNotFound)
		default:
			noErr(t, c.what+" of "+c.k.SessionID, errs[i])
		}
	}
	for i, k := range keys[2:] {
		wantInt(t, k.SessionID+": AttachQueue's pending count", attached[k], pendingOf[k])
		got, err := s.GetSession(ctx, k, now)
		noErr(t, "GetSession", err)
		what := k.SessionID + " after the concurrent writes"
		if got.QueueInstance != "hub-b" {
			t.Fatalf("%s: queue on %q, want hub-b (the newest attach)", what, got.QueueInstance)
		}
		wantTime(t, what+": queue attached at", got.QueueAttachedAt, at(time.Duration(i+4)*time.Millisecond))
		wantTime(t, what+": last seen", got.LastSeenAt, at(10*time.Second))
		wantTime(t, what+": last verb", got.LastVerbAt, at(22*time.Second))
		wantTime(t, what+": expires", got.ExpiresAt, at(50*time.Hour))
	}
	// The expired session got its queue from the SetQueues (the row
	// exists), and nothing from the refused touches and attach.
	got, err := s.GetSession(ctx, expired, t0)
	noErr(t, "GetSession(expired) before its expiry", err)
	if got.QueueInstance != "hub-b" || !got.LastSeenAt.IsZero() || !got.LastVerbAt.IsZero() || !got.ExpiresAt.Equal(at(30*time.Second)) {
		t.Fatalf("expired session after the writes: queue %q, seen %v, verb %v, expires %v; want hub-b and nothing touched",
			got.QueueInstance, got.LastSeenAt, got.LastVerbAt, got.ExpiresAt)
	}
}

func testClearQueueConcurrent(t *testing.T, s sessionstore.Store) {
	// Many detaches at once, as a hub's shutdown makes them: each clears
	// its own session's queue; a stale one (an older attach) and one of an
	// unknown session clear nothing; of two identical ones exactly one
	// clears.
	ctx := t.Context()
	const n = 24
	var keys []sessionstore.Key
	for i := range n {
		k := key("t", "p", fmt.Sprintf("s%02d", i))
		mustCreate(t, s, k)
		noErr(t, "SetQueue", s.SetQueue(ctx, k, "hub-1", at(time.Second)))
		keys = append(keys, k)
	}
	type result struct {
		k       sessionstore.Key
		what    string
		cleared bool
		err     error
	}
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		mu      sync.Mutex
		results []result
	)
	detach := func(k sessionstore.Key, what, instance string, attachedAt time.Time) {
		wg.Go(func() {
			<-start
			ok, err := s.ClearQueue(ctx, k, instance, attachedAt, at(2*time.Second))
			mu.Lock()
			results = append(results, result{k, what, ok, err})
			mu.Unlock()
		})
	}
	for _, k := range keys {
		detach(k, "holder", "hub-1", at(time.Second))
		detach(k, "holder again", "hub-1", at(time.Second))
		detach(k, "older attach", "hub-1", at(time.Millisecond))
		detach(k, "other instance", "hub-2", at(time.Second))
	}
	detach(key("t", "p", "unknown"), "unknown", "hub-1", at(time.Second))
	close(start)
	wg.Wait()
	clearedBy := map[sessionstore.Key]int{}
	for _, r := range results {
		noErr(t, "ClearQueue("+r.what+") of "+r.k.SessionID, r.err)
		switch {
		case r.cleared && (r.what == "holder" || r.what == "holder again"):
			clearedBy[r.k]++
		case r.cleared:
			t.Fatalf("ClearQueue(%s) of %s cleared; want false", r.what, r.k.SessionID)
		}
	}
	for _, k := range keys {
		wantInt(t, "ClearQueues of "+k.SessionID+" that cleared", clearedBy[k], 1)
		got, err := s.GetSession(ctx, k, t0)
		noErr(t, "GetSession", err)
		if got.QueueInstance != "" || !got.QueueDetachedAt.Equal(at(2*time.Second)) {
			t.Fatalf("%s after its detach: queue %q, detached at %v; want none since 2s", k.SessionID, got.QueueInstance, got.QueueDetachedAt)
		}
	}
}

// testTouchAs: a touch made as a holder applies only while that holder
// still speaks for the session (the same registration, live, with the same
// token), so that a call authenticated before a resume or a registration
// again never extends the session that replaced its own.
func testTouchAs(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "bob")
	want := mustCreateSession(t, s, newSession(k, hash("first"), at(time.Hour)))
	holder := sessionstore.Holder{RegisteredAt: want.RegisteredAt, TokenHash: want.TokenHash}
	get := func(what string, now time.Time) {
		t.Helper()
		got, err := s.GetSession(ctx, k, now)
		noErr(t, what, err)
		wantSession(t, what, got, want)
	}

	noErr(t, "TouchSessionAs(the holder)", s.TouchSessionAs(ctx, k, holder,
		sessionstore.Touch{VerbAt: at(time.Minute), ExpiresAt: at(90 * time.Minute)}, at(time.Minute)))
	want.LastVerbAt, want.ExpiresAt = at(time.Minute), at(90*time.Minute)
	get("after the holder's touch", at(time.Minute))

	refused := sessionstore.Touch{VerbAt: at(2 * time.Minute), ExpiresAt: at(3 * time.Hour)}
	other := holder
	other.TokenHash = hash("another token")
	wantErr(t, "TouchSessionAs(another token)", s.TouchSessionAs(ctx, k, other, refused, at(2*time.Minute)), sessionstore.ErrNotFound)
	earlier := holder
	earlier.RegisteredAt = at(-time.Hour)
	wantErr(t, "TouchSessionAs(another registration)", s.TouchSessionAs(ctx, k, earlier, refused, at(2*time.Minute)), sessionstore.ErrNotFound)
	wantErr(t, "TouchSessionAs(no such session)", s.TouchSessionAs(ctx, key("t", "p", "nobody"), holder, refused, at(2*time.Minute)), sessionstore.ErrNotFound)
	get("after refused touches", at(2*time.Minute))

	// A resume gives the session another token: the old one extends nothing.
	resumed, err := s.ResumeSession(ctx, k, holder.TokenHash, hash("resumed"), sessionstore.Touch{}, at(3*time.Minute))
	noErr(t, "ResumeSession", err)
	want.TokenHash = resumed.TokenHash
	wantErr(t, "TouchSessionAs(the token a resume replaced)", s.TouchSessionAs(ctx, k, holder, refused, at(4*time.Minute)), sessionstore.ErrNotFound)
	get("after the replaced token's touch", at(4*time.Minute))
	holder.TokenHash = resumed.TokenHash

	// Expired, then registered again under the same id: the earlier
	// registration's holder extends neither.
	wantErr(t, "TouchSessionAs(after expiry)", s.TouchSessionAs(ctx, k, holder, refused, at(2*time.Hour)), sessionstore.ErrNotFound)
	again := newSession(k, hash("again"), at(3*time.Hour))
	again.RegisteredAt = at(2 * time.Hour)
	again, err = s.CreateSession(ctx, again, at(2*time.Hour))
	noErr(t, "CreateSession(again)", err)
	late := sessionstore.Touch{VerbAt: at(2*time.Hour + time.Minute), ExpiresAt: at(5 * time.Hour)}
	wantErr(t, "TouchSessionAs(the registration before)", s.TouchSessionAs(ctx, k, holder, late, at(2*time.Hour+time.Minute)), sessionstore.ErrNotFound)
	want = again
	get("after the registration before touched", at(2*time.Hour+time.Minute))
	noErr(t, "TouchSessionAs(the registration again)", s.TouchSessionAs(ctx, k,
		sessionstore.Holder{RegisteredAt: again.RegisteredAt, TokenHash: again.TokenHash}, late, at(2*time.Hour+time.Minute)))
	want.LastVerbAt, want.ExpiresAt = late.VerbAt, late.ExpiresAt
	get("after the registration again touched", at(2*time.Hour+time.Minute))
}
