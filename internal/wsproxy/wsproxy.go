// Package wsproxy is a test proxy that makes SPEC-168's half-open route: it
// can cut the hub's side of every WebSocket passing through it while the
// client's side stays open and silent. Tests of the Go client and of the MCP
// bridge use it; it is never built into the hub.
package wsproxy

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy in front of a hub that can cut the hub's side of
// every WebSocket passing through it while the client's side stays open and
// silent: the hub detaches the session's queue, the client still believes it
// is attached. That is SPEC-168's asymmetry (a WebSocket handler that died
// without the client noticing). HTTP calls pass through untouched.
type Proxy struct {
	t      testing.TB
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns []*proxied
	wg    sync.WaitGroup
}

type proxied struct {
	client, upstream net.Conn
	ws               bool
	zombie           bool // upstream cut; the client side is kept open
}

// New starts a proxy in front of the hub at targetURL (http://host:port);
// t.Cleanup closes it and every connection through it.
func New(t testing.TB, targetURL string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{t: t, ln: ln, target: targetURL[len("http://"):]}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// URL is the proxy's base URL, to use as Config.HubURL.
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	buf := make([]byte, 4096)
	n, err := client.Read(buf)
	if err != nil {
		client.Close()
		up.Close()
		return
	}
	pc := &proxied{client: client, upstream: up, ws: bytes.HasPrefix(buf[:n], []byte("GET /v1/ws"))}
	p.mu.Lock()
	p.conns = append(p.conns, pc)
	p.mu.Unlock()
	if _, err := up.Write(buf[:n]); err != nil {
		client.Close()
		up.Close()
		return
	}
	p.wg.Add(1)
	go func() { // hub → client
		defer p.wg.Done()
		_, _ = io.Copy(client, up)
		if !p.isZombie(pc) {
			client.Close()
		}
	}()
	// client → hub; a zombie's writes are swallowed until the client hangs up.
	_, _ = io.Copy(writerFunc(func(b []byte) (int, error) {
		if p.isZombie(pc) {
			return len(b), nil
		}
		return up.Write(b)
	}), client)
	client.Close()
	up.Close()
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func (p *Proxy) isZombie(pc *proxied) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return pc.zombie
}

// Zombify cuts the hub's side of every WebSocket through the proxy and keeps
// the clients' sides open and silent.
func (p *Proxy) Zombify() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pc := range p.conns {
		if pc.ws && !pc.zombie {
			pc.zombie = true
			pc.upstream.Close()
		}
	}
}

// Sever cuts both sides of every WebSocket through the proxy: an abnormal
// close as both ends see it.
func (p *Proxy) Sever() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pc := range p.conns {
		if pc.ws {
			pc.upstream.Close()
			pc.client.Close()
		}
	}
}

func (p *Proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, pc := range p.conns {
		pc.client.Close()
		pc.upstream.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
