package main

import (
	"bytes"
	"net"
	"sync"
	"time"
)

// halfOpenListener wraps the demo hub's listener so that the demo can leave
// WebSocket connections half-open, the way a dead NAT entry or a hung peer
// does: from then on the hub's side reads and writes nothing (its pings go
// unanswered) and the client's side stays open but silent (it sees no close).
// Plain HTTP connections are never touched. It is safe for concurrent use.
type halfOpenListener struct {
	net.Listener

	mu    sync.Mutex
	conns []*halfOpenConn
}

func newHalfOpenListener(ln net.Listener) *halfOpenListener {
	return &halfOpenListener{Listener: ln}
}

func (l *halfOpenListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	hc := &halfOpenConn{Conn: c, frozen: make(chan struct{})}
	l.mu.Lock()
	l.conns = append(l.conns, hc)
	l.mu.Unlock()
	return hc, nil
}

// freezeWebSockets makes every WebSocket connection accepted so far half-open.
func (l *halfOpenListener) freezeWebSockets() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		if c.isWebSocket() {
			c.freeze()
		}
	}
}

// closeAll closes the real sockets of every connection, frozen ones included.
func (l *halfOpenListener) closeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Conn.Close()
	}
	l.conns = nil
}

type halfOpenConn struct {
	net.Conn

	mu       sync.Mutex
	first    []byte // the first bytes read: tells a WebSocket upgrade apart
	once     sync.Once
	frozen   chan struct{}
	isFrozen bool
}

func (c *halfOpenConn) isWebSocket() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.HasPrefix(c.first, []byte("GET /v1/ws"))
}

func (c *halfOpenConn) freeze() {
	c.once.Do(func() {
		c.mu.Lock()
		c.isFrozen = true
		c.mu.Unlock()
		close(c.frozen)
		// Unblock a Read in progress on the real socket; the peer sees nothing.
		_ = c.Conn.SetReadDeadline(time.Now())
	})
}

func (c *halfOpenConn) frozenNow() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.isFrozen
}

// Read returns nothing more once frozen: it fails as a dead network would,
// without closing the client's side.
func (c *halfOpenConn) Read(p []byte) (int, error) {
	if c.frozenNow() {
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	if c.first == nil && n > 0 {
		c.first = append([]byte(nil), p[:min(n, 16)]...)
	}
	frozen := c.isFrozen
	c.mu.Unlock()
	if frozen {
		return 0, net.ErrClosed
	}
	return n, err
}

// Write swallows everything once frozen.
func (c *halfOpenConn) Write(p []byte) (int, error) {
	if c.frozenNow() {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// Close leaves a frozen connection's real socket open (the client must not
// learn of it); closeAll closes it at the end of the demo.
func (c *halfOpenConn) Close() error {
	if c.frozenNow() {
		return nil
	}
	return c.Conn.Close()
}
