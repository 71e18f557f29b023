package conns

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi"
)

// readLoop is the connection's one reader: acks and proof of life. Every
// frame the client sends spends the connection's frame budget, control
// frames too (controlFrame); a text frame must be UTF-8.
func (c *Conn) readLoop(ctx context.Context) error {
	// The library's reads get a context that never ends, so that a frame
	// read costs no watch of its own on ctx; this one watch, for the
	// connection's life, closes the connection when ctx ends, as the
	// library's would have (the reader then returns; c.err is already set
	// by whoever ended ctx).
	defer context.AfterFunc(ctx, func() { c.ws.CloseNow() })()
	lastTouch := c.attachedAt
	for {
		typ, bp, err := c.readFrame()
		if err != nil {
			return err
		}
		c.handleFrame(ctx, typ, *bp, &lastTouch)
		putReadBuf(bp)
	}
}

// readBufs holds the buffers client frames are read into: a frame read
// allocates none, and an idle connection holds none (a buffer is taken
// once a frame has begun to arrive). Buffers past maxPooledRead (a large
// frame's) are left to the GC rather than kept.
var readBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

const maxPooledRead = 4 << 10

func putReadBuf(bp *[]byte) {
	if cap(*bp) <= maxPooledRead {
		*bp = (*bp)[:0]
		readBufs.Put(bp)
	}
}

// readFrame reads the next data message whole into a pooled buffer, which
// the caller hands back with putReadBuf. The read limit is the library's
// (MARCONI_WS_READ_LIMIT_BYTES), as for Conn.Read.
func (c *Conn) readFrame() (websocket.MessageType, *[]byte, error) {
	typ, r, err := c.ws.Reader(context.Background())
	if err != nil {
		return 0, nil, err
	}
	bp := readBufs.Get().(*[]byte)
	b := (*bp)[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if errors.Is(err, io.EOF) {
			*bp = b
			return typ, bp, nil
		}
		if err != nil {
			*bp = b
			putReadBuf(bp)
			return 0, nil, err
		}
	}
}

// handleFrame handles one data message the client sent.
func (c *Conn) handleFrame(ctx context.Context, typ websocket.MessageType, data []byte, lastTouch *time.Time) {
	if c.budget.isRefused() {
		// The writer is closing the connection (1008 or 1007). Read on
		// (and discard) until the close handshake ends, as the writer's
		// Close expects; ending here would cancel the connection under
		// the writer and drop its close frame.
		return
	}
	now := c.h.now()
	if !c.takeFrame(now) {
		return
	}
	if typ == websocket.MessageText && !utf8.Valid(data) {
		c.refuse(DisconnectInvalidUTF8)
		return
	}
	if now.Sub(*lastTouch) >= c.h.cfg.TouchInterval {
		*lastTouch = now
		c.touchSeen(ctx, now)
	}
	f, err := decodeClientFrame(data)
	if err != nil {
		// A JSON object with a field of the wrong type is the field's
		// fault, as over HTTP; anything else is not JSON to us.
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
			c.sendError(marconi.CodeInvalidField, te.Field+" has the wrong type")
			return
		}
		c.sendError(marconi.CodeInvalidJSON, "frames must be JSON objects")
		return
	}
	switch f.Type {
	case marconi.FrameAck:
		if f.UpToSeq == nil || *f.UpToSeq < 0 {
			c.sendError(marconi.CodeInvalidField, "ack needs a non-negative up_to_seq")
			return
		}
		history := c.history.Load() // before capAck reads what a rewind reset
		c.acks.add(c.capAck(*f.UpToSeq), history)
	case marconi.FramePing:
		// Application-level keepalive: proof of life only.
	default:
		c.sendError(marconi.CodeInvalidField, "unknown frame type; want ack")
	}
}

// frameBudget is what a client may still send on its connection: a bucket
// of frames, and whether the connection was refused for what it sent. The
// reader spends it, and so do the library's control-frame callbacks, which
// run on whichever goroutine reads (the reader, or a Close waiting for the
// peer's close frame). It is safe for concurrent use.
type frameBudget struct {
	mu      sync.Mutex
	frames  bucket
	refused bool // the writer is closing the connection for what the client sent
}

// take spends a frame at rate a second; past the budget it marks the
// connection refused. It reports false past the budget and after a refusal,
// and overBudget true only for the frame that went past it.
func (b *frameBudget) take(now time.Time, rate float64) (ok, overBudget bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.refused:
		return false, false
	case !b.frames.take(now, rate):
		b.refused = true
		return false, true
	}
	return true, false
}

// refuse marks the connection refused.
func (b *frameBudget) refuse() {
	b.mu.Lock()
	b.refused = true
	b.mu.Unlock()
}

func (b *frameBudget) isRefused() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refused
}

// takeFrame spends the connection's frame budget for a frame the client
// sent. Past the budget it closes the connection (1008, quota
// frames_per_second) and reports false, as it does for every frame after a
// refusal.
func (c *Conn) takeFrame(now time.Time) bool {
	ok, over := c.budget.take(now, c.h.cfg.FramesPerSecond)
	if over {
		c.h.cfg.OnQuotaRefused(marconi.QuotaFramesPerSecond)
		c.kick(DisconnectFrameRate)
	}
	return ok
}

// controlFrame counts a ping or pong from the client against the frame
// budget; it reports whether a ping is answered. A connection refused for
// its rate answers none: a flood of pings costs the hub no writes.
func (c *Conn) controlFrame() bool {
	return c.takeFrame(c.h.now())
}

// refuse asks the writer to close the connection with d, and makes the
// reader discard what the client sends until the close handshake ends.
func (c *Conn) refuse(d Disconnect) {
	c.budget.refuse()
	c.kick(d)
}

// bucket is a token bucket of rate tokens a second and a burst of twice
// that. It is not safe for concurrent use: frameBudget guards it.
type bucket struct {
	tokens float64
	at     time.Time
}

// take spends a token and reports whether one was there.
func (b *bucket) take(now time.Time, rate float64) bool {
	b.tokens = min(2*rate, b.tokens+now.Sub(b.at).Seconds()*rate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// sendError hands an error frame to the writer without blocking.
func (c *Conn) sendError(code marconi.Code, message string) {
	b, err := json.Marshal(errorFrame{Type: marconi.FrameError, Code: code, Message: message})
	if err != nil {
		return
	}
	c.mu.Lock()
	if len(c.ctrl) >= maxCtrl {
		// A client flooding bad frames loses the replies, not the hub's memory.
		c.mu.Unlock()
		return
	}
	c.ctrl = append(c.ctrl, b)
	c.mu.Unlock()
	c.wake()
}

// maxCtrl bounds the error frames waiting for the writer.
const maxCtrl = 8

// takeCtrl takes the oldest error frame waiting for the writer, if any.
func (c *Conn) takeCtrl() ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.ctrl) == 0 {
		return nil, false
	}
	f := c.ctrl[0]
	c.ctrl[0] = nil
	c.ctrl = c.ctrl[1:]
	if len(c.ctrl) == 0 {
		c.ctrl = nil
	}
	return f, true
}
