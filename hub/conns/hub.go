package conns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/internal/fieldcheck"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/signals"
)

// Config is the connection hub's configuration. New fills the zero fields
// that have a default (WithDefaults); InstanceID, SessionTTL, TouchInterval
// and StoreTimeout are required.
type Config struct {
	// InstanceID names this instance in the store's queue records.
	InstanceID string
	// StartedAt is when this process started, as its heartbeats say
	// (fabric.Members.StartedAt): the bus's listener and liveness
	// connections hold this process's liveness lock under it. Zero: the
	// other instances never see this process connected, and judge it by its
	// heartbeat alone.
	StartedAt time.Time
	// SessionTTL: an attach or a connection's activity extends the session
	// this long.
	SessionTTL time.Duration
	// TouchInterval bounds proof-of-life writes of a connection: at most one
	// per interval.
	TouchInterval time.Duration
	// StoreTimeout bounds every store call.
	StoreTimeout time.Duration
	// PingInterval: the hub pings every interval and drops a peer whose
	// pong has not come within one more interval.
	PingInterval time.Duration
	// ReadLimit is the largest frame the hub reads from a client.
	ReadLimit int64
	// QueueSize bounds each connection's outgoing queue; overflow closes the
	// connection with 4429 (the signals stay durable).
	QueueSize int
	// WriteTimeout bounds one frame write.
	WriteTimeout time.Duration
	// AckInterval: a connection's acks are coalesced (the newest up_to_seq
	// wins) and written to the store at most once per interval, and once
	// more when the connection ends.
	AckInterval time.Duration
	// FramesPerSecond is the rate of frames a client may send on one
	// connection, with a burst of twice it; past it the connection is closed
	// with 1008 (quota frames_per_second).
	FramesPerSecond float64
	// MaxConnections caps the connections open on this instance.
	MaxConnections int
	// MaxConnectionsPerAddress caps the connections open from one client address.
	MaxConnectionsPerAddress int
	// OnQuotaRefused, when set, is called for each refusal the connection
	// hub decides by itself (a frame-rate close); refusals returned by Admit
	// are the caller's to count.
	OnQuotaRefused func(marconi.Quota)
}

// validate checks, once the defaults are applied, that every field is set
// and positive: a zero PingInterval, say, would fail every connection at its
// first ping.
func (c Config) validate() error {
	return fieldcheck.Check("conns", "set and positive", map[string]bool{
		"InstanceID":               c.InstanceID != "",
		"SessionTTL":               c.SessionTTL > 0,
		"TouchInterval":            c.TouchInterval > 0,
		"StoreTimeout":             c.StoreTimeout > 0,
		"PingInterval":             c.PingInterval > 0,
		"ReadLimit":                c.ReadLimit > 0,
		"QueueSize":                c.QueueSize > 0,
		"WriteTimeout":             c.WriteTimeout > 0,
		"AckInterval":              c.AckInterval > 0,
		"FramesPerSecond":          c.FramesPerSecond > 0,
		"MaxConnections":           c.MaxConnections > 0,
		"MaxConnectionsPerAddress": c.MaxConnectionsPerAddress > 0,
	})
}

// Store is what the connection hub uses of sessionstore.Store; the methods'
// contracts, and the errors they return, are documented there.
type Store interface {
	GetSession(ctx context.Context, k sessionstore.Key, now time.Time) (sessionstore.Session, error)
	SessionHeads(ctx context.Context, keys []sessionstore.Key, now time.Time) (map[sessionstore.Key]sessionstore.SessionHead, error)
	TouchSessionAs(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, t sessionstore.Touch, now time.Time) error
	SetQueue(ctx context.Context, k sessionstore.Key, instance string, at time.Time) error
	AttachQueue(ctx context.Context, k sessionstore.Key, instance string, at time.Time, t sessionstore.Touch, now time.Time) (pending int, err error)
	ClearQueue(ctx context.Context, k sessionstore.Key, instance string, attachedAt, at time.Time) (bool, error)
	PendingSignals(ctx context.Context, k sessionstore.Key, afterSeq int64, limit int) ([]sessionstore.Signal, error)
}

