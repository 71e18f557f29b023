package bootstrap

import (
	"context"
	"fmt"
	"net/http"
)

// DialPiggyback registers the session (or resumes the one named by
// cfg.SessionID) without attaching a WebSocket, for a surface the hub serves
// by drain and piggyback only (codex). The client heartbeats, hands the
// signals of heartbeat and send answers (pending) to OnSignal, and Drain
// fetches the rest on demand. Config.TokenStore and Config.Takeover work as
// with Dial, and so do Send, Ack, Stats and Close.
func DialPiggyback(ctx context.Context, cfg Config) (*Client, error) {
	c, err := start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	err = c.register(ctx)
	for i := 1; i < len(c.urls) && unavailable(err) && ctx.Err() == nil; i++ {
		err = c.register(ctx) // the failed URL was left: try the next
	}
	if err != nil {
		c.cancel()
		c.wg.Wait()
		c.closeIdle()
		return nil, err
	}
	c.wg.Add(1)
	go c.heartbeatLoop()
	return c, nil
}

// Drain fetches the signals the hub holds for the session beyond the highest
// one handed to OnSignal (GET /v1/signals, one page, naming the store
// history that seq came under: after a failover of the hub's store the page
// starts again from the acknowledged seq, history.go) and queues them for
// OnSignal, waiting for room. It returns the highest seq fetched, 0 when
// there was none: OnSignal has seen it once the dispatcher reached it.
func (c *Client) Drain(ctx context.Context) (int64, error) {
	if c.ctx.Err() != nil {
		return 0, errClosed
	}
	var res drainResponse
	a, err := c.sessionCall(ctx, http.MethodGet, c.drainPath(), nil, &res)
	if err != nil {
		return 0, fmt.Errorf("bootstrap: drain: %w", err)
	}
	if len(res.Signals) == 0 && !res.HistoryChanged {
		return 0, nil
	}
	if !c.enqueue(ctx, drained(res, a.epoch)) {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("bootstrap: drain: %w", ctx.Err())
		}
		return 0, errClosed
	}
	if len(res.Signals) == 0 {
		return 0, nil
	}
	return res.Signals[len(res.Signals)-1].Seq, nil
}
