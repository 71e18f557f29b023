package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// benchKey is the API key (and Centrifugo's HTTP API key) of the servers a
// comparison starts on loopback; it is no secret.
const benchKey = "mak_bench_local_only"

// marconiServer runs `marconi serve` on the memory store, its limits raised
// above what the run needs.
type marconiServer struct {
	bin    string
	env    []string // added to its environment, after the defaults
	url    string
	sender string // the sending session's token
}

func (m *marconiServer) name() string { return "marconi" }

func (m *marconiServer) start(ctx context.Context, dir string) (*exec.Cmd, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	m.url = "http://" + addr
	env := []string{
		"MARCONI_ADDR=" + addr, "MARCONI_API_KEYS=" + benchKey + "=t1/p1", "MARCONI_LOG_LEVEL=error",
		"MARCONI_ADMIN_TOKEN=bench-admin-token-local-only",
		"MARCONI_SEND_RATE_PER_SECOND=1000000", "MARCONI_WS_FRAMES_PER_SECOND=1000000",
		"MARCONI_MAX_CONNECTIONS=1000000", "MARCONI_MAX_CONNECTIONS_PER_ADDRESS=1000000",
		"MARCONI_QUOTA_SESSIONS_PER_PROJECT=1000000", "MARCONI_QUOTA_REGISTRATIONS_PER_SECOND=1000000",
		"MARCONI_QUOTA_PENDING_PER_RECIPIENT=1000000",
	}
	env = append(env, m.env...)
	return startProcess(ctx, dir, "marconi", m.bin, []string{"serve"}, env, func(ctx context.Context) error {
		return httpJSON(ctx, "GET", m.url+"/readyz", nil, nil, nil)
	})
}

func (m *marconiServer) register(ctx context.Context, id string) (string, error) {
	var out struct {
		Token string `json:"token"`
	}
	err := httpJSON(ctx, "POST", m.url+"/v1/sessions", map[string]string{"Authorization": "Bearer " + benchKey},
		map[string]any{"session_id": id, "surface": "claude_code"}, &out)
	return out.Token, err
}

func (m *marconiServer) dial(ctx context.Context, token string) (*websocket.Conn, error) {
	c, err := wsDial(ctx, "ws"+m.url[len("http"):]+"/v1/ws", http.Header{"Authorization": {"Bearer " + token}})
	if err != nil {
		return nil, err
	}
	if _, _, err := c.Read(ctx); err != nil { // the welcome
		c.CloseNow()
		return nil, err
	}
	return c, nil
}

func (m *marconiServer) receiver(ctx context.Context, got chan time.Time) error {
	var err error
	if m.sender, err = m.register(ctx, "sender"); err != nil {
		return err
	}
	tok, err := m.register(ctx, "receiver")
	if err != nil {
		return err
	}
	c, err := m.dial(ctx, tok)
	if err != nil {
		return err
	}
	clients.add(c, func() error {
		var f struct {
			Type string `json:"type"`
			Seq  int64  `json:"seq"`
		}
		for n := 1; ; n++ {
			_, data, err := c.Read(ctx)
			if err != nil {
				return err
			}
			at := time.Now()
			if json.Unmarshal(data, &f) != nil || f.Type != "signal" {
				continue
			}
			got <- at
			if n%32 == 0 { // ack now and then, as a client does, so nothing piles up
				b, _ := json.Marshal(map[string]any{"type": "ack", "up_to_seq": f.Seq})
				if err := c.Write(ctx, websocket.MessageText, b); err != nil {
					return err
				}
			}
		}
	})
	return nil
}

func (m *marconiServer) idle(ctx context.Context, i int) error {
	tok, err := m.register(ctx, "idle-"+strconv.Itoa(i))
	if err != nil {
		return err
	}
	c, err := m.dial(ctx, tok)
	if err != nil {
		return err
	}
	clients.add(c, discard(ctx, c))
	return nil
}

func (m *marconiServer) send(ctx context.Context, i int) error {
	return httpJSON(ctx, "POST", m.url+"/v1/signals", map[string]string{"Authorization": "Bearer " + m.sender},
		map[string]any{"to_session": "receiver", "kind": "bench", "payload": map[string]int{"n": i}}, nil)
}

// centrifugoServer runs Centrifugo v6 with insecure clients (no tokens) and
// an HTTP API key; the receiver and each idle connection subscribe to a
// channel of their own, and a send is an HTTP publish.
type centrifugoServer struct {
	bin string
	url string
}

func (c *centrifugoServer) name() string { return "centrifugo" }

func (c *centrifugoServer) start(ctx context.Context, dir string) (*exec.Cmd, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	c.url = "http://" + addr
	host, port, _ := net.SplitHostPort(addr)
	cfg := filepath.Join(dir, "centrifugo.json")
	if err := os.WriteFile(cfg, []byte("{}\n"), 0o600); err != nil {
		return nil, err
	}
	env := []string{
		"CENTRIFUGO_HTTP_SERVER_ADDRESS=" + host, "CENTRIFUGO_HTTP_SERVER_PORT=" + port,
		"CENTRIFUGO_CLIENT_INSECURE=true", "CENTRIFUGO_HTTP_API_KEY=" + benchKey, "CENTRIFUGO_LOG_LEVEL=error",
	}
	return startProcess(ctx, dir, "centrifugo", c.bin, []string{"-c", cfg}, env, func(ctx context.Context) error {
		return httpJSON(ctx, "POST", c.url+"/api/info", map[string]string{"X-API-Key": benchKey}, map[string]any{}, nil)
	})
}

