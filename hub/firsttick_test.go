package hub_test

import (
	"context"
	"sync"
	"testing"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// slowFirstTick holds instance's heartbeats until release is closed, as a
// store slow under load holds the first tick of a process just started:
// the tick heartbeats before it reads the instance table, so the process's
// view of the others stays unread meanwhile.
type slowFirstTick struct {
	sessionstore.Store
	instance string
	release  chan struct{}
}

func (s *slowFirstTick) HeartbeatInstance(ctx context.Context, in sessionstore.Instance) error {
	if in.ID == s.instance {
		select {
		case <-s.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.Store.HeartbeatInstance(ctx, in)
}

// An instance serves before its first tick has read the instance table
// (TestPGPropertyDelivery met it under load, a send through an instance
// just restarted): it must not answer for a queue attached on a live peer
// as if that peer were dead. It reads the table at its first decision.
func TestSendThroughAnInstanceBeforeItsFirstTick(t *testing.T) {
	t.Parallel()
	st := &slowFirstTick{Store: memstore.New(), instance: "b", release: make(chan struct{})}
	key, admin := hub.NewAPIKey(), hub.NewAdminToken()
	cfg := func(id string) hub.Config {
		return hub.Config{InstanceID: id, APIKeys: map[string]hub.TenantProject{key: {TenantID: "t1", ProjectID: "p1"}}, AdminToken: admin}
	}
	a := hubtest.Start(t, hubtest.Options{Store: st, Config: cfg("a")})
	ctx := context.Background()
	if err := a.Server.Fabric().Tick(ctx); err != nil { // a's heartbeat is in the store
		t.Fatal(err)
	}
	alice := registerWithKey(t, a, key, "alice", "claude_code")
	bob := registerWithKey(t, a, key, "bob", "claude_code")
	dial(t, a, bob) // bob's queue is on a

	b := hubtest.Start(t, hubtest.Options{Store: st, Config: cfg("b")})
	// Cleanups run last first: b's tick is let go before b is stopped.
	release := sync.OnceFunc(func() { close(st.release) })
	t.Cleanup(release)

	got := send(t, b, alice, "bob", "hello")
	if got["delivery"] != "pushed_to_ws" || got["recipient_route_state"] != "attached" {
		t.Fatalf("send through b before its first tick: delivery %v, recipient_route_state %v; want pushed_to_ws, attached (bob is attached on a, alive)",
			got["delivery"], got["recipient_route_state"])
	}
	release()
}
