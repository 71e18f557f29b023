package conns

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi/sessionstore"
)

var (
	errConnEnded   = errors.New("connection ended")
	errPongTimeout = errors.New("pong timeout")
)

// queueItem is one entry of a connection's outgoing queue: a signal to
// write, or else a wake-up to catch up from the store.
type queueItem struct {
	sig *sessionstore.Signal
}

// Conn is one attached WebSocket: its session's queue on this instance. It
// owns its loops. An idle Conn costs one goroutine, its handler's, which
// reads; a writer runs only while there is something to write (writer.go),
// a ping only while one is in flight (keepalive.go), and coalesced acks are
// written by a timer (ack.go). Its methods are safe for concurrent use.
type Conn struct {
	h   *Hub
	ws  *websocket.Conn
	key sessionstore.Key
	// incarnation is the RegisteredAt of the session the connection
	// authenticated as. A session deregistered (or expired) and registered
	// again under the same key is another incarnation: its signals, seqs and
	// acks are none of this connection's business.
	incarnation time.Time
	// tokenHash is the hash of the token the connection was opened with:
	// once the session holds another (a resume or a takeover), the
	// connection is closed with 4409.
	tokenHash  []byte
	attachedAt time.Time
	welcome    Welcome
	acks       *acks
	budget     frameBudget // what the client may still send
	wb         writeBound  // bounds the writer's frame writes (writer.go)

	// ctx ends when the connection does: the reader, a writer or a ping
	// that fails cancels it, and the others stop.
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	queue     []queueItem // outgoing, at most QueueSize; nil when empty, so an idle connection holds none
	ctrl      [][]byte    // frames the reader asks the writer to send (errors), at most maxCtrl; nil when empty
	ended     bool        // the handler is done: start nothing more
	started   bool        // start has recorded the attach: the welcome is complete, a writer may run
	writing   bool        // a writer goroutine runs
	welcomed  bool        // the welcome and the first catch-up are written
	last      int64       // the seq of the last signal written; the writer's alone
	pingTimer *time.Timer
	err       error          // the first error that ended the connection
	wg        sync.WaitGroup // the writer and the ping, while they run

	// written is last, for the pending sweep to read: it wakes only the
	// connections whose session has a signal past it.
	written atomic.Int64
	// checkDue is set by a check wake-up (Hub.check): the writer reads the
	// session's row before it writes more. Atomic, so the writer's loop
	// takes it without the lock it already takes per frame for the queue.
	checkDue atomic.Bool
	// recheck is set when the read of a check wake-up failed: the expiry
	// check reads the session's row in its stead (expiry.go).
	recheck atomic.Bool
	// expires is the latest expiry of the session this instance knows
	// (UnixNano), for the expiry check (expiry.go).
	expires atomic.Int64
	// history is the store's history the connection was last caught up
	// under; rewind, when not 0, a later one to catch up under (FollowHistory);
	// rewound, that it did so once (history.go).
	history atomic.Uint64
	rewind  atomic.Uint64
	rewound atomic.Bool

	kickMu sync.Mutex
	kicked chan struct{} // closed by the first kick, after kickBy is set
	kickBy Disconnect
}

// kick asks the connection's writer to close it with d. The first kick wins
// and is counted in marconi_ws_disconnects_total at once, when the hub
// decides it, not when the close handshake ends.
func (c *Conn) kick(d Disconnect) {
	c.kickMu.Lock()
	select {
	case <-c.kicked:
		c.kickMu.Unlock()
		return
	default:
	}
	c.kickBy = d
	c.h.metrics.disconnects.WithLabelValues(d.Label).Inc() // before anything closes
	close(c.kicked)
	c.kickMu.Unlock()
	c.wake()
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

// holdsToken reports whether sess (a store row of c's incarnation) still
// holds the token c was opened with. A row without a token hash proves
// nothing against c.
func (c *Conn) holdsToken(sess sessionstore.Session) bool {
	return len(sess.TokenHash) == 0 || bytes.Equal(c.tokenHash, sess.TokenHash)
}

// fail ends the connection with err, unless it has ended already.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.cancel()
}

