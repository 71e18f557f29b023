package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/coder/websocket"
	"github.com/labstack/echo/v4"
	"golang.org/x/sync/errgroup"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// WebSocket close codes of the contract.
const (
	statusUnauthorized   websocket.StatusCode = 4401
	statusReplaced       websocket.StatusCode = 4409
	statusSessionExpired websocket.StatusCode = 4410
	statusSlowConsumer   websocket.StatusCode = 4429
	statusRestarting     websocket.StatusCode = 1012
)

// catchUpPage is how many stored signals a writer reads at a time.
const catchUpPage = 100

var errConnEnded = errors.New("connection ended")

type welcomeFrame struct {
	Type          string `json:"type"`
	SessionID     string `json:"session_id"`
	InstanceID    string `json:"instance_id"`
	Resumed       bool   `json:"resumed"`
	AffinityReset bool   `json:"affinity_reset"`
	Replayed      int    `json:"replayed"`
	Dropped       *int   `json:"dropped,omitempty"`
}

type signalFrame struct {
	Type string `json:"type"`
	signalJSON
}

type clientFrame struct {
	Type    string `json:"type"`
	UpToSeq *int64 `json:"up_to_seq"`
}

type errorFrame struct {
	Type    string `json:"type"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// attach is GET /v1/ws: it upgrades, makes this connection the session's
// queue, replays every unacknowledged signal in seq order and then writes
// live ones. One reader (this goroutine's errgroup member), one writer that
// owns every write, and one pinger run under one errgroup.
func (s *Server) attach(c echo.Context) error {
	if s.Draining() {
		return marconi.Errorf(marconi.CodeDraining, "this instance is draining; attach elsewhere")
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	sess, err := s.authenticateSessionCtx(ctx, bearer(c))
	if err != nil {
		cancel()
		return err
	}
	welcome, err := s.place(ctx, sess)
	if err != nil {
		cancel()
		return err
	}
	pending, err := s.store.CountPending(ctx, sess.Key)
	cancel()
	if err != nil {
		return err
	}
	welcome.Replayed = pending

	ws, err := websocket.Accept(c.Response(), c.Request(), &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		s.log.Debug("websocket accept failed", keyAttrs(sess.Key), "err", err)
		return nil // Accept has written the HTTP error
	}
	ws.SetReadLimit(s.cfg.WSReadLimit)

	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		ws.Close(statusRestarting, "hub restarting")
		return nil
	}
	s.wsWG.Add(1)
	s.mu.Unlock()
	defer s.wsWG.Done()

	s.serveConn(sess, ws, welcome)
	return nil
}

// serveConn runs one attached connection until it ends.
func (s *Server) serveConn(sess sessionstore.Session, ws *websocket.Conn, welcome welcomeFrame) {
	now := s.now()
	conn := newWSConn(sess.Key, sess.RegisteredAt, now, s.cfg.WSQueueSize)
	defer close(conn.done)
	if old := s.registry.attach(conn); old != nil {
		// The old connection's own handler counts its disconnect, with the
		// reason of the first kick it got.
		if old.belongsTo(sess) {
			old.kick(statusReplaced, "replaced by a newer connection of this session", "replaced")
		} else {
			old.kick(statusSessionExpired, reasonSessionGone, "deregistered")
		}
	}
	s.metrics.connections.Inc()
	s.recordAttach(conn, now)
	if s.isClosing() {
		// Shutdown began between accept and registration: close with 1012 too.
		conn.kick(statusRestarting, "hub restarting", "shutdown")
	}

	g, gctx := errgroup.WithContext(context.Background())
	g.Go(func() error { return s.writeLoop(gctx, ws, conn, welcome) })
	g.Go(func() error { return s.readLoop(gctx, ws, conn) })
	g.Go(func() error { return s.pingLoop(gctx, ws, conn) })
	err := g.Wait()
	ws.CloseNow()

	s.metrics.connections.Dec()
	reason := disconnectReason(err)
	select {
	case <-conn.kicked: // kick's fields are written before kicked closes
		reason = conn.kickMetric
	default:
	}
	s.metrics.disconnects.WithLabelValues(reason).Inc()
	s.log.Debug("websocket detached", keyAttrs(sess.Key), "reason", reason, "err", err)
	s.recordDetach(conn)
}

// recordAttach writes the queue placement and the attach as proof of life.
func (s *Server) recordAttach(conn *wsConn, now time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.StoreTimeout)
	defer cancel()
	if err := s.store.SetQueue(ctx, conn.key, s.cfg.InstanceID, conn.attachedAt); err != nil {
		s.log.Warn("record queue attach", keyAttrs(conn.key), "err", err)
	}
	if err := s.store.TouchSession(ctx, conn.key, sessionstore.Touch{SeenAt: now, ExpiresAt: now.Add(s.cfg.SessionTTL)}, now); err != nil {
		s.log.Debug("touch on attach", keyAttrs(conn.key), "err", err)
	}
}

// recordDetach removes the connection from the registry and, when it was
// still the session's queue, records the detach in the store. A newer
// connection that attached meanwhile is written back, so the store never
// keeps a detach that raced a newer attach.
func (s *Server) recordDetach(conn *wsConn) {
	if !s.registry.detach(conn) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.StoreTimeout)
	defer cancel()
	if _, err := s.store.ClearQueue(ctx, conn.key, s.cfg.InstanceID, conn.attachedAt, s.now()); err != nil {
		s.log.Warn("record queue detach", keyAttrs(conn.key), "err", err)
	}
	if cur := s.registry.get(conn.key); cur != nil {
		if err := s.store.SetQueue(ctx, cur.key, s.cfg.InstanceID, cur.attachedAt); err != nil {
			s.log.Warn("re-record queue attach", keyAttrs(cur.key), "err", err)
		}
	}
}

func disconnectReason(err error) string {
	if errors.Is(err, websocket.ErrMessageTooBig) {
		// The library closes with 1009 itself; its error is no CloseError.
		return "message_too_big"
	}
	switch websocket.CloseStatus(err) {
	case websocket.StatusNormalClosure, websocket.StatusGoingAway:
		return "client_closed"
	case websocket.StatusMessageTooBig:
		return "message_too_big"
	case -1:
	default:
		return "client_closed"
	}
	if errors.Is(err, errPongTimeout) {
		return "ping_timeout"
	}
	return "connection_lost"
}

// writeLoop owns every write: the welcome, the replay, live signals, error
// frames, and the close frame of a kick.
func (s *Server) writeLoop(ctx context.Context, ws *websocket.Conn, conn *wsConn, welcome welcomeFrame) error {
	if err := s.writeJSON(ctx, ws, welcome); err != nil {
		return err
	}
	var last int64
	if err := s.catchUp(ctx, ws, conn, &last); err != nil {
		return err
	}
	for {
		select {
		case <-conn.kicked:
			return s.closeKicked(ws, conn)
		default:
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-conn.kicked:
			return s.closeKicked(ws, conn)
		case f := <-conn.ctrl:
			if err := s.write(ctx, ws, f); err != nil {
				return err
			}
		case it := <-conn.out:
			switch {
			case it.sig != nil && it.sig.Seq <= last:
				// Already written by a catch-up.
			case it.sig != nil && it.sig.Seq == last+1:
				if err := s.writeSignal(ctx, ws, *it.sig); err != nil {
					return err
				}
				last = it.sig.Seq
			default:
				// A gap (a concurrent send overtook this one) or a wake-up:
				// the store has every signal in order.
				if err := s.catchUp(ctx, ws, conn, &last); err != nil {
					return err
				}
			}
		}
	}
}

// catchUp writes every stored unacknowledged signal after *last, in seq
// order, once it has checked that they are the signals of conn's session
// incarnation (stillCurrent). The store holds them all, so queue items are redundant while it
// runs: it drops them as it goes (a live send racing a long replay must not
// fill the queue and close a healthy consumer with 4429), and reads once
// more when it dropped any, so none is left for the next wake-up.
func (s *Server) catchUp(ctx context.Context, ws *websocket.Conn, conn *wsConn, last *int64) error {
	dropQueued := func() (dropped bool) {
		for {
			select {
			case <-conn.out:
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
		rctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
		sigs, err := s.store.PendingSignals(rctx, conn.key, *last, catchUpPage)
		cancel()
		if err == nil && len(sigs) > 0 {
			// The store keys signals by session key only: those just read
			// may be a later incarnation's, when the session was
			// deregistered and registered again. Checked after the read, so
			// a match means they were this incarnation's when read.
			var current bool
			if current, err = s.stillCurrent(ctx, conn); err == nil && !current {
				return s.closeKicked(ws, conn)
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
			case <-conn.kicked:
				return s.closeKicked(ws, conn)
			default:
			}
			if err := s.writeSignal(ctx, ws, sig); err != nil {
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

func (s *Server) closeKicked(ws *websocket.Conn, conn *wsConn) error {
	err := ws.Close(conn.kickCode, conn.kickReason)
	if err != nil {
		s.log.Debug("close after kick", keyAttrs(conn.key), "err", err)
	}
	return errConnEnded
}

func (s *Server) writeSignal(ctx context.Context, ws *websocket.Conn, sig sessionstore.Signal) error {
	return s.writeJSON(ctx, ws, signalFrame{Type: "signal", signalJSON: toSignalJSON(sig)})
}

func (s *Server) writeJSON(ctx context.Context, ws *websocket.Conn, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.write(ctx, ws, b)
}

func (s *Server) write(ctx context.Context, ws *websocket.Conn, b []byte) error {
	wctx, cancel := context.WithTimeout(ctx, s.cfg.WSWriteTimeout)
	defer cancel()
	return ws.Write(wctx, websocket.MessageText, b)
}

// readLoop is the connection's one reader: acks and proof of life.
func (s *Server) readLoop(ctx context.Context, ws *websocket.Conn, conn *wsConn) error {
	lastTouch := conn.attachedAt
	for {
		_, data, err := ws.Read(ctx)
		if err != nil {
			return err
		}
		now := s.now()
		if now.Sub(lastTouch) >= s.cfg.TouchInterval {
			lastTouch = now
			s.touchSeen(ctx, conn, now)
		}
		var f clientFrame
		if err := json.Unmarshal(data, &f); err != nil {
			s.sendCtrl(conn, errorFrame{Type: "error", Code: marconi.CodeInvalidJSON, Message: "frames must be JSON objects"})
			continue
		}
		switch f.Type {
		case "ack":
			if f.UpToSeq == nil || *f.UpToSeq < 0 {
				s.sendCtrl(conn, errorFrame{Type: "error", Code: marconi.CodeInvalidField, Message: "ack needs a non-negative up_to_seq"})
				continue
			}
			// Acks are keyed by session key: one from a connection of an
			// earlier incarnation would ack the new session's signals.
			current, err := s.stillCurrent(ctx, conn)
			if err != nil {
				s.log.Warn("ack from websocket: check the session", keyAttrs(conn.key), "err", err)
				continue
			}
			if !current {
				continue // kicked: the writer closes it with 4410
			}
			actx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
			_, err = s.signals.Ack(actx, conn.key, *f.UpToSeq)
			cancel()
			if err != nil {
				s.log.Warn("ack from websocket", keyAttrs(conn.key), "err", err)
			}
		case "ping":
			// Application-level keepalive: proof of life only.
		default:
			s.sendCtrl(conn, errorFrame{Type: "error", Code: marconi.CodeInvalidField, Message: "unknown frame type; want ack"})
		}
	}
}

func (s *Server) sendCtrl(conn *wsConn, f errorFrame) {
	b, err := json.Marshal(f)
	if err != nil {
		return
	}
	select {
	case conn.ctrl <- b:
	default: // a client flooding bad frames loses the replies, not the hub's memory
	}
}

var errPongTimeout = errors.New("pong timeout")

// pingLoop pings every WSPingInterval and ends the connection when a pong
// has not come within one more interval.
func (s *Server) pingLoop(ctx context.Context, ws *websocket.Conn, conn *wsConn) error {
	t := time.NewTicker(s.cfg.WSPingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, s.cfg.WSPingInterval)
		err := ws.Ping(pctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return errPongTimeout
		}
		s.touchSeen(ctx, conn, s.now())
	}
}

// touchSeen records the connection's activity as proof of life. A session
// that is gone (deregistered on another instance, or expired) has no live
// row to touch: its connection is closed with 4410.
func (s *Server) touchSeen(ctx context.Context, conn *wsConn, now time.Time) {
	tctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
	defer cancel()
	err := s.store.TouchSession(tctx, conn.key, sessionstore.Touch{SeenAt: now, ExpiresAt: now.Add(s.cfg.SessionTTL)}, now)
	if errors.Is(err, sessionstore.ErrNotFound) {
		conn.kick(statusSessionExpired, reasonSessionGone, "deregistered")
		return
	}
	if err != nil {
		s.log.Debug("touch from websocket", keyAttrs(conn.key), "err", err)
	}
}

// stillCurrent reads the store row of conn's session and reports whether
// conn belongs to it. When it does not (the session is gone, or was
// registered again since: another incarnation) it kicks conn with 4410. A
// store failure is returned and conn is left alone.
func (s *Server) stillCurrent(ctx context.Context, conn *wsConn) (bool, error) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
	defer cancel()
	sess, err := s.store.GetSession(rctx, conn.key, s.now())
	if errors.Is(err, sessionstore.ErrNotFound) {
		conn.kick(statusSessionExpired, reasonSessionGone, "deregistered")
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the session of a connection: %w", err)
	}
	if !conn.belongsTo(sess) {
		conn.kick(statusSessionExpired, reasonSessionGone, "deregistered")
		return false, nil
	}
	return true, nil
}

// closeAll closes every attached connection with code, for shutdown.
func (s *Server) closeAll(code websocket.StatusCode, reason, metricReason string) {
	for _, c := range s.registry.all() {
		c.kick(code, reason, metricReason)
	}
}

// kickSession closes k's connection on this instance, if any.
func (s *Server) kickSession(k sessionstore.Key, code websocket.StatusCode, reason, metricReason string) {
	if c := s.registry.get(k); c != nil {
		c.kick(code, reason, metricReason)
	}
}

var _ = http.StatusOK
