package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// The batch semantics of AppendSignal (group commit in pgstore) and the
// store-side quotas. Each concurrent test starts its appends at once, so that
// a store that batches puts many of them in one batch.

// appendAll runs appends concurrently, each released at the same moment,
// and returns their results in the order of appends.
func appendAll(t *testing.T, s sessionstore.Store, appends []sessionstore.NewSignal) ([]sessionstore.Signal, []bool, []error) {
	t.Helper()
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		sigs  = make([]sessionstore.Signal, len(appends))
		dups  = make([]bool, len(appends))
		errs  = make([]error, len(appends))
	)
	for i, ns := range appends {
		wg.Go(func() {
			<-start
			sigs[i], dups[i], errs[i] = s.AppendSignal(t.Context(), ns, t0)
		})
	}
	close(start)
	wg.Wait()
	return sigs, dups, errs
}

func testBatchOrderPerSender(t *testing.T, s sessionstore.Store) {
	// Senders each send in order to their own and a shared recipient;
	// every recipient's seqs are 1..n and each sender's signals keep their
	// sending order in seq.
	const senders, each = 8, 25
	ctx := t.Context()
	shared := key("t", "p", "shared")
	mustCreate(t, s, shared)
	var wg sync.WaitGroup
	errs := make(chan error, senders*each*2)
	for g := range senders {
		own := key("t", "p", fmt.Sprintf("own%d", g))
		mustCreate(t, s, own)
		wg.Go(func() {
			for i := range each {
				for _, to := range []sessionstore.Key{own, shared} {
					ns := send(to, fmt.Sprintf("s%d", g))
					ns.Payload = json.RawMessage(fmt.Sprintf(`{"g":%d,"i":%d}`, g, i))
					if _, _, err := s.AppendSignal(ctx, ns, t0); err != nil {
						errs <- err
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("append: %v", err)
	}
	check := func(k sessionstore.Key, n int) {
		t.Helper()
		sigs, err := s.PendingSignals(ctx, k, 0, 0)
		noErr(t, "PendingSignals", err)
		if len(sigs) != n {
			t.Fatalf("%v has %d signals, want %d", k, len(sigs), n)
		}
		next := map[float64]float64{} // sender -> next i
		for i, sig := range sigs {
			if sig.Seq != int64(i+1) {
				t.Fatalf("%v: signal %d has seq %d: seq must be 1..n without gaps", k, i, sig.Seq)
			}
			var p struct{ G, I float64 }
			noErr(t, "payload", json.Unmarshal(sig.Payload, &p))
			if p.I != next[p.G] {
				t.Fatalf("%v: seq %d carries sender %v's signal %v, want its signal %v: a sender's order must hold", k, sig.Seq, p.G, p.I, next[p.G])
			}
			next[p.G]++
		}
	}
	check(shared, senders*each)
	for g := range senders {
		check(key("t", "p", fmt.Sprintf("own%d", g)), each)
	}
}

func testBatchIdempotency(t *testing.T, s sessionstore.Store) {
	// The same key from one sender, sent many times at once (to two
	// recipients): one is stored, every other answer is that one.
	ctx := t.Context()
	a, b := key("t", "p", "a"), key("t", "p", "b")
	mustCreate(t, s, a)
	mustCreate(t, s, b)
	var appends []sessionstore.NewSignal
	for i := range 24 {
		ns := send([]sessionstore.Key{a, b}[i%2], "sender")
		ns.IdempotencyKey = "same-key"
		appends = append(appends, ns)
		other := send(a, "sender") // unrelated appends in the same batches
		appends = append(appends, other)
	}
	sigs, dups, errs := appendAll(t, s, appends)
	var first *sessionstore.Signal
	stored := 0
	for i, ns := range appends {
		noErr(t, "append", errs[i])
		if ns.IdempotencyKey == "" {
			if dups[i] {
				t.Fatal("an append without a key answered duplicate")
			}
			continue
		}
		if !dups[i] {
			stored++
			first = &sigs[i]
		}
	}
	if stored != 1 {
		t.Fatalf("%d appends with one idempotency key were stored, want exactly 1", stored)
	}
	for i, ns := range appends {
		if ns.IdempotencyKey != "" && dups[i] && sigs[i].ID != first.ID {
			t.Fatalf("a duplicate answered signal %s, want the stored %s", sigs[i].ID, first.ID)
		}
	}
	na, err := s.CountPending(ctx, a)
	noErr(t, "CountPending(a)", err)
	nb, err := s.CountPending(ctx, b)
	noErr(t, "CountPending(b)", err)
	if na+nb != 24+1 {
		t.Fatalf("stored %d signals, want the 24 without a key and 1 with", na+nb)
	}
	wantPending(t, s, a, seqRange(int64(na))...)
}

func testBatchFailingMember(t *testing.T, s sessionstore.Store) {
	// One append a store cannot keep (a NUL in its idempotency key) among
	// many sent at once: it alone fails, with ErrInvalidInput; the others
	// are stored with seqs 1..n; unknown recipients fail alone too.
	k := key("t", "p", "alice")
	mustCreate(t, s, k)
	var appends []sessionstore.NewSignal
	for i := range 30 {
		ns := send(k, "sender")
		switch i {
		case 10:
			ns.IdempotencyKey = "bad\x00key"
		case 20:
			ns.To = key("t", "p", "nobody")
		}
		appends = append(appends, ns)
	}
	_, _, errs := appendAll(t, s, appends)
	for i, err := range errs {
		switch i {
		case 10:
			wantErr(t, "append with a NUL in its key", err, sessionstore.ErrInvalidInput)
		case 20:
			wantErr(t, "append to an unknown recipient", err, sessionstore.ErrNotFound)
		default:
			noErr(t, fmt.Sprintf("append %d beside a failing one", i), err)
		}
	}
	wantPending(t, s, k, seqRange(28)...)
	// Nothing of the bad append is left: the same key, valid, is new.
	ns := send(k, "sender")
	ns.IdempotencyKey = "bad"
	mustAppend(t, s, ns)
}

func testInvalidInput(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	mustCreate(t, s, k)
	for _, mutate := range []func(*sessionstore.NewSignal){
		func(ns *sessionstore.NewSignal) { ns.IdempotencyKey = "a\x00b" },
		func(ns *sessionstore.NewSignal) { ns.Kind = "k\x00" },
		func(ns *sessionstore.NewSignal) { ns.IdempotencyKey = "\xff\xfe" },
	} {
		ns := send(k, "sender")
		mutate(&ns)
		_, _, err := s.AppendSignal(ctx, ns, t0)
		wantErr(t, fmt.Sprintf("append of kind %q key %q", ns.Kind, ns.IdempotencyKey), err, sessionstore.ErrInvalidInput)
	}
	wantCount(t, s, k, 0)
	sess := newSession(key("t", "p", "bob"), hash("bob"), at(24*time.Hour))
	sess.ClientID = "c\x00"
	_, err := s.CreateSession(ctx, sess, t0)
	wantErr(t, "CreateSession with a NUL in client_id", err, sessionstore.ErrInvalidInput)
	_, err = s.GetSession(ctx, sess.Key, t0)
	wantErr(t, "GetSession after a refused CreateSession", err, sessionstore.ErrNotFound)
}

func seqRange(n int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(i + 1)
	}
	return out
}

func wantQuota(t *testing.T, what string, err error, q marconi.Quota, limit, current int64) {
	t.Helper()
	var qe *sessionstore.QuotaError
	if !errors.As(err, &qe) || !errors.Is(err, sessionstore.ErrQuotaExceeded) {
		t.Fatalf("%s: err = %v, want a *QuotaError", what, err)
	}
	if qe.Quota != q || qe.Limit != limit || qe.Current != current {
		t.Fatalf("%s: %+v, want quota %s, limit %d, current %d", what, *qe, q, limit, current)
	}
}

func testQuotaPendingPerRecipient(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k, other := key("t", "p", "alice"), key("t", "p", "bob")
	mustCreate(t, s, k)
	mustCreate(t, s, other)
	limited := func(to sessionstore.Key) sessionstore.NewSignal {
		ns := send(to, "sender")
		ns.Limits.PendingPerRecipient = 3
		return ns
	}
	for range 3 {
		mustAppend(t, s, limited(k))
	}
	ns := limited(k)
	ns.IdempotencyKey = "refused-key"
	_, _, err := s.AppendSignal(ctx, ns, t0)
	wantQuota(t, "fourth pending signal", err, marconi.QuotaPendingPerRecipient, 3, 3)
	wantPending(t, s, k, 1, 2, 3)
	mustAppend(t, s, limited(other)) // another recipient has its own room

	// A refused key was not stored: once there is room, it is new.
	_, err = s.AckSignals(ctx, k, 1, t0)
	noErr(t, "AckSignals", err)
	if sig := mustAppend(t, s, ns); sig.Seq != 4 {
		t.Fatalf("append after an ack: seq %d, want 4 (a refused append takes no seq)", sig.Seq)
	}
	_, _, err = s.AppendSignal(ctx, limited(k), t0)
	wantQuota(t, "full again", err, marconi.QuotaPendingPerRecipient, 3, 3)
	// A duplicate is answered, never refused.
	ns.ID = "another-id"
	if _, dup, err := s.AppendSignal(ctx, ns, t0); err != nil || !dup {
		t.Fatalf("duplicate at the limit = %v, %v; want a duplicate", dup, err)
	}
	_, err = s.DropPending(ctx, k, t0)
	noErr(t, "DropPending", err)
	mustAppend(t, s, limited(k))

	// An ack past the last seq acknowledges what exists, not what comes
	// later: the next signals are pending and count against the quota.
	n, err := s.AckSignals(ctx, other, 100, t0)
	noErr(t, "AckSignals past the last seq", err)
	wantInt(t, "acked past the last seq", n, 1)
	for range 3 {
		mustAppend(t, s, limited(other))
	}
	wantPending(t, s, other, 2, 3, 4)
	_, _, err = s.AppendSignal(ctx, limited(other), t0)
	wantQuota(t, "full after an ack past the last seq", err, marconi.QuotaPendingPerRecipient, 3, 3)
}

func testQuotaPendingBytesPerProject(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	a, b, elsewhere := key("t", "p", "a"), key("t", "p", "b"), key("t", "q", "a")
	for _, k := range []sessionstore.Key{a, b, elsewhere} {
		mustCreate(t, s, k)
	}
	sized := func(to sessionstore.Key, n int) sessionstore.NewSignal {
		ns := send(to, "sender")
		ns.Payload = json.RawMessage(strings.Repeat("1", n)) // a number of n digits
		ns.Limits.PendingBytesPerProject = 100
		return ns
	}
	mustAppend(t, s, sized(a, 40))
	mustAppend(t, s, sized(b, 40))
	_, _, err := s.AppendSignal(ctx, sized(a, 21), t0)
	wantQuota(t, "bytes past the project's limit", err, marconi.QuotaPendingBytesPerProject, 100, 80)
	wantPending(t, s, a, 1)
	mustAppend(t, s, sized(a, 20))          // exactly at the limit
	mustAppend(t, s, sized(elsewhere, 100)) // another project has its own
	_, err = s.AckSignals(ctx, b, 1, t0)    // acking frees b's 40 bytes
	noErr(t, "AckSignals", err)
	mustAppend(t, s, sized(b, 40))
	_, _, err = s.AppendSignal(ctx, sized(b, 1), t0)
	wantQuota(t, "full again", err, marconi.QuotaPendingBytesPerProject, 100, 100)
	noErr(t, "DeleteSession", s.DeleteSession(ctx, a)) // deleting frees a's 60
	mustAppend(t, s, sized(b, 60))
}

func testAppendSenderToken(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	to := key("t", "p", "bob")
	mustCreate(t, s, to)
	sender := mustCreate(t, s, key("t", "p", "alice"))
	authed := func() sessionstore.NewSignal {
		ns := send(to, "alice")
		ns.SenderTokenHash = sender.TokenHash
		return ns
	}
	mustAppend(t, s, authed())

	// Rotated: the old hash sends nothing, not even a duplicate's answer.
	newHash := hash("alice-rotated")
	_, err := s.ResumeSession(ctx, sender.Key, sender.TokenHash, newHash, sessionstore.Touch{}, t0)
	noErr(t, "ResumeSession", err)
	_, _, err = s.AppendSignal(ctx, authed(), t0)
	wantErr(t, "append with a rotated token", err, sessionstore.ErrTokenMismatch)
	ns := authed()
	ns.SenderTokenHash = newHash
	mustAppend(t, s, ns)

	// Another sender's hash, or a hash of another tenant's alice, is no better.
	other := mustCreate(t, s, key("t2", "p", "alice"))
	ns = authed()
	ns.SenderTokenHash = other.TokenHash
	_, _, err = s.AppendSignal(ctx, ns, t0)
	wantErr(t, "append with another tenant's token", err, sessionstore.ErrTokenMismatch)

	// Expired and deleted senders send nothing.
	ns = authed()
	ns.SenderTokenHash = newHash
	_, _, err = s.AppendSignal(ctx, ns, at(25*time.Hour))
	wantErr(t, "append from an expired sender", err, sessionstore.ErrTokenMismatch)
	noErr(t, "DeleteSession", s.DeleteSession(ctx, sender.Key))
	_, _, err = s.AppendSignal(ctx, ns, t0)
	wantErr(t, "append from a deleted sender", err, sessionstore.ErrTokenMismatch)
	wantPending(t, s, to, 1, 2)
}
