package pgstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
)

// TestHistoryCountsServerHistories: the first history seen is 1, the same
// again changes nothing, another one counts (and is counted as a change),
// a server in recovery tells nothing.
func TestHistoryCountsServerHistories(t *testing.T) {
	h := newHistory()
	id := func(s string) *string { return &s }
	steps := []struct {
		saw  *string
		want uint64
	}{
		{nil, 0}, {id("7714/00000001"), 1}, {id("7714/00000001"), 1}, {nil, 1},
		{id("7714/00000002"), 2}, {id("9999/00000001"), 3},
	}
	for i, st := range steps {
		h.saw(st.saw)
		if got := h.load().n; got != st.want {
			t.Fatalf("step %d: history %d, want %d", i, got, st.want)
		}
	}
}

// TestHistoryTokenNamesTheHistory: the token is an opaque digest of the
// server's history, the same for the same one (every instance computes
// it alike), another for another, and never the system identifier itself.
func TestHistoryTokenNamesTheHistory(t *testing.T) {
	a, b := newHistory(), newHistory()
	id := func(s string) *string { return &s }
	a.saw(id("7714/00000001"))
	b.saw(id("7714/00000001"))
	if a.load().token == "" || a.load().token != b.load().token {
		t.Fatalf("tokens of one history: %q and %q, want equal and not empty", a.load().token, b.load().token)
	}
	first := a.load().token
	a.saw(id("7714/00000002"))
	if got := a.load(); got.n != 2 || got.token == first || strings.Contains(got.token, "7714") || len(got.token) != 16 {
		t.Fatalf("after a change: %+v, want history 2 under a new 16-digit token (first %q)", got, first)
	}
}

// TestFirstConnectionReadsTheHistory: a store's first connection makes its
// history 1; a new connection to the same server leaves it there.
func TestFirstConnectionReadsTheHistory(t *testing.T) {
	u := pgtest.Schema(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	idle, err := Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if got := idle.History(); got != 0 {
		t.Fatalf("history %d before any connection, want 0", got)
	}
	s, k, _ := storeWithBob(ctx, t, u) // its first connection registers bob
	if got := s.History(); got != 1 {
		t.Fatalf("history %d after the first connection, want 1", got)
	}
	s.pool.Reset() // every connection closed: the next call connects again
	if _, err := s.CountPending(ctx, k); err != nil {
		t.Fatal(err)
	}
	if got := s.History(); got != 1 {
		t.Errorf("history %d after connecting again to the same server, want 1", got)
	}
}

// TestAckUnderAnEarlierHistoryIsRefused: an ack whose holder was caught up
// under an earlier history than the store's acknowledges nothing and says
// so; one under the store's history, or checking none, acknowledges.
func TestAckUnderAnEarlierHistoryIsRefused(t *testing.T) {
	u := pgtest.Schema(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, k, now := storeWithBob(ctx, t, u)
	appendSignals(ctx, t, s, k, now, 3, benchPayload)
	sess, err := s.GetSession(ctx, k, now)
	if err != nil {
		t.Fatal(err)
	}
	s.hist.saw(new("another/00000002")) // as a connection to a promoted standby would
	if got := s.History(); got != 2 {
		t.Fatalf("history %d, want 2", got)
	}
	h := sessionstore.Holder{RegisteredAt: sess.RegisteredAt, TokenHash: sess.TokenHash, History: 1}
	n, err := s.AckSignalsAs(ctx, k, h, 3, now)
	if !errors.Is(err, sessionstore.ErrHistoryChanged) || n != 0 {
		t.Fatalf("ack under history 1 of 2: %d, %v; want 0 and ErrHistoryChanged", n, err)
	}
	if p, err := s.CountPending(ctx, k); err != nil || p != 3 {
		t.Fatalf("pending after the refused ack: %d, %v; want 3", p, err)
	}
	h.History = 2
	if n, err := s.AckSignalsAs(ctx, k, h, 1, now); err != nil || n != 1 {
		t.Fatalf("ack under the store's history: %d, %v; want 1", n, err)
	}
	h.History = 0
	if n, err := s.AckSignalsAs(ctx, k, h, 3, now); err != nil || n != 2 {
		t.Fatalf("ack checking no history: %d, %v; want 2", n, err)
	}
}
