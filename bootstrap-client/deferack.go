package bootstrap

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"github.com/coder/websocket"
)

// heldSignals remembers, with Config.DeferAck, which registration (epoch)
// each signal handed to OnSignal belongs to, until the application
// acknowledges it: an ack must never reach a later registration, whose seq
// numbering starts afresh. It holds at most what the application holds. It
// is safe for concurrent use.
type heldSignals struct {
	mu   sync.Mutex
	byID map[string]seqMark
}

// hold records s as handed to the application under registration epoch.
func (h *heldSignals) hold(epoch uint64, s Signal) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byID == nil {
		h.byID = make(map[string]seqMark)
	}
	h.byID[s.ID] = seqMark{epoch: epoch, seq: s.Seq}
}

// release forgets the signal id and every held signal an ack of it covers
// (its registration's, up to its seq) or makes pointless (an older
// registration's), and returns its mark; false when id is not held.
func (h *heldSignals) release(id string) (seqMark, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m, ok := h.byID[id]
	if !ok {
		return seqMark{}, false
	}
	for k, o := range h.byID {
		if o.epoch < m.epoch || (o.epoch == m.epoch && o.seq <= m.seq) {
			delete(h.byID, k)
		}
	}
	return m, true
}

// Ack acknowledges s, and with it every earlier signal of the session, when
// Config.DeferAck leaves acknowledging to the application: the hub never
// delivers them again. A signal already acknowledged, never handed to
// OnSignal, or of a registration that is gone (the hub registered the session
// again since) is ignored. The ack goes on the WebSocket when attached, else
// over HTTP; an error leaves the signals to come again to the session's next
// client.
func (c *Client) Ack(ctx context.Context, s Signal) error {
	if c.ctx.Err() != nil {
		return errClosed
	}
	m, ok := c.held.release(s.ID)
	if !ok {
		return nil
	}
	c.mu.Lock()
	conn, current := c.conn, c.epoch
	c.mu.Unlock()
	if m.epoch != current {
		return nil // the registration these signals belonged to is gone
	}
	if conn != nil {
		frame, _ := json.Marshal(ackRequest{Type: "ack", UpToSeq: m.seq})
		if err := conn.Write(ctx, websocket.MessageText, frame); err == nil {
			return nil
		}
	}
	if _, err := c.sessionCall(ctx, http.MethodPost, "/v1/signals/ack", ackRequest{UpToSeq: m.seq}, nil); err != nil {
		return fmt.Errorf("bootstrap: ack up to seq %d: %w", m.seq, err)
	}
	return nil
}
