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
// registration and token under the same id) just before its first touch:
// between a call's authentication and its proof of life.
type reRegistering struct {
	*memstore.Store
	once  sync.Once
	again sessionstore.Session // the registration made meanwhile
	err   error
}

func (s *reRegistering) registerAgain(ctx context.Context, k sessionstore.Key) {
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
		again.TokenHash, again.RegisteredAt, again.LastSeenAt, again.LastVerbAt = h[:], now, time.Time{}, time.Time{}
		again.ExpiresAt = now.Add(time.Minute)
		s.again, s.err = s.CreateSession(ctx, again, now)
	})
}

func (s *reRegistering) TouchSession(ctx context.Context, k sessionstore.Key, t sessionstore.Touch, now time.Time) error {
	s.registerAgain(ctx, k)
	return s.Store.TouchSession(ctx, k, t, now)
}

func (s *reRegistering) TouchSessionAs(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, t sessionstore.Touch, now time.Time) error {
	s.registerAgain(ctx, k)
	return s.Store.TouchSessionAs(ctx, k, h, t, now)
}

// untouched fails t unless the registration made meanwhile is as it was
// made: the old token's call extended nothing.
func (s *reRegistering) untouched(t *testing.T) {
	t.Helper()
	if s.err != nil {
		t.Fatalf("registering bob again: %v", s.err)
	}
	got, err := s.GetSession(t.Context(), s.again.Key, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !got.ExpiresAt.Equal(s.again.ExpiresAt) || !got.LastVerbAt.IsZero() || !got.LastSeenAt.IsZero() {
		t.Fatalf("the new registration after the old token's call: expires %v, last verb %v, last seen %v; want %v and none (untouched)",
			got.ExpiresAt, got.LastVerbAt, got.LastSeenAt, s.again.ExpiresAt)
	}
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
	store.untouched(t)
}

// TestHeartbeatDoesNotExtendTheRegistrationThatReplacedIt: a heartbeat
// whose session is registered again between its authentication and its
// write extends nothing and answers 410 session_expired: its token holds
// no live session.
func TestHeartbeatDoesNotExtendTheRegistrationThatReplacedIt(t *testing.T) {
	store := &reRegistering{Store: memstore.New()}
	h := hubtest.Start(t, hubtest.Options{Store: store})
	bob := register(t, h, "bob", "codex")

	if st, resp := call(t, http.MethodPost, h.URL+"/v1/heartbeat", bob.Token, nil); st != http.StatusGone || errCode(resp) != "session_expired" {
		t.Fatalf("heartbeat overtaken by a registration again: %d %v; want 410 session_expired", st, resp)
	}
	store.untouched(t)
}