// Peers is what the connection hub needs of the fabric to reach queues on
// other instances.
type Peers interface {
	// Healthy reports whether instance is healthy (heartbeat fresh, not draining).
	Healthy(ctx context.Context, instance string) bool
	// HoldsQueue reports whether instance is healthy and its process has run
	// since attachedAt, so that a queue recorded there then is still there.
	HoldsQueue(ctx context.Context, instance string, attachedAt time.Time) bool
}

// Deps are the collaborators of a connection hub.
type Deps struct {
	Store Store
	// Ack acknowledges k's signals up to seq while h still speaks for k
	// (signals.Service.AckAs).
	Ack func(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, upToSeq int64) (int, error)
	// Peers judges other instances' health (fabric.Members).
	Peers Peers
	// Bus carries wake-ups to and from other instances; nil means none
	// (fabric.NoBus: a lone instance).
	Bus fabric.Bus
	// Draining reports whether this instance is draining: its queues then
	// count as not attached.
	Draining func() bool
	Registry prometheus.Registerer
	Logger   *slog.Logger
	Now      func() time.Time
}

// Hub is the registry of the connections attached to this instance and
// their loops. It implements signals.Router. It is safe for concurrent use.
type Hub struct {
	cfg       Config
	store     Store
	ack       func(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, upToSeq int64) (int, error)
	peers     Peers
	bus       fabric.Bus // counted (countingBus)
	draining  func() bool
	log       *slog.Logger
	now       func() time.Time
	metrics   *metrics
	registry  *registry
	admission *admission

	mu      sync.Mutex
	closing bool
	wg      sync.WaitGroup // attached connections (hijacked: the HTTP server does not wait for them)
	// writers counts the connections' writer goroutines running now; a
	// send yields to the writer it starts only when that one is alone
	// (see pushFirst).
	writers atomic.Int64
	// nextExpiry is, at most, the earliest expiry its connections know
	// of their sessions (UnixNano): the expiry check looks at none before
	// (expiry.go).
	nextExpiry atomic.Int64
	// followed is the store's history FollowHistory last saw (history.go).
	followed atomic.Uint64
}

var _ signals.Router = (*Hub)(nil)

// New builds a connection hub and registers its metrics on d.Registry.
func New(cfg Config, d Deps) (*Hub, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.OnQuotaRefused == nil {
		cfg.OnQuotaRefused = func(marconi.Quota) {}
	}
	if d.Store == nil || d.Ack == nil || d.Peers == nil || d.Draining == nil || d.Registry == nil || d.Now == nil {
		return nil, errors.New("conns: missing dependency")
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Bus == nil {
		d.Bus = fabric.NoBus{}
	}
	m, err := newMetrics(d.Registry)
	if err != nil {
		return nil, err
	}
	return &Hub{
		cfg: cfg, store: d.Store, ack: d.Ack, peers: d.Peers, bus: countingBus{Bus: d.Bus, m: m}, draining: d.Draining,
		log: d.Logger, now: d.Now, metrics: m, registry: newRegistry(),
		admission: newAdmission(cfg.MaxConnections, cfg.MaxConnectionsPerAddress),
	}, nil
}

// Attach upgrades the request to a WebSocket and serves it as sess's queue
// until it ends: the welcome, every unacknowledged signal in seq order, then
// live ones. The caller has authenticated sess and placed it here, and
// release (from Admit) is called when the connection ends. The welcome's
// Replayed is counted here, by the store write that records the attach.
//
// Attach returns once the upgrade is done and the connection registered:
// it is then read by a goroutine of its own, which starts with a small
// stack and keeps it small (see serve), while the handler's goroutine and
// what the HTTP exchange allocated are released. Close waits for it.
func (h *Hub) Attach(w http.ResponseWriter, r *http.Request, sess sessionstore.Session, welcome Welcome, release func()) {
	// Control frames spend the frame budget as data frames do. The library
	// calls these from whichever goroutine reads: the reader, or a Close
	// waiting for the peer's close frame, which may run before start has
	// returned the connection (a frame then is not counted).
	var conn atomic.Pointer[Conn]
	control := func() bool {
		c := conn.Load()
		return c != nil && c.controlFrame()
	}
	ws, err := websocket.Accept(leanHijack{w}, r, &websocket.AcceptOptions{
		InsecureSkipVerify: true,
		OnPingReceived:     func(context.Context, []byte) bool { return control() },
		OnPongReceived:     func(context.Context, []byte) { control() },
	})
	if err != nil {
		release()
		h.log.Debug("websocket accept failed", KeyAttrs(sess.Key), "err", err)
		return // Accept has written the HTTP error
	}
	ws.SetReadLimit(h.cfg.ReadLimit)

	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		release()
		ws.Close(DisconnectShutdown.Code, DisconnectShutdown.Reason)
		return
	}
	h.wg.Add(1)
	h.mu.Unlock()
	c := h.start(sess, ws, welcome)
	conn.Store(c)
	go func() {
		defer h.wg.Done()
		defer release()
		h.serve(c)
	}()
}

