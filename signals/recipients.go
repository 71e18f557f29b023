package signals

import (
	"sync"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// recipients keeps recently read recipients so that a send to one of them
// classifies its route without reading the store first. An entry is used
// for at most maxAge after its read, and the append checks that the
// recipient is still what the entry says (sessionstore.NewSignal.Seen):
// the registration and the queue are always current; only the proof of
// life may be up to maxAge old (docs/delivery.md). At most max entries are
// kept. It is safe for concurrent use.
type recipients struct {
	maxAge time.Duration // <= 0: nothing is kept
	max    int

	mu sync.Mutex
	m  map[sessionstore.Key]recipientEntry
}

type recipientEntry struct {
	sess sessionstore.Session
	seen *sessionstore.RecipientSeen // sess's, made once for all its sends
	read time.Time
}

func newRecipients(maxAge time.Duration, max int) *recipients {
	return &recipients{maxAge: maxAge, max: max, m: make(map[sessionstore.Key]recipientEntry)}
}

// get returns k's session as read less than maxAge before now, and what it
// showed of itself as a recipient (shared: never changed).
func (r *recipients) get(k sessionstore.Key, now time.Time) (sessionstore.Session, *sessionstore.RecipientSeen, bool) {
	if r.maxAge <= 0 {
		return sessionstore.Session{}, nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.m[k]
	if !ok || now.Sub(e.read) >= r.maxAge || now.Before(e.read) {
		return sessionstore.Session{}, nil, false
	}
	return e.sess, e.seen, true
}

// put keeps sess, read at read. When full it forgets another entry first.
func (r *recipients) put(sess sessionstore.Session, read time.Time) {
	if r.maxAge <= 0 || r.max <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[sess.Key]; !ok && len(r.m) >= r.max {
		for k := range r.m { // an arbitrary one
			delete(r.m, k)
			break
		}
	}
	r.m[sess.Key] = recipientEntry{sess: sess, seen: sessionstore.SeenOf(sess), read: read}
}

// drop forgets k.
func (r *recipients) drop(k sessionstore.Key) {
	if r.maxAge <= 0 {
		return
	}
	r.mu.Lock()
	delete(r.m, k)
	r.mu.Unlock()
}
