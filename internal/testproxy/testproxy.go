package testproxy

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

// dialTimeout bounds reaching the target for one accepted connection.
const dialTimeout = 5 * time.Second

// Proxy forwards TCP connections from Addr to a target. It is safe for
// concurrent use. Every goroutine it starts ends in Close, which t.Cleanup
// calls.
type Proxy struct {
	t      testing.TB
	target string
	ln     net.Listener
	ctx    context.Context // cancelled by Close: aborts dials in progress
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	cut    bool
	closed bool
	links  map[*link]struct{}
	// partitioned: new connections are held, never forwarded (Partition).
	partitioned bool
	held        []net.Conn
}

// link is one proxied connection: the client side and the target side.
type link struct {
	client, server net.Conn
	frozen         chan struct{} // closed by Freeze
	freezeOnce     sync.Once
	done           chan struct{} // closed by shut
	shutOnce       sync.Once
}

func (l *link) freeze() { l.freezeOnce.Do(func() { close(l.frozen) }) }

func (l *link) shut() {
	l.shutOnce.Do(func() {
		close(l.done)
		_ = l.client.Close()
		_ = l.server.Close()
	})
}

// Start listens on 127.0.0.1:0 and forwards every connection to target.
// The proxy is closed in t.Cleanup.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testproxy: listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{t: t, target: target, ln: ln, ctx: ctx, cancel: cancel, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every live connection and refuses new ones (accepted, then
// closed at once) until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	links := p.takeLinks()
	p.mu.Unlock()
	for _, l := range links {
		l.shut()
	}
}

// Restore lets new connections through again after Cut.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Freeze stops every live connection from forwarding bytes, in both
// directions, while leaving it open: a half-open route. New connections
// still pass. A frozen connection stays frozen until Cut or Close.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.freeze()
	}
}

// Partition drops every packet from now on, as a network partition does:
// live connections forward nothing (as with Freeze), and new connections
// are accepted but never reach the target, so a client's connect and its
// queries go unanswered. Nothing is refused or closed until Heal or Close.
func (p *Proxy) Partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partitioned = true
	for l := range p.links {
		l.freeze()
	}
}

// Heal ends a Partition: the connections it froze or held are closed, as
// their peers would have given up on them, and new connections pass again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.partitioned = false
	links, held := p.takeLinks(), p.takeHeld()
	p.mu.Unlock()
	for _, l := range links {
		l.shut()
	}
	closeAll(held)
}

// Close stops the proxy, closes every connection and waits for every
// goroutine it started. It may be called more than once.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	links, held := p.takeLinks(), p.takeHeld()
	p.mu.Unlock()
	closeAll(held)

	p.cancel()
	_ = p.ln.Close()
	for _, l := range links {
		l.shut()
	}
	p.wg.Wait()
}

// takeLinks empties the link set and returns what it held. p.mu is held.
func (p *Proxy) takeLinks() []*link {
	out := make([]*link, 0, len(p.links))
	for l := range p.links {
		out = append(out, l)
		delete(p.links, l)
	}
	return out
}

// takeHeld empties the connections held by a partition and returns them.
// p.mu is held.
func (p *Proxy) takeHeld() []net.Conn {
	held := p.held
	p.held = nil
	return held
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		_ = c.Close()
	}
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.t.Logf("testproxy: accept: %v", err)
			}
			return
		}
		p.mu.Lock()
		refuse := p.cut || p.closed
		hold := !refuse && p.partitioned
		if hold {
			p.held = append(p.held, c)
		}
		p.mu.Unlock()
		if hold {
			continue
		}
		if refuse {
			_ = c.Close()
			continue
		}
		p.wg.Add(1) // this goroutine is counted, so Add cannot race Wait
		go p.serve(c)
	}
}

// serve dials the target for client c and forwards bytes both ways until
// either side ends, the link is cut, or the proxy closes.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(p.ctx, dialTimeout)
	var d net.Dialer
	server, err := d.DialContext(ctx, "tcp", p.target)
	cancel()
	if err != nil {
		_ = client.Close()
		return
	}
	l := &link{client: client, server: server, frozen: make(chan struct{}), done: make(chan struct{})}

	p.mu.Lock()
	if p.cut || p.closed {
		p.mu.Unlock()
		l.shut()
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()

	var pipes sync.WaitGroup
	pipes.Add(2)
	go func() { defer pipes.Done(); pipe(l, server, client) }()
	go func() { defer pipes.Done(); pipe(l, client, server) }()
	pipes.Wait()

	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// pipe copies src to dst until an error, then shuts the link. Once the link
// is frozen it forwards nothing more, not even a close: it holds what it
// read and waits for the link to be shut by Cut or Close.
func pipe(l *link, dst, src net.Conn) {
	defer l.shut()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-l.frozen:
			<-l.done
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
