package bootstrap

import (
	"context"
	"sync"
	"time"
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

// hold records the signal id as handed to the application at m (its
// registration, seq and store history).
func (h *heldSignals) hold(id string, m seqMark) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byID == nil {
		h.byID = make(map[string]seqMark)
	}
	h.byID[id] = m
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

// deferredAcks paces Client.Ack as Config.AckInterval paces the acks the
// client sends by itself: an application that acknowledges each signal as
// it finishes it, faster than the hub lets a connection send frames
// (MARCONI_WS_FRAMES_PER_SECOND), must not be cut off for it. An Ack within
// the interval of the last one is held here, folded into any later one, and
// sent by the dispatcher once the interval has passed (or at Close).
type deferredAcks struct {
	mu      sync.Mutex
	last    time.Time // when the last ack was sent
	pending seqMark   // the newest ack held back; zero when none is
	armed   bool      // the dispatcher has been asked to send pending
}

// hold decides for an ack of m at now: true when it may be sent at once
// (recorded as the last ack sent), false when it is held for the
// dispatcher, and then whether the dispatcher must be told (first held).
func (d *deferredAcks) hold(m seqMark, now time.Time, interval time.Duration) (sendNow, tell bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.armed && now.Sub(d.last) >= interval {
		d.last = now
		return true, false
	}
	// A mark of another store history than the held one replaces it: an
	// ack of the held one would be refused (history.go).
	if m.epoch > d.pending.epoch || (m.epoch == d.pending.epoch && (m.seq > d.pending.seq || m.history != d.pending.history)) {
		d.pending = m
	}
	tell = !d.armed
	d.armed = true
	return false, tell
}

// wait is how long the held ack has yet to wait at now.
func (d *deferredAcks) wait(now time.Time, interval time.Duration) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return interval - now.Sub(d.last)
}

// take returns the held ack, if any, and records it as sent at now.
func (d *deferredAcks) take(now time.Time) (seqMark, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m, ok := d.pending, d.armed
	d.pending, d.armed = seqMark{}, false
	if ok {
		d.last = now
	}
	return m, ok && m.seq > 0
}

// Ack acknowledges s, and with it every earlier signal of the session, when
// Config.DeferAck leaves acknowledging to the application: the hub never
// delivers them again. A signal already acknowledged, never handed to
// OnSignal, or of a registration that is gone (the hub registered the session
// again since) is ignored. The ack goes on the WebSocket when attached, else
// over HTTP; an error acknowledged nothing: Ack of s again tries again, and
// the signals come again to the session's next client otherwise.
//
// Acks are paced by Config.AckInterval, as the client's own are: an Ack at
// least that long after the last one is sent at once and its error
// returned; one sooner is held, folded into any later Ack, and sent once the
// interval has passed, or by Close; Ack then returns nil and a failure to
// send it is logged (the signals come again). An ack the hub refuses
// because its store moved to another history since the signal came
// (history_changed, after a failover) acknowledges nothing and is dropped:
// Ack returns nil and logs it, and the signals come again.
func (c *Client) Ack(ctx context.Context, s Signal) error {
	if c.ctx.Err() != nil {
		return errClosed
	}
	m, ok := c.held.release(s.ID)
	if !ok {
		return nil
	}
	c.mu.Lock()
	current := c.epoch
	c.mu.Unlock()
	if m.epoch != current {
		return nil // the registration these signals belonged to is gone
	}
	sendNow, tell := c.deferred.hold(m, time.Now(), c.cfg.AckInterval)
	if !sendNow {
		if tell {
			select {
			case c.deferredAck <- struct{}{}:
			default: // cap 1: the dispatcher has been told already
			}
		}
		return nil
	}
	_, err := c.writeAck(ctx, nil, m)
	switch {
	case historyChanged(err):
		c.logAckError(err, m, "")
		return nil
	case err != nil:
		// Nothing was acknowledged: s stays held, so that Ack of it again
		// sends it (the signals it covers are covered again).
		c.held.hold(s.ID, m)
	}
	return err
}

// sendDeferredAck sends the ack that the pacing of Client.Ack holds back,
// if any: from the dispatcher once the interval has passed, and at Close.
func (c *Client) sendDeferredAck(ctx context.Context) {
	m, ok := c.deferred.take(time.Now())
	if !ok {
		return
	}
	_, err := c.writeAck(ctx, nil, m)
	c.logAckError(err, m, "marconi: held-back ack failed; the signals will come again")
}
