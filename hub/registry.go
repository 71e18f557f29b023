package hub

import (
	"context"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/signals"
)

// queueItem is one entry of a connection's outgoing queue: a signal to write,
// or (sig nil) a wake-up to catch up from the store.
type queueItem struct {
	sig *sessionstore.Signal
}

// wsConn is one attached WebSocket: the session's queue on this instance.
type wsConn struct {
	key sessionstore.Key
	// incarnation is the RegisteredAt of the session the connection
	// authenticated as. A session deregistered (or expired) and registered
	// again under the same key is another incarnation: its signals, seqs and
	// acks are none of this connection's business.
	incarnation time.Time
	attachedAt  time.Time
	out         chan queueItem // bounded: WSQueueSize
	ctrl        chan []byte    // frames the reader asks the writer to send (errors)

	kickOnce   sync.Once
	kicked     chan struct{}
	kickCode   websocket.StatusCode
	kickReason string
	kickMetric string
	done       chan struct{} // closed when the handler has finished
}

func newWSConn(k sessionstore.Key, incarnation, at time.Time, queueSize int) *wsConn {
	return &wsConn{
		key: k, incarnation: incarnation, attachedAt: at,
		out:    make(chan queueItem, queueSize),
		ctrl:   make(chan []byte, 8),
		kicked: make(chan struct{}),
		done:   make(chan struct{}),
	}
}

// kick asks the connection's writer to close it with code. The first kick wins.
func (c *wsConn) kick(code websocket.StatusCode, reason, metricReason string) {
	c.kickOnce.Do(func() {
		c.kickCode, c.kickReason, c.kickMetric = code, reason, metricReason
		close(c.kicked)
	})
}

// closing reports whether the connection was kicked: its writer is closing
// it and will write nothing more, so it is no longer a queue.
func (c *wsConn) closing() bool {
	select {
	case <-c.kicked:
		return true
	default:
		return false
	}
}

// registry is the in-memory map of session to live queue on this instance.
// It is safe for concurrent use.
type registry struct {
	mu    sync.Mutex
	conns map[sessionstore.Key]*wsConn
}

func newRegistry() *registry {
	return &registry{conns: make(map[sessionstore.Key]*wsConn)}
}

// attach makes c the session's queue and returns the one it replaced.
func (r *registry) attach(c *wsConn) *wsConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.conns[c.key]
	r.conns[c.key] = c
	return old
}

// detach removes c if it is still the session's queue, and reports whether it was.
func (r *registry) detach(c *wsConn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns[c.key] != c {
		return false
	}
	delete(r.conns, c.key)
	return true
}

func (r *registry) get(k sessionstore.Key) *wsConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conns[k]
}

func (r *registry) all() []*wsConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*wsConn, 0, len(r.conns))
	for _, c := range r.conns {
		out = append(out, c)
	}
	return out
}

func (r *registry) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.conns)
}

// belongsTo reports whether c is a connection of the incarnation of the
// session that sess is the store row of.
func (c *wsConn) belongsTo(sess sessionstore.Session) bool {
	return c.incarnation.Equal(sess.RegisteredAt)
}

// Close reasons of a connection that is no longer its session's queue.
const (
	reasonSessionGone       = "session deregistered or expired; register again"
	reasonReplacedElsewhere = "replaced by a newer connection of this session on another instance"
)

// superseded says whether c, given sess (a store row of its key), is not
// the queue of the session sess is, and kicks it when the row shows it
// superseded: with 4410 when the row is a later incarnation of the session
// (the one c belonged to was deregistered or expired), with 4409 when the
// row records a newer queue on another instance (the client reconnected
// there). A row older than c (read before c's session registered again) is
// not c's, but proves nothing against c: c is left open. Attach times of two
// instances are compared, so this assumes their clocks agree to well within
// the time a client takes to reconnect.
func (s *Server) superseded(c *wsConn, sess sessionstore.Session) bool {
	switch {
	case c.incarnation.Before(sess.RegisteredAt):
		c.kick(statusSessionExpired, reasonSessionGone, "deregistered")
		return true
	case !c.belongsTo(sess):
		return true
	case sess.QueueInstance != "" && sess.QueueInstance != s.cfg.InstanceID && sess.QueueAttachedAt.After(c.attachedAt):
		c.kick(statusReplaced, reasonReplacedElsewhere, "replaced")
		return true
	}
	return false
}

