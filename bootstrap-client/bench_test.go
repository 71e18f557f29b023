package bootstrap

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

// The client's own cost per send and per received signal, without a hub's:
// rawHub answers the client over plain TCP, by hand, allocating nothing per
// request or frame, so that what a benchmark counts (allocs/op, B/op,
// ns/op, cpu-ns/op) is the client's. Its answers are the hub's bytes: a send's answer
// as hub/sendanswer.go writes it, a signal frame as hub/conns/frames.go
// does. The fleet's load generator (cmd/marconi-bench fleet, load_cpu/send)
// is 64 of these clients sending and 64 receiving.

// rawHub is a hand-written stand-in for a hub: registration, heartbeat,
// send and the WebSocket, over HTTP/1.1 keep-alive.
type rawHub struct {
	ln  net.Listener
	url string
	wg  sync.WaitGroup

	// burst, when set, holds each send's answer until burst.n sends are
	// in flight together. Set before the hub serves.
	burst *burst
	done  chan struct{} // closed by close: a held answer is abandoned

	mu    sync.Mutex
	conns []net.Conn
	ws    chan net.Conn // the attached WebSocket, once
	w     wsWriter      // every frame the stand-in writes
}

// burst releases the answers to sends n at a time, once n have arrived, so
// that a test knows n connections were in use at once.
type burst struct {
	n int

	mu      sync.Mutex
	arrived int
	release chan struct{}
}

func newBurst(n int) *burst { return &burst{n: n, release: make(chan struct{})} }

// wait returns when the n-th send of the current burst has arrived, or
// false when done closes first.
func (b *burst) wait(done <-chan struct{}) bool {
	b.mu.Lock()
	release := b.release
	if b.arrived++; b.arrived == b.n {
		close(release)
		b.arrived, b.release = 0, make(chan struct{})
	}
	b.mu.Unlock()
	select {
	case <-release:
		return true
	case <-done:
		return false
	}
}

func newRawHub(tb testing.TB) *rawHub { return newBurstHub(tb, nil) }

// newBurstHub is newRawHub whose send answers go out b.n at a time (b nil:
// each at once).
func newBurstHub(tb testing.TB, b *burst) *rawHub {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	h := &rawHub{ln: ln, url: "http://" + ln.Addr().String(), ws: make(chan net.Conn, 1), burst: b, done: make(chan struct{})}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.conns = append(h.conns, c)
			h.mu.Unlock()
			h.wg.Add(1)
			go func() {
				defer h.wg.Done()
				h.serve(c)
			}()
		}
	}()
	tb.Cleanup(h.close)
	return h
}