// Current reports whether a connection here is sess's queue for placement:
// one being closed still counts (the new attach replaces it); one that sess
// (its store row) shows superseded does not.
func (h *Hub) Current(sess sessionstore.Session) bool {
	c := h.registry.get(sess.Key)
	return c != nil && h.superseded(c, sess) == nil
}

// Kick closes k's connection on this instance, if any, with d.
func (h *Hub) Kick(k sessionstore.Key, d Disconnect) {
	if c := h.registry.get(k); c != nil {
		c.kick(d)
	}
}

// TokenReplaced closes, with 4409, the connection of sess's session opened
// with a token that sess (its row after a resume or a takeover) no longer
// holds: here at once, and on the instance the row records holding its
// queue through a check wake-up (the pending sweep is the net).
func (h *Hub) TokenReplaced(ctx context.Context, sess sessionstore.Session) {
	if c := h.registry.get(sess.Key); c != nil {
		h.reconcile(c, sess)
	}
	h.wakeToCheck(ctx, sess)
}

// SessionEnded closes, with 4410, the connection of the session that sess
// was (its row before a deregistration): here at once, and on the instance
// the row records holding its queue through a check wake-up.
func (h *Hub) SessionEnded(ctx context.Context, sess sessionstore.Session) {
	h.Kick(sess.Key, DisconnectDeregistered)
	h.wakeToCheck(ctx, sess)
}

// wakeToCheck asks the instance that sess records holding its queue, when
// it is another, to check its connection against the store row.
func (h *Hub) wakeToCheck(ctx context.Context, sess sessionstore.Session) {
	if sess.QueueInstance != "" && sess.QueueInstance != h.cfg.InstanceID {
		w := sessionstore.Wake{Key: sess.Key, Seq: fabric.CheckSeq}
		if err := h.bus.Publish(ctx, sess.QueueInstance, w); err != nil {
			h.log.Warn("check wake-up not sent; the pending sweep will check the connection",
				"to_instance", sess.QueueInstance, KeyAttrs(sess.Key), "err", err)
		}
	}
}

// Close refuses new attaches, closes every attached connection with 1012
// (hub restarting) and waits, until ctx ends, for their handlers to finish.
func (h *Hub) Close(ctx context.Context) error {
	h.mu.Lock()
	h.closing = true
	h.mu.Unlock()
	for _, c := range h.registry.all() {
		c.kick(DisconnectShutdown)
	}
	done := make(chan struct{})
	go func() {
		h.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("websocket handlers still running: %w", ctx.Err())
	}
}

func (h *Hub) isClosing() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closing
}

// superseded says whether c, given sess (a store row of its key), is not
// the queue of the session sess is, and with what c is to be closed when the
// row shows it superseded: 4410 when the row is a later incarnation of the
// session (the one c belonged to was deregistered or expired), 4409 when the
// row holds another token than c was opened with (a resume or a takeover)
// or records a newer queue on another instance (the client reconnected
// there). A row older than c (read before c's session registered again) is
// not c's, but proves nothing against c: c is not to be closed (a zero
// Disconnect). Attach times of two instances are compared, so this assumes
// their clocks agree to well within the time a client takes to reconnect.
func (h *Hub) superseded(c *Conn, sess sessionstore.Session) *Disconnect {
	switch {
	case c.incarnation.Before(sess.RegisteredAt):
		return &DisconnectSessionGone
	case !c.belongsTo(sess):
		return &Disconnect{}
	case !c.holdsToken(sess):
		return &DisconnectTokenReplaced
	case sess.QueueInstance != "" && sess.QueueInstance != h.cfg.InstanceID && sess.QueueAttachedAt.After(c.attachedAt):
		return &DisconnectReplacedElsewhere
	}
	return nil
}

