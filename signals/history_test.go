package signals_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
	"github.com/marconihub/marconi/signals"
	"github.com/marconihub/marconi/signals/selfheal"
)

// movingHistory is a store whose history moves from 1 to 2 while an ack is
// on its way to the commit, as a standby promoted between the ack's check
// and its write would; its AckSignalsAs refuses, as pgstore's group commit
// does, an ack whose holder names another history than the store's by then.
type movingHistory struct {
	*memstore.Store
	n    atomic.Uint64
	gave atomic.Uint64 // the Holder.History of the last AckSignalsAs
}

func (s *movingHistory) HistoryToken() (uint64, string) {
	n := s.n.Load()
	return n, fmt.Sprintf("h%d", n)
}

func (s *movingHistory) AckSignalsAs(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, upTo int64, at time.Time) (int, error) {
	s.gave.Store(h.History)
	if s.n.CompareAndSwap(1, 2) || (h.History != 0 && h.History != s.n.Load()) {
		return 0, sessionstore.ErrHistoryChanged
	}
	return s.Store.AckSignalsAs(ctx, k, h, upTo, at)
}

// TestAckUnderAHistory: an ack naming the store's history is made under
// it, and refused history_changed when the history moves before it
// commits; one naming another history is refused without reaching the
// store; one naming none acknowledges as ever.
func TestAckUnderAHistory(t *testing.T) {
	ctx := t.Context()
	clock := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	store := &movingHistory{Store: memstore.New()}
	store.n.Store(1)
	svc := newService(t, store, clock)
	k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "bob"}
	hash := sha256.Sum256([]byte("bob"))
	bob, err := store.CreateSession(ctx, sessionstore.Session{Key: k, Surface: "codex", RuntimeMode: "stateless",
		RuntimeModeSource: "default", TokenHash: hash[:], RegisteredAt: clock, LastSeenAt: clock, ExpiresAt: clock.Add(time.Hour)}, clock)
	if err != nil {
		t.Fatal(err)
	}
	alice := bob
	alice.SessionID = "alice"
	alice.TokenHash = []byte("alice's token hash, 32 bytes....")
	alice, err = store.CreateSession(ctx, alice, clock)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := svc.Send(ctx, signals.SendRequest{Sender: alice, To: "bob"}); err != nil {
			t.Fatal(err)
		}
	}
	holder := sessionstore.Holder{RegisteredAt: bob.RegisteredAt, TokenHash: bob.TokenHash}
	pending := func() int {
		n, err := store.CountPending(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Equal tokens, but the history moves before the commit.
	n, err := svc.AckUnder(ctx, k, holder, 2, "h1")
	if marconi.ErrorCode(err) != marconi.CodeHistoryChanged || n != 0 || pending() != 3 {
		t.Fatalf("ack under h1 while the store moved to h2: %d, %v, %d pending; want history_changed and 3 pending", n, err, pending())
	}
	if got := store.gave.Load(); got != 1 {
		t.Fatalf("the ack reached the store under history %d, want 1 (the one its token named)", got)
	}
	// Another token than the store's: refused before the store.
	store.gave.Store(0)
	if n, err := svc.AckUnder(ctx, k, holder, 2, "h1"); marconi.ErrorCode(err) != marconi.CodeHistoryChanged || n != 0 || store.gave.Load() != 0 {
		t.Fatalf("ack under h1 on h2: %d, %v (store asked under %d); want history_changed before the store", n, err, store.gave.Load())
	}
	if n, err := svc.AckUnder(ctx, k, holder, 1, "h2"); err != nil || n != 1 {
		t.Fatalf("ack under the store's history: %d, %v; want 1", n, err)
	}
	if n, err := svc.AckUnder(ctx, k, holder, 3, ""); err != nil || n != 2 {
		t.Fatalf("ack naming no history: %d, %v; want 2", n, err)
	}
	other := holder
	other.TokenHash = []byte("another token")
	if _, err := svc.AckUnder(ctx, k, other, 3, "h2"); marconi.ErrorCode(err) != marconi.CodeSessionExpired {
		t.Fatalf("ack by a token the session no longer holds: %v, want session_expired", err)
	}
}

// TestDrainUnderAnotherHistory: a drain naming the store's history, or
// none, reads after its seq; one naming another reads from the
// acknowledged seq and says so; every answer names the store's history.
func TestDrainUnderAnotherHistory(t *testing.T) {
	ctx := t.Context()
	w := newRecipientWorld(t, 0)
	for range 3 {
		if _, err := w.svc.Send(ctx, signals.SendRequest{Sender: w.sender, To: "bob"}); err != nil {
			t.Fatal(err)
		}
	}
	plain, err := w.svc.Drain(ctx, signals.DrainRequest{Key: w.bob, AfterSeq: 2, History: "h1"})
	if err != nil || len(plain.Signals) != 1 || plain.History != "" || plain.HistoryChanged {
		t.Fatalf("drain on a store that keeps no history: %+v, %v; want seq 3 alone, no history", plain, err)
	}
	store := &movingHistory{Store: w.store.Store}
	store.n.Store(2)
	svc := newService(t, store, w.clock)
	for _, tt := range []struct {
		history     string
		after, next int64
		seqs        int
		changed     bool
	}{
		{"", 2, 3, 1, false},
		{"h2", 2, 3, 1, false},
		{"h1", 2, 3, 3, true},
		{"h1", 3, 3, 3, true},
	} {
		res, err := svc.Drain(ctx, signals.DrainRequest{Key: w.bob, AfterSeq: tt.after, History: tt.history})
		if err != nil || len(res.Signals) != tt.seqs || res.NextAfterSeq != tt.next || res.History != "h2" || res.HistoryChanged != tt.changed {
			t.Errorf("drain after %d under %q: %d signals, next %d, history %q, changed %v, %v; want %d, %d, h2, %v",
				tt.after, tt.history, len(res.Signals), res.NextAfterSeq, res.History, res.HistoryChanged, err, tt.seqs, tt.next, tt.changed)
		}
	}
}

// newService is the send path on store, its clock stopped at clock.
func newService(t *testing.T, store signals.Store, clock time.Time) *signals.Service {
	t.Helper()
	now := func() time.Time { return clock }
	sh, err := selfheal.New(selfheal.Config{}.WithDefaults(marconi.Development), now, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := signals.New(signals.Config{}, store, rowRouter{}, sh, now, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}