func (h *rawHub) close() {
	close(h.done)
	_ = h.ln.Close()
	h.mu.Lock()
	for _, c := range h.conns {
		_ = c.Close()
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// opened is the number of connections accepted so far.
func (h *rawHub) opened() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}

const (
	rawSession   = "r-1764625232123456789-7"
	rawSender    = "s-1764625232123456789-7"
	rawRegAnswer = `{"session_id":"` + rawSession + `","token":"mst_0123456789abcdef0123456789abcdef","tenant_id":"bench",` +
		`"project_id":"durable","surface":"headless_cc","runtime_mode":"stateless","runtime_mode_source":"default",` +
		`"instance_id":"hub-1","instance_url":null,"registered_at":"2026-12-01T21:40:32.123456Z",` +
		`"expires_at":"2026-12-01T22:40:32.123456Z","heartbeat_interval_seconds":3600,"taken_over":false}` + "\n"
	rawHeartbeatAnswer = `{"session_id":"` + rawSession + `","route_state":"attached","expires_at":"2026-12-01T22:40:32.123456Z","pending":null}` + "\n"
	// rawSendAnswerHead and rawSendAnswerTail surround the seq of a send's
	// answer; with the hub's own URL as the recipient's instance, as one
	// instance answers.
	rawSendAnswerHead = `{"signal_id":"0193a1f2-7c4e-7b3a-9d2e-5f6a7b8c9d0e","seq":`
	rawSendAnswerTail = `,"delivery":"pushed_to_ws","recipient_route_state":"attached","recipient_instance_url":"%s",` +
		`"selfheal_outcome":null,"selfheal":{"recipient":null,"sender":null},"duplicate":false,"pending":null}` + "\n"
)

// serve answers one connection's requests until it closes or upgrades.
func (h *rawHub) serve(c net.Conn) {
	br := bufio.NewReader(c)
	var out []byte
	var seq int64
	tail := []byte(rawSendAnswerTail[:bytes.IndexByte([]byte(rawSendAnswerTail), '%')] + h.url +
		rawSendAnswerTail[bytes.IndexByte([]byte(rawSendAnswerTail), '%')+2:])
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return
		}
		var target [32]byte
		n := copy(target[:], line)
		length, key := 0, ""
		for {
			hl, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(hl) <= 2 {
				break
			}
			if name, val, ok := bytes.Cut(hl, []byte(": ")); ok {
				switch {
				case bytes.EqualFold(name, []byte("Content-Length")):
					length, _ = strconv.Atoi(string(bytes.TrimSpace(val)))
				case bytes.EqualFold(name, []byte("Sec-WebSocket-Key")):
					key = string(bytes.TrimSpace(val))
				}
			}
		}
		if _, err := br.Discard(length); err != nil {
			return
		}
		req := target[:n]
		var body []byte
		switch {
		case bytes.HasPrefix(req, []byte("POST /v1/signals ")):
			if h.burst != nil && !h.burst.wait(h.done) {
				return
			}
			seq++
			body = append(strconv.AppendInt(append(out[:0], rawSendAnswerHead...), seq, 10), tail...)
		case bytes.HasPrefix(req, []byte("POST /v1/sessions ")):
			body = append(out[:0], rawRegAnswer...)
		case bytes.HasPrefix(req, []byte("POST /v1/heartbeat ")):
			body = append(out[:0], rawHeartbeatAnswer...)
		case bytes.HasPrefix(req, []byte("GET /v1/ws ")):
			h.upgrade(c, br, key)
			return
		default:
			_, _ = io.WriteString(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
			continue
		}
		head := append(body[len(body):], "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "...)
		head = strconv.AppendInt(head, int64(len(body)), 10)
		head = append(head, "\r\n\r\n"...)
		msg := append(head, body...)
		if _, err := c.Write(msg); err != nil {
			return
		}
		out = msg[:0]
	}
}

// upgrade answers a WebSocket handshake, sends the welcome, hands the
// connection to whoever pushes signals, and reads the client's frames
// (acks, pings, the close) until it closes.
func (h *rawHub) upgrade(c net.Conn, br *bufio.Reader, key string) {
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	_, err := io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "+
		base64.StdEncoding.EncodeToString(sum[:])+"\r\n\r\n")
	if err != nil {
		return
	}
	welcome := []byte(`{"type":"welcome","session_id":"` + rawSession + `","instance_id":"hub-1","resumed":false,"affinity_reset":false,"replayed":0}`)
	w := &h.w
	if err := w.write(c, 0x1, welcome); err != nil {
		return
	}
	select {
	case h.ws <- c:
	default:
	}
	var payload []byte
	for {
		var hdr [2]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		op, n := hdr[0]&0x0f, int(hdr[1]&0x7f)
		switch n {
		case 126:
			var l [2]byte
			if _, err := io.ReadFull(br, l[:]); err != nil {
				return
			}
			n = int(binary.BigEndian.Uint16(l[:]))
		case 127:
			return // no client frame of the benchmarks is that large
		}
		var mask [4]byte
		if _, err := io.ReadFull(br, mask[:]); err != nil {
			return
		}
		payload = append(payload[:0], make([]byte, n)...)
		if _, err := io.ReadFull(br, payload); err != nil {
			return
		}
		for i := range payload {
			payload[i] ^= mask[i%4]
		}
		switch op {
		case 0x8: // close: answer it and end
			_ = w.write(c, 0x8, payload)
			_ = c.Close()
			return
		case 0x9: // ping
			if err := w.write(c, 0xA, payload); err != nil {
				return
			}
		}
	}
}

// wsWriter writes a server's (unmasked) WebSocket frames, one write each,
// through a buffer it reuses. Safe for use by one goroutine at a time.
type wsWriter struct {
	mu  sync.Mutex
	buf []byte
}