// queueOf returns the connection on this instance that is sess's queue, or
// nil: none, one being closed, or one that sess (the store row) shows
// superseded, which is kicked on the way.
func (s *Server) queueOf(sess sessionstore.Session) *wsConn {
	c := s.registry.get(sess.Key)
	if c == nil || c.closing() || s.superseded(c, sess) {
		return nil
	}
	return c
}

// offer puts an item on k's queue without blocking. A full queue means a slow
// consumer: its connection is closed with 4429; the signals stay in the store
// and are replayed on the next attach.
func (s *Server) offer(k sessionstore.Key, it queueItem) bool {
	return s.offerTo(s.registry.get(k), it)
}

// offerTo is offer on a given connection (nil: none).
func (s *Server) offerTo(c *wsConn, it queueItem) bool {
	if c == nil || c.closing() {
		// A closing connection writes nothing more: the signal waits in the
		// store for the next attach, like any offline one (no drop).
		return false
	}
	select {
	case c.out <- it:
	default:
		s.metrics.queueDrops.WithLabelValues("slow_consumer").Inc()
		c.kick(statusSlowConsumer, "slow consumer: queue full; signals stay durable", "slow_consumer")
	}
	return true
}

// Route implements signals.Router: a queue in the local registry is attached
// unless it is being closed (kicked) or superseded (it belongs to an earlier
// incarnation of the session, or a newer queue is recorded on another
// instance; such a connection is kicked); a queue recorded on another instance is
// attached while that instance is healthy and has run since the queue
// attached (an instance restarted with the same id lost the queues of its
// earlier process, which a crash leaves recorded in the store).
func (s *Server) Route(ctx context.Context, sess sessionstore.Session) signals.Route {
	if c := s.queueOf(sess); c != nil {
		return signals.Route{Attached: !s.Draining(), InstanceID: s.cfg.InstanceID, InstanceHealthy: !s.Draining(), AttachedAt: c.attachedAt}
	}
	if sess.QueueInstance == "" || sess.QueueInstance == s.cfg.InstanceID {
		return signals.Route{}
	}
	healthy := s.peers.Healthy(ctx, sess.QueueInstance)
	holds := healthy && s.peers.HoldsQueue(ctx, sess.QueueInstance, sess.QueueAttachedAt)
	return signals.Route{Attached: holds, InstanceID: sess.QueueInstance, InstanceHealthy: healthy, AttachedAt: sess.QueueAttachedAt}
}

// Deliver implements signals.Router.
func (s *Server) Deliver(ctx context.Context, to sessionstore.Session, sig sessionstore.Signal) {
	if s.offerTo(s.queueOf(to), queueItem{sig: &sig}) {
		return
	}
	if to.QueueInstance != "" && to.QueueInstance != s.cfg.InstanceID {
		s.peers.Wake(ctx, to.QueueInstance, to.Key, sig.Seq)
	}
}

// Peers is what the hub needs of the fabric to reach queues on other
// instances. The single-instance default knows no peers.
type Peers interface {
	// Healthy reports whether instance is healthy (heartbeat fresh, not draining).
	Healthy(ctx context.Context, instance string) bool
	// HoldsQueue reports whether instance is healthy and its process has run
	// since attachedAt, so that a queue recorded there then is still there.
	HoldsQueue(ctx context.Context, instance string, attachedAt time.Time) bool
	// Wake tells instance that k has a new signal with seq; best effort.
	Wake(ctx context.Context, instance string, k sessionstore.Key, seq int64)
}

type noPeers struct{}

func (noPeers) Healthy(context.Context, string) bool                  { return false }
func (noPeers) HoldsQueue(context.Context, string, time.Time) bool    { return false }
func (noPeers) Wake(context.Context, string, sessionstore.Key, int64) {}

// WakeLocal is how the fabric hands a cross-instance wake-up to this
// instance: the session's writer catches up from the store (and checks,
// before it writes, that the signals are its incarnation's).
func (s *Server) WakeLocal(k sessionstore.Key) {
	s.offer(k, queueItem{})
}
