package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/pgcluster"
)

// TestAsyncFailoverDeliversWhatFollows fails over to a standby that lags:
// replication asynchronous, the standby stopped while the primary commits
// five more signals to one recipient, answered 200 and delivered, then the
// primary crashed and the standby started and promoted. Those five are
// gone with the primary, as asynchronous replication allows (docs/
// operations.md, Running on replicated Postgres), and the recipient's next
// signals take their seqs again. Every send answered 200 after the
// promotion must still reach the recipient: the hub's WebSocket had written
// the lost seqs and the client had delivered them, so both would take the
// new signals for ones already written and delivered, and the client's ack
// of a later one would acknowledge them unseen.
func TestAsyncFailoverDeliversWhatFollows(t *testing.T) {
	c := pgcluster.New(t)
	h := startFailoverHubs(t, c.URL(), "hub-a")[0]
	led := newFailoverLedger()
	sender := dialAgent(t, h, "sender", "stateless", led)
	dialAgent(t, h, "rcpt", "stateless", led)

	n := 0
	send := func() int64 { t.Helper(); return sendUntilOK(t, sender, "rcpt", led, &n) }
	for range 5 {
		send()
	}
	led.waitDelivered(t, 30*time.Second)
	standby := c.StopStandby()
	var lost []int64
	for range 5 {
		lost = append(lost, send())
	}
	led.waitDelivered(t, 30*time.Second)

	c.CrashPrimary()
	c.StartStandby(standby)
	c.Promote()
	var after []int64
	for range 10 {
		after = append(after, send())
	}
	t.Logf("seqs answered before the crash and lost with the primary: %v; answered after the promotion: %v", lost, after)
	if after[0] > lost[0] {
		t.Fatalf("the first send after the promotion took seq %d, after the lost %v: the standby was not behind, the test proves nothing", after[0], lost)
	}
	led.waitDelivered(t, 30*time.Second)
	pollUntil(t, "the hub to count the store's new history", func() bool {
		return metricValue(t, h.URL(), "marconi_store_history_changes_total") == 1
	})
	if v := metricValue(t, h.URL(), "marconi_ws_rewinds_total"); v < 1 {
		t.Errorf("marconi_ws_rewinds_total = %v, want at least 1 (the recipient's WebSocket)", v)
	}
	led.mu.Lock()
	defer led.mu.Unlock()
	for id, k := range led.got["rcpt"] {
		if k > 1 {
			t.Errorf("rcpt got signal %s %d times; the client delivers each id once", id, k)
		}
	}
}

// sendUntilOK sends the next signal (*n counts them) from sender to to
// until one is answered 200 (a refusal stores nothing), recording each in
// led, and returns its seq.
func sendUntilOK(t *testing.T, sender *failoverAgent, to string, led *failoverLedger, n *int) int64 {
	t.Helper()
	var seq int64
	pollUntil(t, "a send to be answered 200", func() bool {
		*n++
		p := failoverPayload{ID: fmt.Sprintf("%s/%d", sender.id, *n), From: sender.id, N: *n}
		led.attempt(p, to)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := sender.c.Send(ctx, to, "failover", p)
		led.answer(sender.id, p, res, err)
		seq = res.Seq
		return err == nil
	})
	return seq
}
