package conns

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sync/errgroup"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// catchUpPage is how many stored signals a writer reads at a time.
const catchUpPage = 100

var (
	errConnEnded   = errors.New("connection ended")
	errPongTimeout = errors.New("pong timeout")
)

// queueItem is one entry of a connection's outgoing queue: a signal to write,
// or (sig nil) a wake-up to catch up from the store.
type queueItem struct {
	sig *sessionstore.Signal
}

// Conn is one attached WebSocket: its session's queue on this instance. It
// owns its loops; its methods are safe for concurrent use.
type Conn struct {
	h   *Hub
	ws  *websocket.Conn
	key sessionstore.Key
	// incarnation is the RegisteredAt of the session the connection
	// authenticated as. A session deregistered (or expired) and registered
	// again under the same key is another incarnation: its signals, seqs and
	// acks are none of this connection's business.
	incarnation time.Time
	attachedAt  time.Time
	out         chan queueItem // bounded: QueueSize
	ctrl        chan []byte    // frames the reader asks the writer to send (errors)

	kickMu sync.Mutex
	kicked chan struct{} // closed by the first kick, after kickBy is set
	kickBy Disconnect
}

// kick asks the connection's writer to close it with d. The first kick wins.
func (c *Conn) kick(d Disconnect) {
	c.kickMu.Lock()
	defer c.kickMu.Unlock()
	select {
	case <-c.kicked:
	default:
		c.kickBy = d
		close(c.kicked)
	}
}

// kickedBy returns the Disconnect of the first kick, if any.
func (c *Conn) kickedBy() (Disconnect, bool) {
	c.kickMu.Lock()
	defer c.kickMu.Unlock()
	select {
	case <-c.kicked:
		return c.kickBy, true
	default:
		return Disconnect{}, false
	}
}

// closing reports whether the connection was kicked: its writer is closing
// it and will write nothing more, so it is no longer a queue.
func (c *Conn) closing() bool {
	select {
	case <-c.kicked:
		return true
	default:
		return false
	}
}

// belongsTo reports whether c is a connection of the incarnation of the
// session that sess is the store row of.
func (c *Conn) belongsTo(sess sessionstore.Session) bool {
	return c.incarnation.Equal(sess.RegisteredAt)
}

// serve runs one attached connection until it ends.
func (h *Hub) serve(sess sessionstore.Session, ws *websocket.Conn, welcome Welcome) {
	now := h.now()
	c := &Conn{
		h: h, ws: ws, key: sess.Key, incarnation: sess.RegisteredAt, attachedAt: now,
		out:    make(chan queueItem, h.cfg.QueueSize),
		ctrl:   make(chan []byte, 8),
		kicked: make(chan struct{}),
	}
	if old := h.registry.attach(c); old != nil {
		// The old connection's own handler counts its disconnect, with the
		// first kick it got.
		if old.belongsTo(sess) {
			old.kick(DisconnectReplaced)
		} else {
			old.kick(DisconnectSessionGone)
		}
	}
	h.metrics.connections.Inc()
	h.recordAttach(c, now)
	if h.isClosing() {
		// Shutdown began between accept and registration: close with 1012 too.
		c.kick(DisconnectShutdown)
	}

	g, gctx := errgroup.WithContext(context.Background())
	g.Go(func() error { return c.writeLoop(gctx, welcome) })
	g.Go(func() error { return c.readLoop(gctx) })
	g.Go(func() error { return c.pingLoop(gctx) })
	err := g.Wait()
	ws.CloseNow()

	h.metrics.connections.Dec()
	label := disconnectLabel(err)
	if d, ok := c.kickedBy(); ok {
		label = d.Label
	}
	h.metrics.disconnects.WithLabelValues(label).Inc()
	h.log.Debug("websocket detached", KeyAttrs(sess.Key), "reason", label, "err", err)
	h.recordDetach(c)
}

// recordAttach writes the queue placement and the attach as proof of life.
func (h *Hub) recordAttach(c *Conn, now time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.StoreTimeout)
	defer cancel()
	if err := h.store.SetQueue(ctx, c.key, h.cfg.InstanceID, c.attachedAt); err != nil {
		h.log.Warn("record queue attach", KeyAttrs(c.key), "err", err)
	}
	if err := h.store.TouchSession(ctx, c.key, sessionstore.Touch{SeenAt: now, ExpiresAt: now.Add(h.cfg.SessionTTL)}, now); err != nil {
		h.log.Debug("touch on attach", KeyAttrs(c.key), "err", err)
	}
}