// start registers a new connection for sess, records the attach and
// starts its writer (the welcome and the replay) and its keepalive. It runs
// on the caller's goroutine, not the connection's reader: what it calls
// (logging, the store) would grow the reader's stack for good (see serve).
func (h *Hub) start(sess sessionstore.Session, ws *websocket.Conn, welcome Welcome) *Conn {
	now := h.now()
	c := &Conn{
		h: h, ws: ws, key: sess.Key, incarnation: sess.RegisteredAt, tokenHash: bytes.Clone(sess.TokenHash),
		attachedAt: now, welcome: welcome,
		kicked: make(chan struct{}),
		budget: frameBudget{frames: bucket{tokens: 2 * h.cfg.FramesPerSecond, at: now}},
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.acks = newAcks(c)
	c.expires.Store(sess.ExpiresAt.UnixNano())
	n, token := h.historyToken() // before the welcome's catch-up reads
	c.history.Store(n)
	c.welcome.History = token
	old := h.registry.attach(c)
	h.dueBy(c.expires.Load())
	if old != nil {
		// The old connection's own handler counts its disconnect, with the
		// first kick it got.
		if old.belongsTo(sess) {
			old.kick(DisconnectReplaced)
		} else {
			old.kick(DisconnectSessionGone)
		}
	}
	h.metrics.connections.Inc()
	if err := h.recordAttach(c, now); err != nil {
		// The store failed: end the connection, as a failed catch-up
		// would; the client reconnects later and nothing is lost.
		h.log.Warn("record queue attach", KeyAttrs(c.key), "err", err)
		c.fail(err)
		return c
	}
	h.log.Info("websocket attached", KeyAttrs(sess.Key), "resumed", c.welcome.Resumed, "affinity_reset", c.welcome.AffinityReset, "replayed", c.welcome.Replayed)
	if h.isClosing() {
		// Shutdown began between accept and registration: close with 1012 too.
		c.kick(DisconnectShutdown)
	}

	// From here a wake starts the writer, so no writer writes the welcome
	// before recordAttach has counted its replayed. Wakes before this one
	// start nothing, and need not: this writer writes the welcome, catches
	// up from the store (which holds whatever they were about) and
	// closes a connection kicked meanwhile.
	c.mu.Lock()
	c.started = true
	c.mu.Unlock()
	c.wake() // the welcome and the replay
	c.armPing()
	return c
}

// serve is the goroutine of an attached connection: it reads until the
// connection ends, then ends it. An idle connection's goroutine sits in
// its read for as long as it is attached, so serve and readLoop keep small
// frames and call nothing deep before the read: the goroutine's stack
// then stays within 4 KiB instead of 8 (a stack grows by doubling and,
// once grown, the runtime never shrinks it back while a quarter of it is
// in use).
func (h *Hub) serve(c *Conn) {
	c.fail(c.readLoop(c.ctx))
	h.end(c)
}

// end ends c once its reader has returned: it waits for its writer and
// ping, writes its last ack and records the detach.
func (h *Hub) end(c *Conn) {
	c.mu.Lock()
	c.ended = true
	if c.pingTimer != nil && c.pingTimer.Stop() {
		c.wg.Done() // its ping will not run
	}
	err := c.err
	c.mu.Unlock()
	c.wg.Wait()
	c.ws.CloseNow()
	c.acks.flush()

	h.metrics.connections.Dec()
	// Ended without a kick: the peer or the network decided. Recorded as a
	// kick so that it is counted once, and a late kick counts nothing.
	c.kick(Disconnect{Code: websocket.CloseStatus(err), Label: disconnectLabel(err)})
	d, _ := c.kickedBy()
	h.log.Info("websocket detached", KeyAttrs(c.key), "reason", d.Label, "code", int(d.Code), "attached_for", h.now().Sub(c.attachedAt).Round(time.Millisecond).String())
	h.log.Debug("websocket detached: cause", KeyAttrs(c.key), "err", err)
	h.recordDetach(c)
}

// recordAttach writes the queue placement and the attach as proof of life,
// in one store write (one statement of a group commit on Postgres), which
// also counts the signals the welcome announces as replayed. A session
// gone meanwhile (expired or deregistered since it was authenticated) is
// not an error here: its connection is closed with 4410 after the welcome.
func (h *Hub) recordAttach(c *Conn, now time.Time) error {
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.StoreTimeout)
	defer cancel()
	t := sessionstore.Touch{SeenAt: now, ExpiresAt: now.Add(h.cfg.SessionTTL)}
	n, err := h.store.AttachQueue(ctx, c.key, h.cfg.InstanceID, c.attachedAt, t, now)
	if errors.Is(err, sessionstore.ErrNotFound) {
		h.log.Debug("record queue attach: the session is gone", KeyAttrs(c.key))
		c.kick(DisconnectSessionGone)
		return nil
	}
	if err == nil {
		c.knowExpiry(t.ExpiresAt)
	}
	c.welcome.Replayed = n
	return err
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
	if _, err := h.store.ClearQueue(ctx, c.key, h.cfg.InstanceID, c.attachedAt, h.now()); err != nil {
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