func (w *wsWriter) write(c net.Conn, op byte, p []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := append(w.buf[:0], 0x80|op)
	switch {
	case len(p) < 126:
		b = append(b, byte(len(p)))
	case len(p) < 1<<16:
		b = append(b, 126, byte(len(p)>>8), byte(len(p)))
	default:
		b = append(b, 127)
		b = binary.BigEndian.AppendUint64(b, uint64(len(p)))
	}
	b = append(b, p...)
	w.buf = b[:0]
	_, err := c.Write(b)
	return err
}

// rawSignalFrame appends the hub's frame of the seq-th signal to dst: a
// 60-byte payload, as the fleet sends.
func rawSignalFrame(dst []byte, seq int64) []byte {
	dst = append(dst, `{"type":"signal","id":"0193a1f2-7c4e-7b3a-9d2e-`...)
	dst = append(dst, []byte("000000000000")[:12-len(strconv.FormatInt(seq, 10))]...)
	dst = strconv.AppendInt(dst, seq, 10)
	dst = append(dst, `","seq":`...)
	dst = strconv.AppendInt(dst, seq, 10)
	dst = append(dst, `,"from_session":"`+rawSender+`","to_session":"`+rawSession+`","kind":"bench",`...)
	dst = append(dst, `"payload":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx","created_at":"2026-12-01T21:40:32.123456Z"}`...)
	return dst
}

func benchClient(b *testing.B, h *rawHub, cfg Config) *Client {
	b.Helper()
	cfg.HubURL, cfg.APIKey, cfg.Surface = h.url, "key", "headless_cc"
	cfg.PingInterval = -1
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// BenchmarkClientSend is one Client.Send, answered pushed_to_ws with the
// recipient's instance named: the request's encoding, the HTTP round trip,
// the answer's decoding and the holder routing, with a 60-byte string
// payload as the fleet sends.
func BenchmarkClientSend(b *testing.B) {
	h := newRawHub(b)
	c := benchClient(b, h, Config{OnSignal: func(Signal) {}})
	payload := "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
	ctx := context.Background()
	b.ReportAllocs()
	cpu := startCPU(b)
	for b.Loop() {
		res, err := c.Send(ctx, "r-1764625232123456789-8", "bench", payload)
		if err != nil {
			b.Fatal(err)
		}
		if res.Delivery != "pushed_to_ws" {
			b.Fatalf("delivery %q, want pushed_to_ws", res.Delivery)
		}
	}
	cpu.report()
}

// BenchmarkClientReceive is one signal received on the WebSocket: the
// frame's read and decoding, the sequencer, OnSignal and the paced acks.
// The hub stand-in writes the frames as fast as the socket takes them.
func BenchmarkClientReceive(b *testing.B) {
	h := newRawHub(b)
	var (
		mu      sync.Mutex
		got     int64
		want    int64
		reached = make(chan struct{}, 1)
	)
	c := benchClient(b, h, Config{OnSignal: func(s Signal) {
		mu.Lock()
		got = s.Seq
		done := got == want
		mu.Unlock()
		if done {
			reached <- struct{}{}
		}
	}})
	defer c.Close()
	var conn net.Conn
	select {
	case conn = <-h.ws:
	case <-time.After(10 * time.Second):
		b.Fatal("no WebSocket attached")
	}
	w := &h.w
	var frame []byte
	var seq int64
	push := func(n int) {
		mu.Lock()
		want = seq + int64(n)
		mu.Unlock()
		for range n {
			seq++
			frame = rawSignalFrame(frame[:0], seq)
			if err := w.write(conn, 0x1, frame); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-reached:
		case <-time.After(30 * time.Second):
			mu.Lock()
			defer mu.Unlock()
			b.Fatalf("OnSignal reached seq %d of %d", got, want)
		}
	}
	push(100) // warm up
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU(b)
	push(b.N)
	b.StopTimer()
	cpu.report()
}

// benchCPU reports the process's CPU time per op (cpu-ns/op): the
// client's and the stand-in hub's, which is the same before and after a
// change of the client. On a machine shared with other work it moves far
// less than ns/op, which is the wall time of a round trip.
type benchCPU struct {
	b     *testing.B
	start time.Duration
}

func startCPU(b *testing.B) benchCPU { return benchCPU{b: b, start: processCPU()} }

func (c benchCPU) report() {
	if end := processCPU(); end > 0 && c.b.N > 0 {
		c.b.ReportMetric(float64(end-c.start)/float64(c.b.N), "cpu-ns/op")
	}
}
