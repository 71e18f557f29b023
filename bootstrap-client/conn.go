package bootstrap

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi"
)

// delivery is a batch of signals for the dispatcher, tagged with the
// registration epoch and the store history (history.go) under which they
// were received, possibly preceded by an affinity reset.
type delivery struct {
	signals       []Signal
	epoch         uint64
	affinityReset bool
	// history is the token of the store's history the signals were read
	// under; "" when the hub named none.
	history string
	// page says the signals are a page of an HTTP answer (drain, pending)
	// that covers every pending signal up to through.
	page    bool
	through int64
}

// connect runs the bootstrap connect sequence: attach the WebSocket with the
// session's token and wait for the welcome; when the hub no longer knows the
// session (410), register it again and attach. It returns the attached
// connection and its generation.
//
// A reconnect does not resume (rotate the token) first: a resume whose answer
// is lost, as when the hub dies mid-request, leaves the client holding a
// token the hub has already replaced, and every later call is refused (403)
// with no way back. The token the client holds stays valid until the client
// itself rotates it, so attaching with it is enough.
func (c *Client) connect(ctx context.Context) (*websocket.Conn, uint64, error) {
	if c.currentAuth().epoch == 0 { // Dial: not registered yet
		if err := c.register(ctx); err != nil {
			return nil, 0, err
		}
	}
	a := c.currentAuth()
	conn, gen, err := c.attach(ctx)
	var he *Error
	if errors.As(err, &he) && he.Code == marconi.CodeSessionExpired {
		if err := c.reregister(ctx, a.token); err != nil {
			return nil, 0, err
		}
		conn, gen, err = c.attach(ctx)
	}
	return conn, gen, err
}

// attach opens GET /v1/ws with the session token, following 409
// wrong_instance to the instance that holds the session, and waits for the
// welcome. The connection becomes the client's current one. Every attach
// starts at the hub URL in use: a followed instance_url is not pinned, so
// when that instance dies the next attempt asks the hub URL again, whose
// instance takes the session over once it sees the dead one gone. When the
// hub URL itself is unreachable or answers 502, 503 or 504, the next attempt
// uses the next URL (failover).
func (c *Client) attach(ctx context.Context) (*websocket.Conn, uint64, error) {
	base, idx := c.hub()
	for hop := 0; ; hop++ {
		a := c.currentAuth()
		// The upgrade is bounded as the welcome is: a request that lands on a
		// pooled connection whose path died silently would wait forever.
		dctx, cancel := context.WithTimeout(ctx, welcomeTimeout)
		h := http.Header{"Authorization": {"Bearer " + a.token}}
		if p := c.project.Load(); p != nil {
			h[marconi.HeaderProject] = *p
		}
		conn, resp, err := websocket.Dial(dctx, base+"/v1/ws", &websocket.DialOptions{
			HTTPClient: c.http,
			HTTPHeader: h,
		})
		cancel() // the connection outlives the dial's context
		if err != nil {
			if resp == nil || resp.StatusCode == http.StatusSwitchingProtocols {
				if hop == 0 && ctx.Err() == nil {
					c.failover(idx, err)
				}
				if hop > 0 && c.ctx.Err() == nil {
					// The instance the hub URL named is unreachable: most
					// likely it died and the hub URL's instance has not yet seen
					// it dead. Every attempt starts at the hub URL again, whose
					// instance takes the session over (affinity reset) once it
					// has.
					c.log.Warn("marconi: assigned instance unreachable; retrying through HubURL",
						"instance_url", base, "err", err)
				}
				return nil, 0, fmt.Errorf("bootstrap: attach %s: %w", base, err)
			}
			var body []byte
			if resp.Body != nil {
				body, _ = io.ReadAll(resp.Body)
			}
			he := decodeError(resp.StatusCode, body)
			he.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
			if hop == 0 && unavailable(he) {
				c.failover(idx, he)
			}
			if he.Code == marconi.CodeWrongInstance && he.instanceURL != "" && hop < maxWrongInstanceHops {
				target := tokenURL(c.urls, he.instanceURL)
				if target == "" {
					// The session token must not go there: plain http from
					// an https hub, a loopback address from a remote one.
					c.log.Warn("marconi: not following wrong_instance to an instance_url the session token may not go to (publish https:// instance URLs on an https fleet: docs/operations.md)",
						"instance_url", he.instanceURL)
					return nil, 0, he
				}
				c.log.Debug("marconi: following wrong_instance", "instance_url", he.instanceURL)
				base = target
				continue
			}
			return nil, 0, he
		}
		conn.SetReadLimit(readLimit)
		w, err := readWelcome(ctx, conn)
		if err != nil {
			_ = conn.CloseNow()
			return nil, 0, err
		}
		c.mu.Lock()
		c.conn = conn
		c.gen++
		gen := c.gen
		c.connHistory = w.History
		c.immediate = false
		c.mu.Unlock()
		c.log.Info("marconi: attached", "session_id", w.SessionID, "instance_id", w.InstanceID,
			"resumed", w.Resumed, "affinity_reset", w.AffinityReset, "replayed", w.Replayed, "generation", gen)
		if w.Dropped > 0 {
			c.droppedAtReset.Add(int64(w.Dropped))
			c.log.Warn("marconi: the hub dropped pending signals at the affinity reset (disconnect policy drop)",
				"session_id", w.SessionID, "instance_id", w.InstanceID, "dropped", w.Dropped)
		}
		if w.AffinityReset || a.epoch > 1 {
			// epoch > 1: the session was registered again; the dispatcher
			// tells the application once per registration.
			c.enqueue(ctx, delivery{affinityReset: w.AffinityReset, epoch: a.epoch})
		}
		return conn, gen, nil
	}
}

