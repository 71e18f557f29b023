package hub_test

import (
	"context"
	"crypto/sha256"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// reRegistering is a store that registers a session again (a new
// registration and token under the same id) while a drain of it reads its
// signals: between the call's authentication and its proof of life.
type reRegistering struct {
	*memstore.Store
	once  sync.Once
	again sessionstore.Session // the registration made meanwhile
	err   error
}

func (s *reRegistering) PendingSignals(ctx context.Context, k sessionstore.Key, after int64, limit int) ([]sessionstore.Signal, error) {
	s.once.Do(func() {
		old, err := s.GetSession(ctx, k, time.Now())
		if err != nil {
			s.err = err
			return
		}
		if s.err = s.DeleteSession(ctx, k); s.err != nil {
			return
		}
		now := time.Now().UTC().Truncate(time.Microsecond)
		h := sha256.Sum256([]byte("the new registration's token"))
		again := old
		again.TokenHash, again.RegisteredAt, again.LastSeenAt, again.LastVerbAt = h[:], now, now, time.Time{}
		again.ExpiresAt = now.Add(time.Minute)
		s.again, s.err = s.CreateSession(ctx, again, now)
	})
	return s.Store.PendingSignals(ctx, k, after, limit)
}

// TestCallDoesNotExtendTheRegistrationThatReplacedIt: a call authenticated
// with a token whose session is registered again before the call records
// its proof of life extends nothing: not the new registration, which its
// token never held.
func TestCallDoesNotExtendTheRegistrationThatReplacedIt(t *testing.T) {
	store := &reRegistering{Store: memstore.New()}
	h := hubtest.Start(t, hubtest.Options{Store: store})
	bob := register(t, h, "bob", "codex")

	if st, resp := call(t, http.MethodGet, h.URL+"/v1/signals", bob.Token, nil); st != http.StatusOK {
		t.Fatalf("drain: %d %v", st, resp)
	}
	if store.err != nil {
		t.Fatalf("registering bob again: %v", store.err)
	}
	got, err := store.GetSession(t.Context(), store.again.Key, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !got.ExpiresAt.Equal(store.again.ExpiresAt) || !got.LastVerbAt.IsZero() {
		t.Fatalf("the new registration after the old token's call: expires %v, last verb %v; want %v and none (untouched)",
			got.ExpiresAt, got.LastVerbAt, store.again.ExpiresAt)
	}
}
