package hub_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// hangingAppends is a store whose appends wait for their context to end,
// as a call to a store that stopped answering does.
type hangingAppends struct{ sessionstore.Store }

func (s hangingAppends) AppendSignal(ctx context.Context, n sessionstore.NewSignal, now time.Time) (sessionstore.Signal, bool, error) {
	<-ctx.Done()
	return sessionstore.Signal{}, false, ctx.Err()
}

// A store call that does not answer within MARCONI_STORE_TIMEOUT ends
// there: the send is answered 503 registry_unavailable, not held open.
func TestStoreTimeoutBoundsASend(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Store: hangingAppends{memstore.New()},
		Config: hub.Config{StoreTimeout: 100 * time.Millisecond}})
	alice := register(t, h, "alice", "claude_code")
	register(t, h, "bob", "claude_code")
	st, body := call(t, "POST", h.URL+"/v1/signals", alice.Token, map[string]any{"to_session": "bob", "kind": "k"})
	if st != http.StatusServiceUnavailable || errCode(body) != "registry_unavailable" {
		t.Fatalf("send to a store that never answers: %d %v, want 503 registry_unavailable", st, body)
	}
}