// welcome is the first frame of an attached WebSocket.
type welcome struct {
	SessionID     string `json:"session_id"`
	InstanceID    string `json:"instance_id"`
	Resumed       bool   `json:"resumed"`
	AffinityReset bool   `json:"affinity_reset"`
	Replayed      int    `json:"replayed"`
	Dropped       int    `json:"dropped"`
	History       string `json:"history"`
}

func readWelcome(ctx context.Context, conn *websocket.Conn) (welcome, error) {
	ctx, cancel := context.WithTimeout(ctx, welcomeTimeout)
	defer cancel()
	_, data, err := conn.Read(ctx)
	if err != nil {
		return welcome{}, fmt.Errorf("bootstrap: wait for welcome: %w", err)
	}
	var w struct {
		Type marconi.FrameType `json:"type"`
		welcome
	}
	if err := json.Unmarshal(data, &w); err != nil || w.Type != marconi.FrameWelcome {
		return welcome{}, fmt.Errorf("bootstrap: first frame is not a welcome: %.100s", data)
	}
	return w.welcome, nil
}

// supervise owns the WebSocket: it runs a reader for the current connection
// and, when the connection ends, decides whether and how to connect again.
func (c *Client) supervise(conn *websocket.Conn, gen uint64) {
	defer c.wg.Done()
	for {
		a := c.currentAuth()
		c.mu.Lock()
		history := c.connHistory // the welcome's, read by the attach that made conn
		c.mu.Unlock()
		readDone := make(chan error, 1)
		hold := new(readerHold)
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			readDone <- c.readLoop(conn, a.epoch, history, hold)
		}()
		dead := make(chan struct{})
		stopPings := c.startKeepalive(conn, hold, dead)
		var err error
	wait:
		for {
			select {
			case err = <-readDone:
				break wait
			case <-dead:
				dead = nil
				c.pingTimeouts.Add(1)
				c.log.Warn("marconi: no pong from the hub within PingTimeout; the path is dead, reconnecting",
					"session_id", c.SessionID(), "generation", gen, "ping_timeout", c.cfg.PingTimeout)
				// No close handshake: nothing comes back on this path. The
				// idle HTTP connections most likely took the same path:
				// a drain on one of them would wait in vain.
				_ = conn.CloseNow()
				c.closeIdle()
			case <-c.heal:
				c.mu.Lock()
				forThis := c.healFor >= gen // not a request about a former connection
				c.mu.Unlock()
				if forThis {
					// No close handshake: the hub says it holds no queue for
					// this connection, so there is most likely no peer to
					// answer one, and waiting for it would delay the repair.
					_ = conn.CloseNow()
				}
			case <-c.ctx.Done():
				_ = conn.Close(websocket.StatusNormalClosure, "client closed")
				<-readDone
				stopPings()
				c.detach(gen)
				return
			}
		}
		stopPings()
		_ = conn.CloseNow()
		c.detach(gen)
		if c.ctx.Err() != nil {
			return
		}
		c.mu.Lock()
		immediate := c.immediate
		c.mu.Unlock()
		status := websocket.CloseStatus(err)
		if c.isEnding() {
			return // Deregister ended the session; Close follows
		}
		if !immediate {
			switch status {
			case marconi.CloseReplaced:
				c.stop()
				c.log.Warn("marconi: connection replaced by a newer one of this session; not redialing")
				c.fatal(ErrReplaced)
				return
			case marconi.CloseSessionExpired:
				if rerr := c.reregister(c.ctx, a.token); rerr != nil {
					c.log.Warn("marconi: re-register after 4410 failed", "err", rerr)
				}
			}
		}
		c.log.Info("marconi: WebSocket ended, reconnecting", "status", int(status), "err", err, "immediate", immediate)
		var rerr error
		if conn, gen, rerr = c.redial(status == marconi.CloseRestarting); rerr != nil {
			c.stop()
			if c.ctx.Err() == nil {
				c.fatal(rerr)
			}
			return
		}
	}
}

