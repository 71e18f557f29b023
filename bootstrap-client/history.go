package bootstrap

import (
	"errors"
	"net/url"
	"strconv"

	"github.com/marconihub/marconi"
)

// The hub's store may go back in time: a standby replicated asynchronously,
// once promoted, lacks the primary's last commits, and the signals it lost
// give their seqs to the next ones. The hub names the store's history (an
// opaque token) in the welcome, in a history frame before it writes the
// unacknowledged signals again, and in every HTTP answer that hands signals
// (drain, and the pending of send and heartbeat answers). The client keeps
// the token its delivered seqs came under: a drain sends it with its
// after_seq, and the hub, on another history, answers from the
// acknowledged seq instead (history_changed), so that the seqs taken again
// are not skipped; an HTTP ack sends it, and the hub refuses one under
// another history (409 history_changed) rather than acknowledge signals
// that took those seqs since, unseen. Under a new history the dispatcher
// deduplicates by id alone: a seq it delivered may name another signal now.

// newHistory starts delivering under d's history, another than the one the
// dispatcher delivered under: seqs delivered before may name other signals
// now, so only ids deduplicate, and drains start from the acknowledged seq
// (seq 0) under the new history until signals of it are delivered. The
// dispatcher calls it.
func (c *Client) newHistory(seq *sequencer, d delivery) {
	seq.rebase()
	c.mu.Lock()
	c.highest = seqMark{epoch: d.epoch, history: d.history}
	c.mu.Unlock()
	c.log.Warn("marconi: the hub's store moved to another history (a standby promoted): its seqs may name other signals now; deduplicating by id",
		"history", d.history)
}

// pageThrough records that the page d (a drain, a pending list) covered
// every pending signal up to its through: a drain asks after it, even when
// the page's last signals were not delivered (delivered before under
// another history, deduplicated by id). The dispatcher calls it.
func (c *Client) pageThrough(d delivery) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h := &c.highest; h.epoch == d.epoch && h.history == d.history && d.through > h.seq {
		h.seq = d.through
	}
}

// drainPath is the drain's request after m: a new registration's signals
// start from 1 again (after 0, no history), and the history m's seqs came
// under goes with them.
func (c *Client) drainPath() string {
	m := c.drainAfter()
	path := "/v1/signals?after_seq=" + strconv.FormatInt(m.seq, 10) + "&limit=" + strconv.Itoa(drainLimit)
	if m.history != "" {
		path += "&history=" + url.QueryEscape(m.history)
	}
	return path
}

// drained is the delivery of a drain's answer under registration epoch.
// A page under another history than the client's is delivered even when
// empty: the client adopts the history and drains after its
// next_after_seq.
func drained(res drainResponse, epoch uint64) delivery {
	return delivery{signals: res.Signals, epoch: epoch, history: res.History, page: true, through: res.NextAfterSeq}
}

// pendingPage is the delivery of the pending signals of a send or
// heartbeat answer: a page from the acknowledged seq.
func pendingPage(pending []Signal, history string, epoch uint64) delivery {
	d := delivery{signals: pending, epoch: epoch, history: history, page: true}
	if len(pending) > 0 {
		d.through = pending[len(pending)-1].Seq
	}
	return d
}

// historyChanged reports whether err is the hub's refusal of an ack made
// under another history of its store than the current one.
func historyChanged(err error) bool {
	var he *Error
	return errors.As(err, &he) && he.Code == marconi.CodeHistoryChanged
}

// logAckError logs a failed ack of m: a warning, except for an ack the hub
// refused because its store moved to another history since the signals
// came, which is expected after a failover: nothing was acknowledged, and
// the signals come again (the next drain, under the old history, is
// answered from the acknowledged seq).
func (c *Client) logAckError(err error, m seqMark, msg string) {
	switch {
	case err == nil || c.ctx.Err() != nil:
	case historyChanged(err):
		c.log.Info("marconi: ack refused: the hub's store moved to another history since these signals came; they come again",
			"up_to_seq", m.seq, "history", m.history)
	default:
		c.log.Warn(msg, "up_to_seq", m.seq, "err", err)
	}
}
