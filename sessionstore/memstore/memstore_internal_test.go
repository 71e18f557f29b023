package memstore

// Tests of the memstore's own bookkeeping: the idempotency index and each
// session's acknowledged prefix. The conformance suite (storetest) checks the
// contract; these check that the indexes stay in step with the signals under
// every operation that adds or removes one, which the suite only samples.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func key(tenant, id string) sessionstore.Key {
	return sessionstore.Key{TenantID: tenant, ProjectID: "p", SessionID: id}
}

func create(t *testing.T, m *Store, k sessionstore.Key, expires, now time.Time) {
	t.Helper()
	_, err := m.CreateSession(t.Context(), sessionstore.Session{
		Key: k, RuntimeMode: "stateless", TokenHash: []byte(fmt.Sprint(k, now)),
		RegisteredAt: now, ExpiresAt: expires,
	}, now)
	if err != nil {
		t.Fatalf("CreateSession(%v): %v", k, err)
	}
}

func newSignal(to sessionstore.Key, from, idem string, created, since time.Time) sessionstore.NewSignal {
	return sessionstore.NewSignal{
		ID: fmt.Sprintf("%s>%v@%s", from, to, created.Format(time.RFC3339Nano)), To: to, FromSession: from,
		Kind: "message", Payload: json.RawMessage(`{}`), CreatedAt: created,
		IdempotencyKey: idem, IdempotencySince: since,
	}
}

func appendSignal(t *testing.T, m *Store, ns sessionstore.NewSignal) (sessionstore.Signal, bool) {
	t.Helper()
	sig, dup, err := m.AppendSignal(t.Context(), ns, ns.CreatedAt)
	if err != nil {
		t.Fatalf("AppendSignal(%v, key %q): %v", ns.To, ns.IdempotencyKey, err)
	}
	return sig, dup
}