func (c *Client) isEnding() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ending
}

// stop records that the supervisor gave the session up (replaced, or refused
// by the hub): no more reconnects and heartbeats.
func (c *Client) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
}

// fatal tells the application, once, that the client stopped for good
// (Config.OnFatal): err is the hub's *Error when one is in the chain.
func (c *Client) fatal(err error) {
	var he *Error
	if errors.As(err, &he) {
		err = he
	}
	c.fatalOnce.Do(func() {
		if c.cfg.OnFatal != nil {
			c.cfg.OnFatal(err)
		}
	})
}

// detach forgets the connection of generation gen.
func (c *Client) detach(gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen == gen {
		c.conn = nil
	}
}

// readLoop reads the hub's frames until the connection ends and hands the
// signals to the dispatcher, under the store history the welcome named, or
// the one a history frame named since. It returns the error that ended the
// connection.
func (c *Client) readLoop(conn *websocket.Conn, epoch uint64, history string, hold *readerHold) error {
	var (
		dec frameDecoder
		buf bytes.Buffer // one frame at a time; what a signal keeps is copied
	)
	for {
		// Not c.ctx: a cancelled read closes the connection abruptly; the
		// supervisor closes it normally instead, which ends this read.
		_, r, err := conn.Reader(context.Background())
		if err != nil {
			return err
		}
		if buf.Cap() > maxPooledAnswer {
			buf = bytes.Buffer{} // a large frame's buffer is not kept
		}
		buf.Reset()
		if _, err := buf.ReadFrom(r); err != nil {
			return err
		}
		var f frame
		if err := dec.decode(buf.Bytes(), &f); err != nil {
			c.log.Warn("marconi: undecodable frame", "err", err)
			continue
		}
		if f.Type == marconi.FrameHistory {
			// The hub writes the unacknowledged signals again under it.
			c.log.Info("marconi: the hub's store moved to another history (a standby promoted); its unacknowledged signals come again", "history", f.History)
			history = f.History
			continue
		}
		if f.Type != marconi.FrameSignal {
			c.log.Debug("marconi: ignoring frame", "type", f.Type)
			continue
		}
		d := delivery{signals: []Signal{f.Signal}, epoch: epoch, history: history}
		select {
		case c.deliveries <- d:
			continue
		default: // the dispatcher is busy: this read waits for it
		}
		hold.enter()
		ok := c.enqueue(c.ctx, d)
		hold.leave()
		if !ok {
			return c.ctx.Err()
		}
	}
}

// redial attaches again, waiting between attempts with backoff and draining
// while the WebSocket is down, until it is attached, the client closes
// (errClosed), or the hub refuses for good (that answer). After a restart
// the hub announced (1012), the backoff's ceiling is ReconnectRestartMaxDelay.
// An attach refused 429 (the hub's per-session attach rate) waits at least
// the answer's Retry-After before the next attempt.
func (c *Client) redial(restart bool) (*websocket.Conn, uint64, error) {
	b := c.backoff
	if restart {
		b = b.capped(c.cfg.ReconnectRestartMaxDelay)
	}
	var asked time.Duration // the hub's Retry-After on the last attempt's 429
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		immediate := c.immediate
		c.mu.Unlock()
		if !immediate {
			dctx, cancel := context.WithTimeout(c.ctx, drainTimeout)
			c.drain(dctx)
			cancel()
			if !c.wait(max(b.delay(attempt), asked)) {
				return nil, 0, errClosed
			}
		}
		conn, gen, err := c.connect(c.ctx)
		if err == nil {
			c.reconnects.Add(1)
			return conn, gen, nil
		}
		if c.ctx.Err() != nil {
			return nil, 0, errClosed
		}
		c.mu.Lock()
		c.immediate = false
		c.mu.Unlock()
		if permanent(err) {
			c.log.Error("marconi: hub refuses the session; giving up reconnecting", "err", err)
			return nil, 0, err
		}
		asked = 0
		if he := (*Error)(nil); errors.As(err, &he) && he.Status == http.StatusTooManyRequests {
			asked = he.RetryAfter // waited out before the next attempt, past the backoff
			c.rateLimited.Add(1)
		}
		c.log.Warn("marconi: reconnect failed", "attempt", attempt, "err", err, "retry_after", asked)
	}
}

