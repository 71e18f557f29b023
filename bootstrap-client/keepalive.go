package bootstrap

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// readerHold tells the keepalive of one connection when its reader is held
// up handing a signal to a busy dispatcher: the hub's pong then waits unread
// in the socket, and a ping timing out says nothing about the path.
type readerHold struct {
	held  atomic.Bool  // the reader is waiting for the dispatcher now
	holds atomic.Int64 // how many times it has waited so far
}

// enter and leave bracket one wait of the reader.
func (h *readerHold) enter() { h.holds.Add(1); h.held.Store(true) }
func (h *readerHold) leave() { h.held.Store(false) }

// keepalive pings the hub on conn every Config.PingInterval until ctx ends
// (the connection ended) and closes dead when a pong has not come within
// Config.PingTimeout while the reader was free to read it. The supervisor
// owns the connection and does the closing; this only reports.
func (c *Client) keepalive(ctx context.Context, conn *websocket.Conn, hold *readerHold, dead chan<- struct{}) {
	defer c.wg.Done()
	t := time.NewTimer(c.cfg.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		holds := hold.holds.Load()
		pctx, cancel := context.WithTimeout(ctx, c.cfg.PingTimeout)
		err := conn.Ping(pctx)
		cancel()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			if !hold.held.Load() && hold.holds.Load() == holds {
				close(dead)
				return
			}
			c.log.Debug("marconi: ping unanswered while OnSignal held the reader up; not judged")
		}
		t.Reset(c.cfg.PingInterval)
	}
}

// startKeepalive runs the keepalive of conn, unless Config.PingInterval
// disables it, and returns the function that stops it and waits for it.
func (c *Client) startKeepalive(conn *websocket.Conn, hold *readerHold, dead chan<- struct{}) (stop func()) {
	if c.cfg.PingInterval < 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(c.ctx)
	done := make(chan struct{})
	c.wg.Add(1)
	go func() {
		defer close(done)
		c.keepalive(ctx, conn, hold, dead)
	}()
	return func() {
		cancel()
		<-done
	}
}
