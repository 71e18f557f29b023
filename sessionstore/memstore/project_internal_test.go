package memstore

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// checkProjectIndex: byProject holds exactly the stored sessions, by
// project, and no empty project.
func checkProjectIndex(t *testing.T, m *Store) {
	t.Helper()
	n := 0
	for p, sessions := range m.byProject {
		if len(sessions) == 0 {
			t.Fatalf("byProject keeps an empty entry for %+v", p)
		}
		for k, s := range sessions {
			if projectOf(k) != p || m.sessions[k] != s {
				t.Fatalf("byProject[%+v] holds %v, which the store does not hold there", p, k)
			}
			n++
		}
	}
	if n != len(m.sessions) {
		t.Fatalf("byProject holds %d sessions, the store %d", n, len(m.sessions))
	}
}

// TestProjectIndexUnderRandomOperations creates, replaces (over expired),
// deletes and prunes sessions at random and checks the per-project index,
// and CountSessions against a scan, after each step.
func TestProjectIndexUnderRandomOperations(t *testing.T) {
	m := New()
	rng := rand.New(rand.NewPCG(12, 34))
	now := t0
	for step := range 2000 {
		k := sessionstore.Key{TenantID: []string{"a", "b"}[rng.IntN(2)], ProjectID: []string{"p", "q", "r"}[rng.IntN(3)], SessionID: string(rune('a' + rng.IntN(8)))}
		switch op := rng.IntN(10); {
		case op < 6: // a create; over an expired one it replaces it
			_, _ = m.CreateSession(t.Context(), sessionstore.Session{Key: k, TokenHash: []byte{byte(step), byte(step >> 8)}, RegisteredAt: now,
				ExpiresAt: now.Add(time.Duration(1+rng.IntN(5)) * time.Minute)}, now)
		case op < 8:
			_ = m.DeleteSession(t.Context(), k)
		case op < 9:
			now = now.Add(time.Minute)
		default:
			_, _, _ = m.Prune(t.Context(), now, now.Add(-time.Minute))
		}
		checkProjectIndex(t, m)
		f := sessionstore.SessionFilter{TenantID: k.TenantID, ProjectID: k.ProjectID}
		got, _ := m.CountSessions(t.Context(), f, now)
		all, _ := m.ListSessions(t.Context(), f, now)
		if got != len(all) {
			t.Fatalf("step %d: CountSessions(%+v) = %d, ListSessions has %d", step, f, got, len(all))
		}
	}
}
