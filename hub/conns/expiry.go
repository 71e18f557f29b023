package conns

import (
	"context"
	"math"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// Expiry of an attached session. An attached session is kept alive by its
// own WebSocket: every pong to the hub's ping (PingInterval) and every
// client frame (at most one a TouchInterval) writes proof of life, which
// moves the row's expires_at to now + SessionTTL. With the defaults (a ping
// every 20 s, a TTL of an hour) an attached session whose client answers
// pings therefore expires only when those writes fail for a whole TTL (the
// store unreachable or refusing), when SessionTTL is configured shorter
// than the time between two pongs (up to twice PingInterval), or when the
// clocks of the instances disagree by about a TTL. Its WebSocket must then
// close (4410) as the session's calls already answer 410 everywhere.
//
// Each connection keeps the latest expiry this instance knows of its
// session (the attach's, its keepalive's touches, the heartbeats and other
// authenticated calls of its session served here, what a pending sweep or
// an expiry check read): a lower bound of the row's, since every store
// write of expires_at only moves it later. CloseExpired, run every
// ExpiryCheck by the hub, reads the rows of the connections whose known
// expiry has passed, a batch per store read (SessionHeads, as the sweep),
// and closes those with no live row; a row extended elsewhere (a call that
// reached another instance) extends the known expiry instead. The hub keeps the earliest
// known expiry of its connections, so a check finds nothing due without
// looking at any connection, and idle connections cost no timer and no
// goroutine for it.

// A check wake-up whose store read failed (the store unreachable) is not
// dropped: the connection is marked for a recheck, which the next expiry
// check reads with the connections due to expire, and again at each check
// until a read succeeds. The expiry check's interval is the pace of those
// retries while the store is down, not the writer.

// never is the known expiry of no connection: later than any.
const never = math.MaxInt64

// knowExpiry records that c's session lives at least until t, as a store
// write or read shows: the known expiry only moves later.
func (c *Conn) knowExpiry(t time.Time) {
	n := t.UnixNano()
	for {
		cur := c.expires.Load()
		if n <= cur || c.expires.CompareAndSwap(cur, n) {
			return
		}
	}
}

// SessionExtended records that sess (a row of its session that a write of
// this instance has just extended: a heartbeat's, or another authenticated
// call's proof of life) lives until sess.ExpiresAt:
// this instance's connection of that session, if any and of its
// incarnation, knows that expiry from then on, so the expiry check does not
// read its row again before it passes. A connection of another incarnation
// is left as it is: its own session's row is gone.
func (h *Hub) SessionExtended(sess sessionstore.Session) {
	if c := h.registry.get(sess.Key); c != nil && c.belongsTo(sess) {
		c.knowExpiry(sess.ExpiresAt)
	}
}

// dueBy makes sure the hub's next expiry check looks at its connections
// once t has passed.
func (h *Hub) dueBy(t int64) {
	for {
		cur := h.nextExpiry.Load()
		if t >= cur || h.nextExpiry.CompareAndSwap(cur, t) {
			return
		}
	}
}

// checkLater makes c's check, whose read failed, due at the next expiry
// check.
func (h *Hub) checkLater(c *Conn) {
	c.recheck.Store(true) // before dueBy: the check that dueBy calls for sees it
	h.dueBy(h.now().UnixNano())
}

// CloseExpired is one run of the expiry check: it closes with 4410 every
// connection here whose session the store shows expired, once the expiry
// known here has passed; a connection whose row is live knows its expiry
// from it, and is reconciled with it as the sweep does. The connections
// marked for a recheck are read and reconciled with the same reads. A
// failed read leaves the connections it was for, and those after them,
// due: the next run reads them again.
func (h *Hub) CloseExpired(ctx context.Context) {
	now := h.now()
	if now.UnixNano() < h.nextExpiry.Load() {
		return
	}
	due := h.expired(now)
	gone := func(c *Conn) Disconnect {
		if c.expires.Load() < now.UnixNano() {
			return DisconnectSessionExpired
		}
		return DisconnectSessionGone // a recheck: the row was deleted before the expiry known here
	}
	for len(due) > 0 {
		n := min(len(due), sweepBatch)
		rechecks := takeRechecks(due[:n])
		if _, _, err := h.reconcileRows(ctx, due[:n], now, gone); err != nil {
			for _, c := range rechecks {
				c.recheck.Store(true) // expired has made the next check due for them
			}
			if ctx.Err() == nil {
				h.log.Debug("expiry check", "connections", len(due), "err", err)
			}
			return
		}
		due = due[n:]
	}
}

// takeRechecks clears the recheck marks of cs and returns the connections
// that had one.
func takeRechecks(cs []*Conn) []*Conn {
	var taken []*Conn
	for _, c := range cs {
		if c.recheck.Swap(false) {
			taken = append(taken, c)
		}
	}
	return taken
}

// expired returns the connections whose known expiry is before now, or
// that are marked for a recheck, and sets the hub's next expiry check to the
// earliest known expiry, theirs included, or to now when one is marked
// (they are due until a read extends them or closes them).
func (h *Hub) expired(now time.Time) []*Conn {
	// Reset first: a connection that attaches, or is marked for a recheck,
	// during the scan lowers it again (start, checkLater), whether or not
	// the scan sees it.
	h.nextExpiry.Store(never)
	var due []*Conn
	earliest := int64(never)
	h.registry.each(func(c *Conn) {
		if c.closing() {
			return
		}
		exp, recheck := c.expires.Load(), c.recheck.Load()
		if exp < now.UnixNano() || recheck {
			due = append(due, c)
		}
		if recheck {
			exp = min(exp, now.UnixNano())
		}
		earliest = min(earliest, exp)
	})
	h.dueBy(earliest)
	return due
}
