package conns

import "github.com/marconihub/marconi/sessionstore"

// A store whose data went back in time (sessionstore.Historian: an
// asynchronous standby promoted, a restore) may have lost the last signals
// a connection wrote, and gives their seqs to the next signals of the same
// recipients. A connection that kept its cursor (last) would take those for
// signals it wrote and skip them, and the sweep would find nothing past
// it; an ack of the lost ones would acknowledge the new ones unseen. So
// each connection remembers the history it was last caught up under: when
// the store's moves (FollowHistory), its writer forgets its cursor and
// catches up from the session's acknowledged seq, writing again what is
// still unacknowledged (clients deduplicate by id), and the store refuses
// its acks read before that (sessionstore.ErrHistoryChanged) until the
// writer has caught up. From then on an ack counts only for what the
// connection has written since (capAck).

// historyToken is the store's history with its token (the welcome's and the
// history frame's), 0 and "" when the store keeps none.
func (h *Hub) historyToken() (uint64, string) {
	if s, ok := h.store.(sessionstore.Historian); ok {
		return s.HistoryToken()
	}
	return 0, ""
}

// FollowHistory asks every connection attached here that was caught up
// under an earlier history than the store's to catch up again. It is cheap
// when nothing changed (one atomic read each of the store's and the hub's
// history); the hub runs it beside the expiry check.
func (h *Hub) FollowHistory() {
	now, _ := h.historyToken()
	if now == 0 || h.followed.Swap(now) == now {
		return
	}
	n := 0
	for _, c := range h.registry.all() {
		if c.history.Load() != now && !c.closing() {
			c.rewind.Store(now)
			c.wake()
			n++
		}
	}
	if n > 0 {
		h.metrics.rewinds.Add(float64(n))
		h.log.Warn("the store's history changed (a standby promoted, a restore): every WebSocket here writes its session's unacknowledged signals again",
			"connections", n, "history", now)
	}
}

// takeRewind makes the writer forget its cursor when FollowHistory asked:
// the next catch-up reads from the session's acknowledged seq. It reports
// whether it did, with the token of the history it catches up under, which
// the writer tells the client first (a history frame): the store's now,
// which is at least the one FollowHistory asked for (should it have moved
// again, FollowHistory asks once more, and the client is told again). The
// history is stored last: an ack read under it sees the cursor reset
// (capAck).
func (c *Conn) takeRewind() (token string, ok bool) {
	if c.rewind.Swap(0) == 0 {
		return "", false
	}
	n, token := c.h.historyToken()
	c.last = 0
	c.written.Store(0)
	c.rewound.Store(true)
	c.history.Store(n)
	return token, true
}

// capAck is the seq an ack of upTo from the client acknowledges: all of it,
// unless the connection was caught up again since a history change, when
// it is at most what the connection has written since.
func (c *Conn) capAck(upTo int64) int64 {
	if c.rewound.Load() {
		return min(upTo, c.written.Load())
	}
	return upTo
}
