package bootstrap_test

import (
	"context"
	"testing"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/metrictest"
	"github.com/marconihub/marconi/sessionstore"
)

// TestAcksStayWithinTheFrameQuota: a recipient handed its signals one at a
// time, faster than the hub lets a connection send frames
// (MARCONI_WS_FRAMES_PER_SECOND, here 20 and a burst of 40), is not cut off
// for acknowledging each: its acks are paced, every signal still delivered
// once and acknowledged.
func TestAcksStayWithinTheFrameQuota(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{WSFramesPerSecond: 20, SendRatePerSecond: 100000}})
	ctx := context.Background()
	var in inbox
	bob, err := bootstrap.Dial(ctx, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "bob",
		Surface: "claude_code", OnSignal: in.on})
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	alice, err := bootstrap.Dial(ctx, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "alice", Surface: "claude_code"})
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()

	const n = 200
	for i := range n {
		if _, err := alice.Send(ctx, "bob", "", map[string]int{"i": i}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "every signal", func() bool { return in.len() >= n })
	waitFor(t, "the hub to record the last ack", func() bool {
		left, err := h.Store.CountPending(ctx, sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"})
		return err == nil && left == 0
	})
	if got, _ := metrictest.Lookup(t, h.Registry, "marconi_ws_disconnects_total", "reason", "quota_exceeded"); got != 0 {
		t.Errorf("bob cut off %v times for its frames", got)
	}
	if r := bob.Stats().Reconnects; r != 0 || in.len() != n {
		t.Errorf("bob reconnected %d times and got %d signals, want 0 and %d", r, in.len(), n)
	}
}

// TestDeferredAcksStayWithinTheFrameQuota: the same with DeferAck, an
// application acknowledging each signal through Client.Ack as it finishes
// it: Client.Ack is paced too, so the recipient is not cut off, and the
// last ack, held back, still reaches the hub.
func TestDeferredAcksStayWithinTheFrameQuota(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{WSFramesPerSecond: 20, SendRatePerSecond: 100000}})
	ctx := context.Background()
	const n = 200
	handed := make(chan bootstrap.Signal, n)
	bob, err := bootstrap.Dial(ctx, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "bob",
		Surface: "claude_code", DeferAck: true, OnSignal: func(s bootstrap.Signal) { handed <- s }})
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	alice, err := bootstrap.Dial(ctx, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "alice", Surface: "claude_code"})
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()

	for i := range n {
		if _, err := alice.Send(ctx, "bob", "", map[string]int{"i": i}); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		if err := bob.Ack(ctx, <-handed); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the hub to record the last ack", func() bool {
		left, err := h.Store.CountPending(ctx, sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"})
		return err == nil && left == 0
	})
	if got, _ := metrictest.Lookup(t, h.Registry, "marconi_ws_disconnects_total", "reason", "quota_exceeded"); got != 0 {
		t.Errorf("bob cut off %v times for its frames", got)
	}
	if r := bob.Stats().Reconnects; r != 0 || len(handed) != 0 {
		t.Errorf("bob reconnected %d times and was handed %d signals again, want 0 and 0", r, len(handed))
	}
}
