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

// frameQuotaSignals is how many signals the frame quota tests send bob.
const frameQuotaSignals = 200

// underFrameQuota starts a hub that lets a connection send 20 frames a
// second (a burst of 40), dials bob with bobCfg's DeferAck and OnSignal,
// has alice send him frameQuotaSignals signals, and returns the hub and bob.
// Once the test has done with bob, checkFrameQuota checks the outcome.
func underFrameQuota(t *testing.T, bobCfg bootstrap.Config) (*hubtest.Hub, *bootstrap.Client) {
	t.Helper()
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{WSFramesPerSecond: 20, SendRatePerSecond: 100000}})
	ctx := context.Background()
	bob, err := bootstrap.Dial(ctx, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "bob",
		Surface: "claude_code", DeferAck: bobCfg.DeferAck, OnSignal: bobCfg.OnSignal})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bob.Close() })
	alice, err := bootstrap.Dial(ctx, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "alice", Surface: "claude_code"})
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	for i := range frameQuotaSignals {
		if _, err := alice.Send(ctx, "bob", "", map[string]int{"i": i}); err != nil {
			t.Fatal(err)
		}
	}
	return h, bob
}

// checkFrameQuota waits until the hub has recorded the ack of every signal
// of bob's, and checks that bob was never cut off for its frames nor had
// to reconnect.
func checkFrameQuota(t *testing.T, h *hubtest.Hub, bob *bootstrap.Client) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, "the hub to record the last ack", func() bool {
		left, err := h.Store.CountPending(ctx, sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"})
		return err == nil && left == 0
	})
	if got, _ := metrictest.Lookup(t, h.Registry, "marconi_ws_disconnects_total", "reason", "quota_exceeded"); got != 0 {
		t.Errorf("bob cut off %v times for its frames", got)
	}
	if r := bob.Stats().Reconnects; r != 0 {
		t.Errorf("bob reconnected %d times, want 0", r)
	}
}

// TestAcksStayWithinTheFrameQuota: a recipient handed its signals one at a
// time, faster than the hub lets a connection send frames
// (MARCONI_WS_FRAMES_PER_SECOND, here 20 and a burst of 40), is not cut off
// for acknowledging each: its acks are paced, every signal still delivered
// once and acknowledged.
func TestAcksStayWithinTheFrameQuota(t *testing.T) {
	var in inbox
	h, bob := underFrameQuota(t, bootstrap.Config{OnSignal: in.on})
	waitFor(t, "every signal", func() bool { return in.len() >= frameQuotaSignals })
	checkFrameQuota(t, h, bob)
	if in.len() != frameQuotaSignals {
		t.Errorf("bob got %d signals, want %d", in.len(), frameQuotaSignals)
	}
}

// TestDeferredAcksStayWithinTheFrameQuota: the same with DeferAck, an
// application acknowledging each signal through Client.Ack as it finishes
// it: Client.Ack is paced too, so the recipient is not cut off, and the
// last ack, held back, still reaches the hub.
func TestDeferredAcksStayWithinTheFrameQuota(t *testing.T) {
	handed := make(chan bootstrap.Signal, frameQuotaSignals)
	h, bob := underFrameQuota(t, bootstrap.Config{DeferAck: true, OnSignal: func(s bootstrap.Signal) { handed <- s }})
	for range frameQuotaSignals {
		if err := bob.Ack(context.Background(), <-handed); err != nil {
			t.Fatal(err)
		}
	}
	checkFrameQuota(t, h, bob)
	if len(handed) != 0 {
		t.Errorf("bob was handed %d signals again, want none", len(handed))
	}
}
