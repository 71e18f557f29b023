package mcpbridge

import (
	"sync"

	"github.com/marconihub/marconi/bootstrap-client"
)

// inbox holds the signals the client handed over until a tool answer has
// returned them to the host and been written: at most size of them, in the
// order they arrived (seq order per registration). A signal is unread, then
// in flight (returned by an answer not yet written), then committed and
// acknowledged. It is safe for concurrent use.
type inbox struct {
	size int

	mu      sync.Mutex
	items   []item        // unread and in flight, in arrival order
	done    []item        // committed, not yet covered by an ack
	arrival uint64        // arrival number of the last item added
	last    int64         // seq of the last item added
	reads   uint64        // token of the last take
	changed chan struct{} // closed and replaced when items change
	closed  bool
}

// item is one signal in the inbox: its arrival number orders it, and read is
// the token of the take that returned it (0 while unread).
type item struct {
	sig  bootstrap.Signal
	n    uint64
	read uint64
}

func newInbox(size int) *inbox {
	return &inbox{size: size, changed: make(chan struct{})}
}

// signalChange wakes every waiter. The caller holds mu.
func (b *inbox) signalChange() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// add appends s, waiting while the inbox is full; false when the inbox was
// closed first (s stays unacknowledged on the hub and comes again).
func (b *inbox) add(s bootstrap.Signal) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.items) >= b.size {
		if b.closed {
			return false
		}
		ch := b.changed
		b.mu.Unlock()
		<-ch
		b.mu.Lock()
	}
	if b.closed {
		return false
	}
	b.arrival++
	b.last = s.Seq
	b.items = append(b.items, item{sig: s, n: b.arrival})
	b.signalChange()
	return true
}

// close wakes every waiter for good: add refuses from now on.
func (b *inbox) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		b.signalChange()
	}
}

// take returns up to max unread signals, oldest first, marked in flight
// under a new token for commit or abandon, and whether unread ones remain.
// With none unread it returns token 0.
func (b *inbox) take(max int) (sigs []bootstrap.Signal, token uint64, more bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.items {
		if b.items[i].read != 0 {
			continue
		}
		if len(sigs) == max {
			return sigs, token, true
		}
		if token == 0 {
			b.reads++
			token = b.reads
		}
		b.items[i].read = token
		sigs = append(sigs, b.items[i].sig)
	}
	return sigs, token, false
}

// unread returns the signals not yet returned, oldest first.
func (b *inbox) unread() []bootstrap.Signal {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []bootstrap.Signal
	for _, it := range b.items {
		if it.read == 0 {
			out = append(out, it.sig)
		}
	}
	return out
}

// wait returns a channel closed at the next change of the inbox and whether
// a signal is unread now.
func (b *inbox) wait() (<-chan struct{}, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, it := range b.items {
		if it.read == 0 {
			return b.changed, true
		}
	}
	return b.changed, false
}

// lastSeq is the seq of the signal added last, whether or not it is still
// held; 0 before the first.
func (b *inbox) lastSeq() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last
}

// commit records that the answer carrying token was written: its signals
// leave the inbox. It returns the signal up to which the hub may now be
// acknowledged (acks are cumulative: only a committed signal that arrived
// before every signal still held), false when there is none yet.
func (b *inbox) commit(token uint64) (bootstrap.Signal, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	kept := b.items[:0]
	for _, it := range b.items {
		if it.read == token {
			b.done = append(b.done, it)
		} else {
			kept = append(kept, it)
		}
	}
	clear(b.items[len(kept):])
	b.items = kept
	b.signalChange()
	floor := b.arrival + 1
	if len(b.items) > 0 {
		floor = b.items[0].n
	}
	best := -1
	for i, it := range b.done {
		if it.n < floor && (best < 0 || it.n > b.done[best].n) {
			best = i
		}
	}
	if best < 0 {
		return bootstrap.Signal{}, false
	}
	upTo := b.done[best]
	rest := b.done[:0]
	for _, it := range b.done {
		if it.n > upTo.n {
			rest = append(rest, it)
		}
	}
	b.done = rest
	return upTo.sig, true
}

// abandon returns the signals of token to unread: its answer never left.
func (b *inbox) abandon(token uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.items {
		if b.items[i].read == token {
			b.items[i].read = 0
		}
	}
	b.signalChange()
}