// queueOf returns the connection on this instance that is sess's queue, or
// nil: none, one being closed, or one that sess shows superseded. It closes
// nothing; see reconcile.
func (h *Hub) queueOf(sess sessionstore.Session) *Conn {
	c := h.registry.get(sess.Key)
	if c == nil || c.closing() || h.superseded(c, sess) != nil {
		return nil
	}
	return c
}

// reconcile closes c when sess shows it superseded.
func (h *Hub) reconcile(c *Conn, sess sessionstore.Session) {
	if d := h.superseded(c, sess); d != nil && d.Code != 0 {
		c.kick(*d)
	}
}

// offer puts an item on c's queue without blocking. A full queue means a
// slow consumer: its connection is closed with 4429; the signals stay in the
// store and are replayed on the next attach. It reports whether c took the
// item (or was closed for it), and whether a writer was started for it.
func (h *Hub) offer(c *Conn, it queueItem) (taken, started bool) {
	if c == nil || c.closing() {
		// A closing connection writes nothing more: the signal waits in the
		// store for the next attach, like any offline one (no drop).
		return false, false
	}
	if c.enqueue(it) {
		return true, c.wake()
	}
	h.metrics.queueDrops.WithLabelValues("slow_consumer").Inc()
	c.kick(DisconnectSlowConsumer)
	return true, false
}

// Route implements signals.Router: a queue in the local registry is attached
// unless it is being closed or superseded (it belongs to an earlier
// incarnation of the session, or a newer queue is recorded on another
// instance); a queue recorded on another instance is attached while that
// instance is healthy and has run since the queue attached (an instance
// restarted with the same id lost the queues of its earlier process, which a
// crash leaves recorded in the store). Route closes nothing.
func (h *Hub) Route(ctx context.Context, sess sessionstore.Session) signals.Route {
	if c := h.queueOf(sess); c != nil {
		draining := h.draining()
		return signals.Route{Attached: !draining, InstanceID: h.cfg.InstanceID, InstanceHealthy: !draining, AttachedAt: c.attachedAt}
	}
	if sess.QueueInstance == "" || sess.QueueInstance == h.cfg.InstanceID {
		return signals.Route{}
	}
	healthy := h.peers.Healthy(ctx, sess.QueueInstance)
	holds := healthy && h.peers.HoldsQueue(ctx, sess.QueueInstance, sess.QueueAttachedAt)
	return signals.Route{Attached: holds, InstanceID: sess.QueueInstance, InstanceHealthy: healthy, AttachedAt: sess.QueueAttachedAt}
}

// Deliver implements signals.Router. A local connection that to (the store
// row) shows superseded is closed on the way. When it starts the
// connection's writer and no other writer runs, it lets that writer run
// before the caller goes on (see pushFirst).
func (h *Hub) Deliver(ctx context.Context, to sessionstore.Session, sig sessionstore.Signal) {
	if c := h.registry.get(to.Key); c != nil {
		h.reconcile(c, to)
	}
	if taken, started := h.offer(h.queueOf(to), queueItem{sig: &sig}); taken {
		if started && h.writers.Load() == 1 {
			pushFirst()
		}
		return
	}
	if to.QueueInstance != "" && to.QueueInstance != h.cfg.InstanceID {
		h.publish(ctx, to.QueueInstance, to, &sig)
	}
}

// KeyAttrs is the structured-log group of a session key.
func KeyAttrs(k sessionstore.Key) slog.Attr {
	return slog.Group("session", "tenant_id", k.TenantID, "project_id", k.ProjectID, "session_id", k.SessionID)
}