// permanent reports whether err is an answer that retrying cannot change: a
// bad request, a credential refused, a session that belongs to someone else.
func permanent(err error) bool {
	var he *Error
	if !errors.As(err, &he) {
		return false
	}
	switch he.Status {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
		return true
	}
	return false
}

// wait sleeps d, cut short by a self-heal request; false when the client closes.
func (c *Client) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.ctx.Done():
		return false
	case <-c.heal:
		return true
	case <-t.C:
		return true
	}
}

// enqueue hands d to the dispatcher; false when ctx or the client ended first
// (the signals stay unacknowledged on the hub and come again).
func (c *Client) enqueue(ctx context.Context, d delivery) bool {
	select {
	case c.deliveries <- d:
		return true
	case <-ctx.Done():
		return false
	case <-c.ctx.Done():
		return false
	}
}

// offer hands d to the dispatcher when there is room, and drops it when
// there is none: the signals stay unacknowledged on the hub and come again
// (piggyback, drain and the replay on attach all start from the oldest
// unacknowledged signal, so nothing is skipped). Piggyback and drain use it so
// that a Send made from inside OnSignal never waits for the dispatcher.
func (c *Client) offer(d delivery) {
	select {
	case c.deliveries <- d:
	default:
		c.log.Debug("marconi: delivery queue full; signals will come again", "signals", len(d.signals))
	}
}

// ackEvery bounds how many deliveries may be handled before an ack is sent
// even though more are queued.
const ackEvery = 32

// defaultAckInterval is Config.AckInterval's default.
const defaultAckInterval = 500 * time.Millisecond

