package conns

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// Keepalive needs no goroutine per connection: each connection has a timer
// (the runtime keeps all of them in one heap), whose function pings and
// waits for the pong, then arms the next one.

// armPing schedules the next ping PingInterval from now, unless the
// connection has ended.
func (c *Conn) armPing() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return
	}
	c.wg.Add(1)
	c.pingTimer = time.AfterFunc(c.h.cfg.PingInterval, c.ping)
}

// ping pings and ends the connection when the pong has not come within one
// more PingInterval; a pong is proof of life.
func (c *Conn) ping() {
	defer c.wg.Done()
	ctx, cancel := context.WithTimeout(c.ctx, c.h.cfg.PingInterval)
	err := c.ws.Ping(ctx)
	cancel()
	if err != nil {
		if c.ctx.Err() == nil {
			c.fail(errPongTimeout)
		}
		return
	}
	c.touchSeen(c.ctx, c.h.now())
	c.armPing()
}

// touchSeen records the connection's activity as proof of life, for the
// registration and token the connection was opened with only: a session
// registered again or resumed since (on another instance, which this one
// may not have heard of yet) is not its to extend. When they no longer
// hold the session, the connection is closed as stillCurrent says: 4410
// when the session is gone or registered again, 4409 when another token
// holds it.
func (c *Conn) touchSeen(ctx context.Context, now time.Time) {
	tctx, cancel := context.WithTimeout(ctx, c.h.cfg.StoreTimeout)
	defer cancel()
	t := sessionstore.Touch{SeenAt: now, ExpiresAt: now.Add(c.h.cfg.SessionTTL)}
	h := sessionstore.Holder{RegisteredAt: c.incarnation, TokenHash: c.tokenHash}
	err := c.h.store.TouchSessionAs(tctx, c.key, h, t, now)
	if errors.Is(err, sessionstore.ErrNotFound) {
		d, err := c.stillCurrent(ctx)
		switch {
		case err != nil:
			c.h.log.Debug("touch from websocket: read the session", KeyAttrs(c.key), "err", err)
		case d != nil:
			c.kick(*d)
		}
		return
	}
	if err != nil {
		c.h.log.Debug("touch from websocket", KeyAttrs(c.key), "err", err)
		return
	}
	c.knowExpiry(t.ExpiresAt)
}

// stillCurrent reads the store row of c's session and reports whether c
// belongs to it and still holds its token: nil when it does, else the
// disconnect the caller closes c with: DisconnectSessionGone when the
// session is gone or was registered again since (another incarnation),
// DisconnectTokenReplaced when it holds another token (a resume or a
// takeover). It changes nothing; a store failure is returned.
func (c *Conn) stillCurrent(ctx context.Context) (*Disconnect, error) {
	rctx, cancel := context.WithTimeout(ctx, c.h.cfg.StoreTimeout)
	defer cancel()
	sess, err := c.h.store.GetSession(rctx, c.key, c.h.now())
	if errors.Is(err, sessionstore.ErrNotFound) {
		return &DisconnectSessionGone, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the session of a connection: %w", err)
	}
	switch {
	case !c.belongsTo(sess):
		return &DisconnectSessionGone, nil
	case !c.holdsToken(sess):
		return &DisconnectTokenReplaced, nil
	}
	return nil, nil
}
