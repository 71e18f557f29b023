package bootstrap_test

import (
	"context"
	"errors"
	"testing"
	"time"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// A Dial whose registration answers are lost (the hub registered the
// session, the connection died) registers again with the same
// Idempotency-Key: the hub answers with a new token, the client attaches and
// receives, and another client claiming the id with a key of its own is
// still refused.
func TestDialRetriesLostRegistration(t *testing.T) {
	testDialRetriesLostRegistration(t, memstore.New())
}

func TestPGDialRetriesLostRegistration(t *testing.T) {
	t.Parallel()
	testDialRetriesLostRegistration(t, pgStore(t, ""))
}

func testDialRetriesLostRegistration(t *testing.T, store sessionstore.Store) {
	h := hubtest.Start(t, hubtest.Options{Store: store})
	lossy := newLossyPathProxy(t, h.URL, "/v1/sessions", 2)
	var in inbox
	c := dialConfig(t, bootstrap.Config{HubURL: lossy.URL, APIKey: h.APIKey, SessionID: "agent-a", OnSignal: in.on})

	keys := lossy.droppedKeys()
	if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] {
		t.Fatalf("Idempotency-Key of the lost registrations = %q, want one key twice", keys)
	}
	if len(keys[0]) < 22 { // 128 bits in base32 or base64url
		t.Errorf("Idempotency-Key %q is too short to hold 128 random bits", keys[0])
	}
	other := dial(t, h.URL, h.APIKey, "other", nil)
	res := send(t, other, "agent-a", "after the lost answers")
	waitFor(t, "agent-a to receive", func() bool { return in.len() == 1 })
	if res.Delivery != "pushed_to_ws" {
		t.Errorf("send to agent-a = %+v, want pushed_to_ws", res)
	}
	if got := send(t, c, "other", "from agent-a"); got.SignalID == "" {
		t.Errorf("send from agent-a: %+v", got)
	}
	if st := c.Stats(); st.Reregistrations != 0 {
		t.Errorf("stats %+v: a retried registration is not a re-registration", st)
	}

	// No hijack: another client with the same id has a key of its own.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	thief, err := bootstrap.Dial(ctx, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "agent-a", Surface: "claude_code"})
	var he *bootstrap.Error
	if err == nil || !errors.As(err, &he) || he.Code != "forbidden" {
		if thief != nil {
			_ = thief.Close()
		}
		t.Fatalf("second client dialing agent-a: %v, want 403 forbidden", err)
	}
	if got := send(t, c, "other", "still agent-a's"); got.SignalID == "" {
		t.Errorf("send from agent-a after the refused claim: %+v", got)
	}
}

// A re-registration after 410 whose answer is lost is retried with its key
// too: the client ends up registered, not refused until the TTL.
func TestReregistrationRetriesLostAnswer(t *testing.T) {
	clock := hubtest.NewClock(time.Now())
	h := hubtest.Start(t, hubtest.Options{Now: clock.Now})
	lossy := newLossyPathProxy(t, h.URL, "/v1/sessions", 0)
	var in inbox
	c := dialConfig(t, bootstrap.Config{HubURL: lossy.URL, APIKey: h.APIKey, SessionID: "phoenix", OnSignal: in.on})
	clock.Advance(2 * time.Hour) // beyond the default TTL of one hour
	witness := dial(t, h.URL, h.APIKey, "witness", nil)
	lossy.drop.Store(1)
	send(t, c, "witness", "x") // meets 410, registers again, the answer is lost, registers again
	if keys := lossy.droppedKeys(); len(keys) != 1 || keys[0] == "" {
		t.Fatalf("dropped registrations %q, want one with a key", keys)
	}
	waitFor(t, "phoenix to reattach", func() bool { return c.Stats().Reconnects == 1 })
	got := send(t, witness, "phoenix", "y")
	waitFor(t, "the signal", func() bool { return in.len() == 1 && in.ids()[0] == got.SignalID })
	if st := c.Stats(); st.Reregistrations != 1 {
		t.Errorf("stats %+v, want one re-registration", st)
	}
}