// dispatch is the one goroutine that calls OnSignal and OnAffinityReset. It
// acknowledges what it delivered after the handler returned: when no other
// delivery is queued, else at least every ackEvery deliveries; but never
// sooner than AckInterval after its previous ack (a timer then sends the
// one that waits, for everything handled meanwhile).
func (c *Client) dispatch() {
	defer c.wg.Done()
	seq := newSequencer(defaultSeenIDs)
	history := "" // the store history of what was delivered last (history.go)
	unacked := 0
	told := uint64(1) // the newest registration the application was told of; 1 is Dial's
	var (
		lastAck time.Time
		pacer   *time.Timer
		due     <-chan time.Time // an ack waits for it; nil when none waits
	)
	defer func() {
		if pacer != nil {
			pacer.Stop()
		}
	}()
	var frame []byte // the ack frame's buffer, reused
	ackNow := func() {
		ctx, cancel := context.WithTimeout(c.ctx, ackTimeout)
		frame = c.ack(ctx, frame, seqMark{epoch: seq.epoch, seq: seq.highest, history: history})
		cancel()
		unacked, lastAck = 0, time.Now()
	}
	// sendDeferred sends the ack Client.Ack holds back (DeferAck).
	sendDeferred := func() {
		ctx, cancel := context.WithTimeout(c.ctx, ackTimeout)
		c.sendDeferredAck(ctx)
		cancel()
	}
	// armPacer has due fire after wait (at once when it is not positive).
	armPacer := func(wait time.Duration) {
		wait = max(wait, 0)
		if pacer == nil {
			pacer = time.NewTimer(wait)
		} else {
			pacer.Reset(wait) // fired and read, or never started: nothing stale comes
		}
		due = pacer.C
	}
	for {
		var d delivery
		select {
		case <-c.ctx.Done():
			return
		case <-due:
			due = nil
			if c.cfg.DeferAck {
				sendDeferred()
			} else if unacked > 0 {
				ackNow()
			}
			continue
		case <-c.deferredAck:
			if due == nil {
				armPacer(c.deferred.wait(time.Now(), c.cfg.AckInterval))
			}
			continue
		case done := <-c.flushAcks:
			if c.cfg.DeferAck {
				sendDeferred()
			} else if unacked > 0 {
				ackNow()
			}
			close(done)
			continue
		case d = <-c.deliveries:
		}
		reset := d.affinityReset && d.epoch >= seq.epoch
		if d.epoch > told { // a registration after Dial's: whatever the session held is gone
			told, reset = d.epoch, true
		}
		if reset && c.cfg.OnAffinityReset != nil {
			c.cfg.OnAffinityReset()
		}
		if d.history != "" && d.history != history && d.epoch >= seq.epoch {
			if history != "" {
				c.newHistory(seq, d)
				unacked = 0 // seqs of the old history: an ack of them would be refused
			}
			history = d.history
		}
		for _, s := range d.signals {
			if !seq.accept(d.epoch, s) {
				continue
			}
			if seq.rewound {
				c.log.Warn("marconi: signal delivered below the highest seq delivered: the hub's numbering went back (its store lost its last signals, as an asynchronous standby promoted does)",
					"signal_id", s.ID, "seq", s.Seq)
			}
			c.mu.Lock()
			c.highest = seqMark{epoch: d.epoch, seq: s.Seq, history: history}
			c.mu.Unlock()
			if c.cfg.DeferAck {
				c.held.hold(s.ID, seqMark{epoch: d.epoch, seq: s.Seq, history: history})
			}
			if c.cfg.OnSignal != nil {
				c.cfg.OnSignal(s)
			}
		}
		if d.page && d.history != "" && d.history == history && d.epoch == seq.epoch {
			c.pageThrough(d)
		}
		if len(d.signals) > 0 && d.epoch == seq.epoch {
			unacked++
		}
		if unacked > 0 && !c.cfg.DeferAck && due == nil && (len(c.deliveries) == 0 || unacked >= ackEvery) {
			if wait := c.cfg.AckInterval - time.Since(lastAck); wait > 0 {
				armPacer(wait)
			} else {
				ackNow()
			}
		}
	}
}

// ack acknowledges every signal up to m: on the WebSocket when attached,
// else over HTTP, within ctx. A failed ack is only logged: the signals come
// again and are deduplicated. The frame is written in buf, returned for the
// next ack.
func (c *Client) ack(ctx context.Context, buf []byte, m seqMark) []byte {
	buf, err := c.writeAck(ctx, buf, m)
	c.logAckError(err, m, "marconi: ack failed")
	return buf
}

// writeAck acknowledges every signal of registration m.epoch up to m.seq,
// received under store history m.history, as ack does, and returns the
// error of the call when both ways failed (an *Error with
// marconi.CodeHistoryChanged when the store moved to another history
// since). The frame is written in buf, returned for the next ack.
func (c *Client) writeAck(ctx context.Context, buf []byte, m seqMark) ([]byte, error) {
	epoch, upTo := m.epoch, m.seq
	if upTo <= 0 {
		return buf, nil
	}
	c.mu.Lock()
	conn, current := c.conn, c.epoch
	c.mu.Unlock()
	if epoch != current {
		return buf, nil // the registration these signals belonged to is gone
	}
	if conn != nil {
		buf = appendAckFrame(buf[:0], upTo)
		if err := conn.Write(ctx, websocket.MessageText, buf); err == nil {
			c.acks.Add(1)
			return buf, nil
		}
	}
	if _, err := c.sessionCall(ctx, http.MethodPost, "/v1/signals/ack", ackRequest{UpToSeq: upTo, History: m.history}, nil); err != nil {
		return buf, fmt.Errorf("bootstrap: ack up to seq %d: %w", upTo, err)
	}
	c.acks.Add(1)
	return buf, nil
}

// ackTimeout bounds one ack: its write on the WebSocket, or its call.
const ackTimeout = 10 * time.Second

// appendAckFrame appends the WebSocket ack frame of upTo, as json.Marshal
// writes ackRequest{Type: "ack", UpToSeq: upTo}.
func appendAckFrame(dst []byte, upTo int64) []byte {
	dst = append(dst, `{"type":"ack","up_to_seq":`...)
	dst = strconv.AppendInt(dst, upTo, 10)
	return append(dst, '}')
}
