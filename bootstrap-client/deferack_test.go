package bootstrap_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// With DeferAck the client acknowledges nothing by itself: a signal handed to
// OnSignal and never acknowledged comes again to the session's next client;
// Ack acknowledges it and every earlier one, for good.
func TestDeferAckLeavesAckToTheApplication(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	ctx := context.Background()
	store := bootstrap.FileTokenStore(t.TempDir() + "/bob.json")
	dial := func(in *inbox) *bootstrap.Client {
		c, err := bootstrap.Dial(ctx, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "bob",
			Surface: "claude_code", DeferAck: true, OnSignal: in.on, TokenStore: store})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	alice, err := bootstrap.Dial(ctx, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "alice", Surface: "claude_code"})
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()

	var first inbox
	bob := dial(&first)
	for _, s := range []string{"one", "two", "three"} {
		if _, err := alice.Send(ctx, "bob", "", map[string]string{"text": s}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "three signals", func() bool { return first.len() == 3 })
	bob.Close()

	var second inbox
	bob = dial(&second)
	waitFor(t, "the three again", func() bool { return second.len() == 3 })
	if err := bob.Ack(ctx, second.sigs[1]); err != nil { // one and two
		t.Fatal(err)
	}
	// The ack rides the WebSocket, which a Close right behind it may cut
	// before the hub has read it (then the signals come again: at least
	// once). Wait until the hub has it, so the next client's view is known.
	bobKey := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	waitFor(t, "the hub to record the ack of one and two", func() bool {
		left, err := h.Store.PendingSignals(ctx, bobKey, 0, 10)
		return err == nil && len(left) == 1
	})
	bob.Close()

	var third inbox
	bob = dial(&third)
	defer bob.Close()
	waitFor(t, "three alone", func() bool { return third.len() == 1 })
	if third.sigs[0].Seq != 3 {
		t.Fatalf("after acking up to two, the next client got seq %d", third.sigs[0].Seq)
	}
	if err := bob.Ack(ctx, second.sigs[0]); err != nil { // a signal this client never held: nothing
		t.Fatal(err)
	}
}

// DialPiggyback attaches no WebSocket: the session reads by drain.
func TestDialPiggybackDrains(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	ctx := context.Background()
	var in inbox
	cx, alice := piggybackPair(t, h, bootstrap.Config{OnSignal: in.on})
	res, err := alice.Send(ctx, "cx", "", map[string]string{"text": "hi"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Delivery == "pushed_to_ws" {
		t.Fatalf("pushed to a piggyback-only session: %+v", res)
	}
	upTo, err := cx.Drain(ctx)
	if err != nil || upTo != res.Seq {
		t.Fatalf("drain: %d %v, want up to %d", upTo, err, res.Seq)
	}
	waitFor(t, "the drained signal", func() bool { return in.len() == 1 })
	state, err := cx.Heartbeat(ctx)
	if err != nil || state == "attached" {
		t.Fatalf("heartbeat: %q %v", state, err)
	}
	if reg := cx.Registration(); reg.SessionID != "cx" || reg.TenantID != "t1" || reg.ProjectID != "p1" || reg.Surface != "codex" {
		t.Fatalf("registration: %+v", reg)
	}
}

// failingAcks is a store whose next acks fail, as a store that cannot be
// reached does.
type failingAcks struct {
	sessionstore.Store
	fail atomic.Int32
}

func (s *failingAcks) AckSignals(ctx context.Context, k sessionstore.Key, upTo int64, at time.Time) (int, error) {
	if s.fail.Add(-1) >= 0 {
		return 0, sessionstore.ErrUnavailable
	}
	return s.Store.AckSignals(ctx, k, upTo, at)
}

// TestDeferAckRetriedAfterAFailureIsSent: an Ack whose sending failed
// returns the error and acknowledged nothing; Ack of the same signal again
// sends it (it did nothing, and returned nil, while the hub still held the
// signal).
func TestDeferAckRetriedAfterAFailureIsSent(t *testing.T) {
	store := &failingAcks{Store: memstore.New()}
	h := hubtest.Start(t, hubtest.Options{Store: store})
	ctx := context.Background()
	var in inbox
	cx, alice := piggybackPair(t, h, bootstrap.Config{DeferAck: true, AckInterval: time.Nanosecond, OnSignal: in.on})
	if _, err := alice.Send(ctx, "cx", "", map[string]string{"text": "hi"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cx.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the drained signal", func() bool { return in.len() == 1 })
	store.fail.Store(1)
	if err := cx.Ack(ctx, in.sigs[0]); err == nil {
		t.Fatal("Ack with the store failing: nil, want the error")
	}
	if err := cx.Ack(ctx, in.sigs[0]); err != nil {
		t.Fatalf("Ack again: %v", err)
	}
	cxKey := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "cx"}
	if left, err := h.Store.PendingSignals(ctx, cxKey, 0, 10); err != nil || len(left) != 0 {
		t.Fatalf("pending after the second Ack: %d %v, want none", len(left), err)
	}
}

// piggybackPair dials cx, a codex session (DialPiggyback) configured by cfg
// beyond the hub and its identity, and alice, a claude_code session to send
// to it; both close at the test's end.
func piggybackPair(t *testing.T, h *hubtest.Hub, cfg bootstrap.Config) (cx, alice *bootstrap.Client) {
	t.Helper()
	ctx := context.Background()
	cfg.HubURL, cfg.APIKey, cfg.SessionID, cfg.Surface = h.URL, h.APIKey, "cx", "codex"
	cx, err := bootstrap.DialPiggyback(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cx.Close() })
	alice, err = bootstrap.Dial(ctx, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "alice", Surface: "claude_code"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = alice.Close() })
	return cx, alice
}
