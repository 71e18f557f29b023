package mcpbridge_test

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
)

// wsProxy (as in bootstrap-client's tests) is a TCP proxy in front of a hub that can cut the hub's side of
// every WebSocket passing through it while the client's side stays open and
// silent: the hub detaches the session's queue, the client still believes it
// is attached. That is SPEC-168's asymmetry (a WebSocket handler that died
// without the client noticing). HTTP calls pass through untouched.
type wsProxy struct {
	t      *testing.T
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

func newWSProxy(t *testing.T, targetURL string) *wsProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &wsProxy{t: t, ln: ln, target: targetURL[len("http://"):]}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// URL is the proxy's base URL, to use as Config.HubURL.
func (p *wsProxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *wsProxy) accept() {
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

func (p *wsProxy) serve(client net.Conn) {
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

func (p *wsProxy) isZombie(pc *proxied) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return pc.zombie
}

// zombify cuts the hub's side of every WebSocket through the proxy and keeps
// the clients' sides open and silent.
func (p *wsProxy) zombify() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pc := range p.conns {
		if pc.ws && !pc.zombie {
			pc.zombie = true
			pc.upstream.Close()
		}
	}
}

func (p *wsProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, pc := range p.conns {
		pc.client.Close()
		pc.upstream.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