// subscribe connects and subscribes to channel, and returns the connection
// once both replies are read.
func (c *centrifugoServer) subscribe(ctx context.Context, channel string) (*websocket.Conn, error) {
	ws, err := wsDial(ctx, "ws"+c.url[len("http"):]+"/connection/websocket", nil)
	if err != nil {
		return nil, err
	}
	for i, cmd := range []string{`{"id":1,"connect":{}}`, `{"id":2,"subscribe":{"channel":"` + channel + `"}}`} {
		if err := ws.Write(ctx, websocket.MessageText, []byte(cmd)); err != nil {
			ws.CloseNow()
			return nil, err
		}
		_, data, err := ws.Read(ctx)
		if err != nil || bytes.Contains(data, []byte(`"error"`)) {
			ws.CloseNow()
			return nil, fmt.Errorf("centrifugo command %d: %s %v", i+1, data, err)
		}
	}
	return ws, nil
}

// centrifugoRead reads ws until it ends, answers the server's pings ({})
// and reports each push on got (nil: none expected).
func centrifugoRead(ctx context.Context, ws *websocket.Conn, got chan<- time.Time) func() error {
	return func() error {
		for {
			_, data, err := ws.Read(ctx)
			if err != nil {
				return err
			}
			at := time.Now()
			for line := range bytes.SplitSeq(data, []byte("\n")) {
				switch {
				case bytes.Equal(bytes.TrimSpace(line), []byte("{}")):
					if err := ws.Write(ctx, websocket.MessageText, []byte("{}")); err != nil {
						return err
					}
				case got != nil && bytes.Contains(line, []byte(`"push"`)):
					got <- at
				}
			}
		}
	}
}

func (c *centrifugoServer) receiver(ctx context.Context, got chan time.Time) error {
	ws, err := c.subscribe(ctx, "receiver")
	if err != nil {
		return err
	}
	clients.add(ws, centrifugoRead(ctx, ws, got))
	return nil
}

func (c *centrifugoServer) idle(ctx context.Context, i int) error {
	ws, err := c.subscribe(ctx, "idle-"+strconv.Itoa(i))
	if err != nil {
		return err
	}
	clients.add(ws, centrifugoRead(ctx, ws, nil))
	return nil
}

func (c *centrifugoServer) send(ctx context.Context, i int) error {
	return httpJSON(ctx, "POST", c.url+"/api/publish", map[string]string{"X-API-Key": benchKey},
		map[string]any{"channel": "receiver", "data": map[string]int{"n": i}}, nil)
}

// floorServer runs `marconi-bench floor`: the cost of a WebSocket that does
// nothing.
type floorServer struct {
	bin string
	url string
}

func (f *floorServer) name() string { return "floor" }

func (f *floorServer) start(ctx context.Context, dir string) (*exec.Cmd, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	f.url = "http://" + addr
	return startProcess(ctx, dir, "floor", f.bin, []string{"floor", "-addr", addr}, nil, f.receiverReady)
}

// receiverReady reports whether the floor serves: a send to a connection
// that is not there answers 404.
func (f *floorServer) receiverReady(ctx context.Context) error {
	err := httpJSON(ctx, "POST", f.url+"/send?id=none", nil, nil, nil)
	if err != nil && !strings.Contains(err.Error(), " 404 ") {
		return err
	}
	return nil
}

func (f *floorServer) attach(ctx context.Context, id string) (*websocket.Conn, error) {
	return wsDial(ctx, "ws"+f.url[len("http"):]+"/ws?id="+id, nil)
}

func (f *floorServer) receiver(ctx context.Context, got chan time.Time) error {
	ws, err := f.attach(ctx, "receiver")
	if err != nil {
		return err
	}
	clients.add(ws, func() error {
		for {
			if _, _, err := ws.Read(ctx); err != nil {
				return err
			}
			got <- time.Now()
		}
	})
	// The server registers the connection after its handshake: wait for it.
	for {
		err := httpJSON(ctx, "POST", f.url+"/send?id=receiver", nil, map[string]int{"n": -1}, nil)
		if err == nil {
			<-got
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		sleepCtx(ctx, 10*time.Millisecond)
	}
}

func (f *floorServer) idle(ctx context.Context, i int) error {
	ws, err := f.attach(ctx, "idle-"+strconv.Itoa(i))
	if err != nil {
		return err
	}
	clients.add(ws, discard(ctx, ws))
	return nil
}

func (f *floorServer) send(ctx context.Context, i int) error {
	return httpJSON(ctx, "POST", f.url+"/send?id=receiver", nil, map[string]int{"n": i}, nil)
}
