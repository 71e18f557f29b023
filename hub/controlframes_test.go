package hub_test

import (
	"context"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
)

// TestPingFloodIsRefused (issue 19.3): pings from the client spend the
// connection's frame budget as data frames do. With the clock stopped the
// budget is its burst, twice the rate: exactly that many pings are
// answered, and the next one closes the connection with 1008, counted as a
// frames_per_second refusal.
func TestPingFloodIsRefused(t *testing.T) {
	const rate = 5
	clock := hubtest.NewClock(time.Now())
	h := hubtest.Start(t, hubtest.Options{Now: clock.Now, Config: hub.Config{WSFramesPerSecond: rate}})
	a := register(t, h, "alice", "claude_code")
	c, _ := dial(t, h, a)
	closed := make(chan error, 1)
	go func() {
		for {
			if _, _, err := c.Read(context.Background()); err != nil {
				closed <- err
				return
			}
		}
	}()
	answered := 0
	for ; answered <= 10*rate; answered++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.Ping(ctx)
		cancel()
		if err != nil {
			break
		}
	}
	if answered != 2*rate {
		t.Errorf("%d pings answered, want the burst of %d", answered, 2*rate)
	}
	select {
	case err := <-closed:
		if closeStatus(err) != int(websocket.StatusPolicyViolation) {
			t.Fatalf("connection ended with %v, want close 1008", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the connection is still open 10 s after the ping flood")
	}
	if got := metric(t, h, "marconi_quota_refusals_total", "quota", "frames_per_second"); got != 1 {
		t.Fatalf("frames_per_second refusals = %v, want 1", got)
	}
}

// TestInvalidUTF8TextFrameCloses1007 (issue 19, "also seen"): a text frame
// that is not UTF-8 closes the connection with 1007, not an error frame.
func TestInvalidUTF8TextFrameCloses1007(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	a := register(t, h, "alice", "claude_code")
	c, _ := dial(t, h, a)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte("{\"type\":\"ack\",\"up_to_seq\":0,\"x\":\"\xff\xfe\"}")); err != nil {
		t.Fatal(err)
	}
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			if closeStatus(err) != int(websocket.StatusInvalidFramePayloadData) {
				t.Fatalf("connection ended with %v, want close 1007", err)
			}
			break
		}
		t.Fatalf("got frame %s, want close 1007", data)
	}
	if got := metric(t, h, "marconi_ws_disconnects_total", "reason", "invalid_utf8"); got != 1 {
		t.Fatalf("invalid_utf8 disconnects = %v, want 1", got)
	}
}
