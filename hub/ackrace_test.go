package hub_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// racedAcks is a store with a history whose AckSignalsAs always finds the
// session changed while the ack was checked, as pgstore's does when another
// write reaches the row between its check and its update.
type racedAcks struct {
	*memstore.Store
	asked atomic.Int32
}

func (s *racedAcks) HistoryToken() (uint64, string) { return 1, "h1" }

func (s *racedAcks) AckSignalsAs(context.Context, sessionstore.Key, sessionstore.Holder, int64, time.Time) (int, error) {
	s.asked.Add(1)
	return 0, fmt.Errorf("the session changed while its ack was checked: %w", sessionstore.ErrConflict)
}

// TestAckRacedTwiceIsRetryable: an HTTP ack under a history whose session
// changes under it twice running is a 503 registry_unavailable with
// Retry-After, a conflict to retry, never a 500; nothing is acknowledged and
// no store outage is counted.
func TestAckRacedTwiceIsRetryable(t *testing.T) {
	store := &racedAcks{Store: memstore.New()}
	h := hubtest.Start(t, hubtest.Options{Store: store})
	alice := register(t, h, "alice", "codex")
	bob := register(t, h, "bob", "codex")
	send(t, h, alice, "bob", map[string]any{"n": 1})

	req, _ := http.NewRequest(http.MethodPost, h.URL+"/v1/signals/ack", strings.NewReader(`{"up_to_seq":1,"history":"h1"}`))
	req.Header.Set("Authorization", "Bearer "+bob.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || errCode(body) != "registry_unavailable" || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("ack raced twice: %d %v Retry-After %q; want 503 registry_unavailable with Retry-After: 1",
			resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	if n := store.asked.Load(); n != 2 {
		t.Fatalf("the store was asked %d times, want 2 (the ack, and once more)", n)
	}
	if n, err := store.CountPending(t.Context(), sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}); err != nil || n != 1 {
		t.Fatalf("pending after the refused ack: %d, %v; want 1", n, err)
	}
	if got := metric(t, h, "marconi_registry_errors_total"); got != 0 {
		t.Fatalf("marconi_registry_errors_total = %v, want 0: a lost race is no store outage", got)
	}
}