// checkBookkeeping fails unless every session's signals are in ascending seq
// with exactly the first acked acknowledged, and the idempotency index holds
// exactly the stored signals that have a key, each once, under its own key.
func checkBookkeeping(t *testing.T, m *Store) {
	t.Helper()
	keyed := 0
	for k, s := range m.sessions {
		if s.acked < 0 || s.acked > len(s.signals) {
			t.Fatalf("%v: acked = %d of %d signals", k, s.acked, len(s.signals))
		}
		for i, sg := range s.signals {
			if i > 0 && sg.sig.Seq <= s.signals[i-1].sig.Seq {
				t.Fatalf("%v: seq %d after %d", k, sg.sig.Seq, s.signals[i-1].sig.Seq)
			}
			if acked := !sg.ackedAt.IsZero(); acked != (i < s.acked) {
				t.Fatalf("%v: signal %d (seq %d) acknowledged = %v, but acked = %d", k, i, sg.sig.Seq, acked, s.acked)
			}
			if sg.sig.IdempotencyKey == "" {
				continue
			}
			keyed++
			n := 0
			for _, o := range m.idem[idemKeyOf(sg.sig)] {
				if o == sg {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("%v seq %d (key %q) is in the idempotency index %d times, want 1", k, sg.sig.Seq, sg.sig.IdempotencyKey, n)
			}
		}
	}
	indexed := 0
	for ik, sigs := range m.idem {
		if len(sigs) == 0 {
			t.Fatalf("idempotency index keeps an empty entry for %+v", ik)
		}
		indexed += len(sigs)
	}
	if indexed != keyed {
		t.Fatalf("idempotency index holds %d signals, the sessions %d: it keeps removed signals", indexed, keyed)
	}
}

// scanIdempotent is findIdempotent by a scan of every stored signal, as the
// store did before it kept an index.
func scanIdempotent(m *Store, ns sessionstore.NewSignal) *signal {
	since := ts(ns.IdempotencySince)
	var found *signal
	for k, s := range m.sessions {
		if k.TenantID != ns.To.TenantID || k.ProjectID != ns.To.ProjectID {
			continue
		}
		for _, sg := range s.signals {
			if sg.sig.FromSession == ns.FromSession && sg.sig.IdempotencyKey == ns.IdempotencyKey &&
				!sg.sig.CreatedAt.Before(since) && (found == nil || sg.sig.CreatedAt.After(found.sig.CreatedAt)) {
				found = sg
			}
		}
	}
	return found
}

func TestIdempotencyIndexForgetsRemovedSessions(t *testing.T) {
	for _, c := range []struct {
		name   string
		remove func(t *testing.T, m *Store, k sessionstore.Key)
	}{
		{"DeleteSession", func(t *testing.T, m *Store, k sessionstore.Key) {
			if err := m.DeleteSession(t.Context(), k); err != nil {
				t.Fatal(err)
			}
		}},
		{"Prune of the expired session", func(t *testing.T, m *Store, k sessionstore.Key) {
			if _, n, err := m.Prune(t.Context(), t0, t0.Add(time.Hour)); err != nil || n != 1 {
				t.Fatalf("Prune: %d sessions, %v; want 1", n, err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := New()
			alice := key("t", "alice")
			create(t, m, alice, t0.Add(time.Minute), t0)
			ns := newSignal(alice, "bob", "k", t0, t0.Add(-time.Hour))
			appendSignal(t, m, ns)
			if _, dup := appendSignal(t, m, ns); !dup {
				t.Fatal("repeat before removal: duplicate = false, want true")
			}

			c.remove(t, m, alice)
			checkBookkeeping(t, m)
			if len(m.idem) != 0 {
				t.Fatalf("idempotency index after removing the only session: %d entries, want 0", len(m.idem))
			}

			// Same key, same sender, to the session registered again: a new signal.
			now := t0.Add(2 * time.Hour)
			create(t, m, alice, now.Add(time.Hour), now)
			again := newSignal(alice, "bob", "k", now, t0.Add(-time.Hour))
			if sig, dup := appendSignal(t, m, again); dup || sig.Seq != 1 {
				t.Fatalf("send after removal: seq %d duplicate %v, want 1 false", sig.Seq, dup)
			}
			checkBookkeeping(t, m)
		})
	}
}

func TestIdempotencyOlderSignalOutlivesPrunedNewer(t *testing.T) {
	// One sender, one key, two signals (the second sent after the first left
	// the window). Pruning the newer one leaves the older one answering for
	// the key in any window that reaches back to it.
	m := New()
	ctx := t.Context()
	alice, carol := key("t", "alice"), key("t", "carol")
	create(t, m, alice, t0.Add(24*time.Hour), t0)
	create(t, m, carol, t0.Add(24*time.Hour), t0)
	older, _ := appendSignal(t, m, newSignal(alice, "bob", "k", t0, t0.Add(-time.Hour)))
	newer, dup := appendSignal(t, m, newSignal(carol, "bob", "k", t0.Add(2*time.Hour), t0.Add(time.Hour)))
	if dup {
		t.Fatal("send after the window: duplicate = true, want false")
	}
	probe := newSignal(alice, "bob", "k", t0.Add(3*time.Hour), t0.Add(-time.Hour))
	if got, dup := appendSignal(t, m, probe); !dup || got.ID != newer.ID {
		t.Fatalf("repeat with both stored: id %s duplicate %v, want the newer %s", got.ID, dup, newer.ID)
	}

	if _, err := m.AckSignals(ctx, carol, newer.Seq, t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n, _, err := m.Prune(ctx, t0.Add(3*time.Hour), t0); err != nil || n != 1 {
		t.Fatalf("Prune: %d signals, %v; want 1", n, err)
	}
	checkBookkeeping(t, m)
	if got, dup := appendSignal(t, m, probe); !dup || got.ID != older.ID {
		t.Fatalf("repeat after pruning the newer: id %s duplicate %v, want the older %s", got.ID, dup, older.ID)
	}
}

func TestBookkeepingUnderRandomOperations(t *testing.T) {
	// A seeded walk through every operation that adds, acknowledges or
	// removes signals. After each step the indexes must match the signals,
	// and every idempotency answer must match a scan of all signals.
	r := rand.New(rand.NewPCG(1, 2))
	m := New()
	ctx := t.Context()
	now := t0
	var keys []sessionstore.Key
	for _, tenant := range []string{"t", "u"} {
		for _, id := range []string{"a", "b", "c"} {
			keys = append(keys, key(tenant, id))
		}
	}
	senders := []string{"x", "y"}
	idems := []string{"", "k0", "k1", "k2"}
	for step := range 3000 {
		now = now.Add(time.Second)
		// Senders' clocks disagree: a signal may be created before one
		// appended earlier. The step in microseconds keeps every CreatedAt
		// distinct, so "newest" is unique.
		created := now.Add(time.Duration(step)*time.Microsecond - time.Duration(r.IntN(20))*time.Second)
		k := keys[r.IntN(len(keys))]
		var what string
		switch op := r.IntN(20); {
		case op < 10:
			ns := newSignal(k, senders[r.IntN(len(senders))], idems[r.IntN(len(idems))], created,
				now.Add(-time.Duration(r.IntN(60))*time.Second))
			what = fmt.Sprintf("append %q from %s to %v", ns.IdempotencyKey, ns.FromSession, k)
			var want *signal
			if ns.IdempotencyKey != "" {
				want = scanIdempotent(m, ns)
			}
			sig, dup, err := m.AppendSignal(ctx, ns, now)
			if errors.Is(err, sessionstore.ErrNotFound) {
				break // recipient not live
			}
			if err != nil {
				t.Fatalf("step %d, %s: %v", step, what, err)
			}
			if dup != (want != nil) || (dup && sig.ID != want.sig.ID) {
				t.Fatalf("step %d, %s: id %s duplicate %v; a scan finds %v", step, what, sig.ID, dup, want)
			}
		case op < 13:
			upTo := int64(r.IntN(5))
			if s, ok := m.sessions[k]; ok {
				upTo += s.lastSeq - 3
			}
			what = fmt.Sprintf("ack %v up to %d", k, upTo)
			_, err := m.AckSignals(ctx, k, upTo, now.Add(-time.Duration(r.IntN(30))*time.Second))
			if err != nil {
				t.Fatal(err)
			}
		case op < 14:
			what = fmt.Sprintf("drop %v", k)
			if _, err := m.DropPending(ctx, k, now); err != nil {
				t.Fatal(err)
			}
		case op < 16:
			what = "prune"
			if _, _, err := m.Prune(ctx, now.Add(-time.Duration(r.IntN(40))*time.Second),
				now.Add(-time.Duration(r.IntN(40))*time.Second)); err != nil {
				t.Fatal(err)
			}
		case op < 17:
			what = fmt.Sprintf("delete %v", k)
			if err := m.DeleteSession(ctx, k); err != nil && !errors.Is(err, sessionstore.ErrNotFound) {
				t.Fatal(err)
			}
		default:
			what = fmt.Sprintf("create %v", k)
			if s, ok := m.sessions[k]; ok && live(s, now) {
				break
			}
			create(t, m, k, now.Add(time.Duration(10+r.IntN(120))*time.Second), now)
		}
		checkBookkeeping(t, m)
		for _, k := range keys {
			s, ok := m.sessions[k]
			if !ok {
				continue
			}
			want := 0
			for _, sg := range s.signals {
				if sg.ackedAt.IsZero() {
					want++
				}
			}
			if n, _ := m.CountPending(ctx, k); n != want {
				t.Fatalf("step %d, after %s: CountPending(%v) = %d, want %d", step, what, k, n, want)
			}
		}
	}
	if len(m.idem) == 0 {
		t.Fatal("the walk never left an indexed signal behind; it exercises too little")
	}
}