// recordDetach removes the connection from the registry and, when it was
// still the session's queue, records the detach in the store. A newer
// connection that attached meanwhile is written back, so the store never
// keeps a detach that raced a newer attach.
func (h *Hub) recordDetach(c *Conn) {
	if !h.registry.detach(c) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.StoreTimeout)
	defer cancel()
	if _, err := h.store.ClearQueue(ctx, c.key, h.cfg.InstanceID, h.now()); err != nil {
		h.log.Warn("record queue detach", KeyAttrs(c.key), "err", err)
	}
	if cur := h.registry.get(c.key); cur != nil {
		if err := h.store.SetQueue(ctx, cur.key, h.cfg.InstanceID, cur.attachedAt); err != nil {
			h.log.Warn("re-record queue attach", KeyAttrs(cur.key), "err", err)
		}
	}
}

// disconnectLabel is the metric label of a connection that ended with err
// without a kick.
func disconnectLabel(err error) string {
	if errors.Is(err, websocket.ErrMessageTooBig) {
		// The library closes with 1009 itself; its error is no CloseError.
		return labelMessageTooBig
	}
	switch websocket.CloseStatus(err) {
	case websocket.StatusNormalClosure, websocket.StatusGoingAway:
		return labelClientClosed
	case websocket.StatusMessageTooBig:
		return labelMessageTooBig
	case -1:
	default:
		return labelClientClosed
	}
	if errors.Is(err, errPongTimeout) {
		return labelPingTimeout
	}
	return labelConnectionLost
}

// writeLoop owns every write: the welcome, the replay, live signals, error
// frames, and the close frame of a kick.
func (c *Conn) writeLoop(ctx context.Context, welcome Welcome) error {
	if err := c.writeJSON(ctx, welcome); err != nil {
		return err
	}
	var last int64
	if err := c.catchUp(ctx, &last); err != nil {
		return err
	}
	for {
		select {
		case <-c.kicked:
			return c.closeKicked()
		default:
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.kicked:
			return c.closeKicked()
		case f := <-c.ctrl:
			if err := c.write(ctx, f); err != nil {
				return err
			}
		case it := <-c.out:
			switch {
			case it.sig != nil && it.sig.Seq <= last:
				// Already written by a catch-up.
			case it.sig != nil && it.sig.Seq == last+1:
				if err := c.writeSignal(ctx, *it.sig); err != nil {
					return err
				}
				last = it.sig.Seq
			default:
				// A gap (a concurrent send overtook this one) or a wake-up:
				// the store has every signal in order.
				if err := c.catchUp(ctx, &last); err != nil {
					return err
				}
			}
		}
	}
}

