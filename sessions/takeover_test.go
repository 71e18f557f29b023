package sessions_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/sessions"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// racingStore is a memory store on which another registration resumes
// the session right after each read of it, as a resume racing a takeover
// on another instance would, for the first races reads.
type racingStore struct {
	*memstore.Store
	races int
	n     int
}

func (r *racingStore) GetSession(ctx context.Context, k sessionstore.Key, now time.Time) (sessionstore.Session, error) {
	sess, err := r.Store.GetSession(ctx, k, now)
	if err == nil && r.n < r.races {
		r.n++
		if _, err := r.Store.ResumeSession(ctx, k, sess.TokenHash, sessions.HashToken(sessions.NewToken()), sessionstore.Touch{}, now); err != nil {
			return sess, err
		}
	}
	return sess, err
}

func newService(t *testing.T, store sessions.Store) *sessions.Service {
	t.Helper()
	reg := prometheus.NewRegistry()
	f, err := fabric.New(fabric.Config{InstanceID: "test"}, memstore.New(), time.Now, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := sessions.New(sessions.Config{
		SessionTTL: time.Hour, QuotaSessionsPerProject: 100, QuotaRegistrationsPerSecond: 100,
		RetryWindow: time.Minute, AllowTakeover: true,
	}, sessions.Deps{Store: store, Placer: f, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A takeover is a compare-and-set on the token it read: a resume racing it
// is never undone silently. It reads again and takes the session over from
// the token the race left; when the session keeps changing hands it gives
// up with 403 and the last token stays the session's.
func TestTakeoverRacingAResume(t *testing.T) {
	ctx := context.Background()
	project := sessions.Project{TenantID: "t", ProjectID: "p"}
	req := sessions.RegisterRequest{Project: project, SessionID: "alice", Surface: "claude_code"}
	for _, tc := range []struct {
		races   int
		outcome sessions.Outcome // empty: refused
	}{
		{races: 1, outcome: sessions.OutcomeTakenOver},
		{races: 2, outcome: sessions.OutcomeTakenOver},
		{races: 3},
	} {
		store := &racingStore{Store: memstore.New()}
		s := newService(t, store)
		if _, err := s.Register(ctx, req); err != nil {
			t.Fatal(err)
		}
		store.races = tc.races
		takeover := req
		takeover.Takeover = true
		reg, err := s.Register(ctx, takeover)
		k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "alice"}
		now, _ := store.Store.GetSession(ctx, k, time.Now())
		if tc.outcome == "" {
			if e, ok := errors.AsType[*marconi.Error](err); !ok || e.Code != marconi.CodeForbidden {
				t.Fatalf("%d races: %v, want 403 forbidden", tc.races, err)
			}
			if store.n != tc.races {
				t.Errorf("%d races: the takeover read the session %d times", tc.races, store.n)
			}
			continue
		}
		if err != nil || reg.Outcome != tc.outcome {
			t.Fatalf("%d races: %v %v, want %s", tc.races, reg.Outcome, err, tc.outcome)
		}
		if string(now.TokenHash) != string(sessions.HashToken(reg.Token)) {
			t.Errorf("%d races: the session does not hold the takeover's token", tc.races)
		}
	}
}
