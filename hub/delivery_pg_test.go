package hub_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// pgStore opens a pgstore on a fresh schema of its own; it skips without
// MARCONI_TEST_DATABASE_URL (and fails with MARCONI_TEST_REQUIRE_POSTGRES=1).
func pgStore(t *testing.T) *pgstore.Store {
	t.Helper()
	u := pgtest.Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := pgstore.Open(ctx, u)
	if err != nil {
		t.Fatalf("open pgstore: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestPGSignalsSurviveHubRestart(t *testing.T) {
	t.Parallel()
	store := pgStore(t)
	h1 := hubtest.Start(t, hubtest.Options{Store: store})
	alice := register(t, h1, "alice", "claude_code")
	bob := register(t, h1, "bob", "claude_code")

	// Bob is attached when the hub goes down: he gets 1012.
	c, _ := dial(t, h1, bob)
	r := send(t, h1, alice, "bob", 1)
	if r["delivery"] != "pushed_to_ws" {
		t.Fatalf("send to attached bob: %v", r)
	}
	wantSeqs(t, "live on the first hub", seqs(t, readSignals(t, c, 1)), 1, 1)
	// Bob reads while the hub closes, so that the close handshake completes.
	closed := make(chan error, 1)
	go func() {
		_, _, err := c.Read(context.Background())
		closed <- err
	}()
	h1.Close()
	err := <-closed
	if code := closeStatus(err); code != 1012 {
		t.Fatalf("bob's connection closed with %d (%v), want 1012", code, err)
	}

	// A new hub on the same store, with the same instance id and credentials.
	h2 := hubtest.Start(t, hubtest.Options{Store: store, Config: hub.Config{
		APIKeys:    map[string]hub.TenantProject{h1.APIKey: {TenantID: "t1", ProjectID: "p1"}},
		AdminToken: h1.AdminToken,
		InstanceID: "test-1",
	}})
	if rs := routeState(t, h2, "bob"); rs["route_state"] != "route_without_queue" || rs["pending_signals"] != float64(1) {
		t.Fatalf("bob after the restart: %v %v", rs["route_state"], rs["pending_signals"])
	}
	// Alice's token still works: her session survived.
	for i := 2; i <= 5; i++ {
		if r := send(t, h2, alice, "bob", i); r["delivery"] != "queued_offline" || seqOf(t, r) != int64(i) {
			t.Fatalf("send %d after the restart: %v", i, r)
		}
	}
	// Bob resumes with his token, attaches and gets every signal in order.
	st, res := call(t, "POST", h2.URL+"/v1/sessions", h2.APIKey, map[string]any{"session_id": "bob", "surface": "claude_code"},
		"X-Marconi-Session-Token", bob.Token)
	if st != http.StatusOK {
		t.Fatalf("bob resumes: %d %v", st, res)
	}
	bob.Token = res["token"].(string)
	c, w := dial(t, h2, bob)
	if w["replayed"] != float64(5) {
		t.Fatalf("welcome replayed = %v, want 5", w["replayed"])
	}
	got := readSignals(t, c, 5)
	wantSeqs(t, "after the restart", seqs(t, got), 1, 5)
	for i, f := range got {
		if f["payload"] != float64(i+1) || f["from_session"] != "alice" {
			t.Fatalf("signal %d = %v", i+1, f)
		}
	}
}

func TestPGReplayRacingConcurrentSends(t *testing.T) {
	t.Parallel()
	h := hubtest.Start(t, hubtest.Options{Store: pgStore(t), Config: hub.Config{WSQueueSize: 1024, SendRatePerSecond: 10000}})
	raceReplayWithSends(t, h, 300, 6)
}