// catchUp writes every stored unacknowledged signal after *last, in seq
// order, once it has checked that they are the signals of c's session
// incarnation (stillCurrent). The store holds them all, so queue items are
// redundant while it runs: it drops them as it goes (a live send racing a
// long replay must not fill the queue and close a healthy consumer with
// 4429), and reads once more when it dropped any, so none is left for the
// next wake-up.
func (c *Conn) catchUp(ctx context.Context, last *int64) error {
	dropQueued := func() (dropped bool) {
		for {
			select {
			case <-c.out:
				dropped = true
			default:
				return dropped
			}
		}
	}
	for {
		// Items queued before the read are covered by it; only those dropped
		// while writing call for another read.
		dropQueued()
		dropped := false
		rctx, cancel := context.WithTimeout(ctx, c.h.cfg.StoreTimeout)
		sigs, err := c.h.store.PendingSignals(rctx, c.key, *last, catchUpPage)
		cancel()
		if err == nil && len(sigs) > 0 {
			// The store keys signals by session key only: those just read
			// may be a later incarnation's, when the session was
			// deregistered and registered again. Checked after the read, so
			// a match means they were this incarnation's when read.
			var current bool
			if current, err = c.stillCurrent(ctx); err == nil && !current {
				return c.closeKicked()
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// The store is unreachable: end the connection so the client
			// reattaches later; nothing is lost.
			return err
		}
		for _, sig := range sigs {
			select {
			case <-c.kicked:
				return c.closeKicked()
			default:
			}
			if err := c.writeSignal(ctx, sig); err != nil {
				return err
			}
			*last = sig.Seq
			dropped = dropQueued() || dropped
		}
		if len(sigs) < catchUpPage && !dropped {
			return nil
		}
	}
}

func (c *Conn) closeKicked() error {
	d, _ := c.kickedBy()
	if err := c.ws.Close(d.Code, d.Reason); err != nil {
		c.h.log.Debug("close after kick", KeyAttrs(c.key), "err", err)
	}
	return errConnEnded
}

func (c *Conn) writeSignal(ctx context.Context, sig sessionstore.Signal) error {
	return c.writeJSON(ctx, signalFrame{Type: "signal", Signal: WireSignal(sig)})
}

func (c *Conn) writeJSON(ctx context.Context, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.write(ctx, b)
}

func (c *Conn) write(ctx context.Context, b []byte) error {
	wctx, cancel := context.WithTimeout(ctx, c.h.cfg.WriteTimeout)
	defer cancel()
	return c.ws.Write(wctx, websocket.MessageText, b)
}

// readLoop is the connection's one reader: acks and proof of life.
func (c *Conn) readLoop(ctx context.Context) error {
	lastTouch := c.attachedAt
	for {
		_, data, err := c.ws.Read(ctx)
		if err != nil {
			return err
		}
		now := c.h.now()
		if now.Sub(lastTouch) >= c.h.cfg.TouchInterval {
			lastTouch = now
			c.touchSeen(ctx, now)
		}
		var f clientFrame
		if err := json.Unmarshal(data, &f); err != nil {
			c.sendError(marconi.CodeInvalidJSON, "frames must be JSON objects")
			continue
		}
		switch f.Type {
		case "ack":
			if f.UpToSeq == nil || *f.UpToSeq < 0 {
				c.sendError(marconi.CodeInvalidField, "ack needs a non-negative up_to_seq")
				continue
			}
			c.ackUpTo(ctx, *f.UpToSeq)
		case "ping":
			// Application-level keepalive: proof of life only.
		default:
			c.sendError(marconi.CodeInvalidField, "unknown frame type; want ack")
		}
	}
}

// ackUpTo acknowledges the session's signals up to seq, once it has checked
// that the session is still c's incarnation: acks are keyed by session key,
// and one from a connection of an earlier incarnation would ack the new
// session's signals.
func (c *Conn) ackUpTo(ctx context.Context, seq int64) {
	current, err := c.stillCurrent(ctx)
	if err != nil {
		c.h.log.Warn("ack from websocket: check the session", KeyAttrs(c.key), "err", err)
		return
	}
	if !current {
		return // kicked: the writer closes it with 4410
	}
	actx, cancel := context.WithTimeout(ctx, c.h.cfg.StoreTimeout)
	defer cancel()
	if _, err := c.h.ack(actx, c.key, seq); err != nil {
		c.h.log.Warn("ack from websocket", KeyAttrs(c.key), "err", err)
	}
}

// sendError hands an error frame to the writer without blocking.
func (c *Conn) sendError(code, message string) {
	b, err := json.Marshal(errorFrame{Type: "error", Code: code, Message: message})
	if err != nil {
		return
	}
	select {
	case c.ctrl <- b:
	default: // a client flooding bad frames loses the replies, not the hub's memory
	}
}

// pingLoop pings every PingInterval and ends the connection when a pong
// has not come within one more interval.
func (c *Conn) pingLoop(ctx context.Context) error {
	t := time.NewTicker(c.h.cfg.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, c.h.cfg.PingInterval)
		err := c.ws.Ping(pctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return errPongTimeout
		}
		c.touchSeen(ctx, c.h.now())
	}
}

// touchSeen records the connection's activity as proof of life. A session
// that is gone (deregistered on another instance, or expired) has no live
// row to touch: its connection is closed with 4410.
func (c *Conn) touchSeen(ctx context.Context, now time.Time) {
	tctx, cancel := context.WithTimeout(ctx, c.h.cfg.StoreTimeout)
	defer cancel()
	err := c.h.store.TouchSession(tctx, c.key, sessionstore.Touch{SeenAt: now, ExpiresAt: now.Add(c.h.cfg.SessionTTL)}, now)
	if errors.Is(err, sessionstore.ErrNotFound) {
		c.kick(DisconnectSessionGone)
		return
	}
	if err != nil {
		c.h.log.Debug("touch from websocket", KeyAttrs(c.key), "err", err)
	}
}

// stillCurrent reads the store row of c's session and reports whether c
// belongs to it. When it does not (the session is gone, or was registered
// again since: another incarnation) it kicks c with 4410. A store failure is
// returned and c is left alone.
func (c *Conn) stillCurrent(ctx context.Context) (bool, error) {
	rctx, cancel := context.WithTimeout(ctx, c.h.cfg.StoreTimeout)
	defer cancel()
	sess, err := c.h.store.GetSession(rctx, c.key, c.h.now())
	if errors.Is(err, sessionstore.ErrNotFound) {
		c.kick(DisconnectSessionGone)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the session of a connection: %w", err)
	}
	if !c.belongsTo(sess) {
		c.kick(DisconnectSessionGone)
		return false, nil
	}
	return true, nil
}
