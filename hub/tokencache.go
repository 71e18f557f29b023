package hub

import (
	"sync"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// tokenCache remembers, for sends only, the session a token authenticated,
// for at most ttl, so that a steady sender costs no token lookup. It never
// authorises on its own: a send served from it carries the token's hash to
// the store, which stores nothing unless a live session still holds that
// hash (sessionstore.NewSignal.SenderTokenHash), so a token rotated, deleted
// or expired on any instance can never send; the hub answers 410 and drops
// the entry. docs/delivery.md tells the whole story. The cached session only
// feeds what is decided before the store is asked (rate limit, self-heal
// gates), where a few seconds of age do not matter.
//
// It holds at most max entries; when full, an arbitrary one goes. It is safe
// for concurrent use.
type tokenCache struct {
	max int
	ttl time.Duration

	mu sync.Mutex
	m  map[[32]byte]tokenEntry
}

// tokenEntry is one cached session. sess is never changed once stored
// (touched stores a changed copy), so get hands out the pointer itself and
// a send copies no session.
type tokenEntry struct {
	sess     *sessionstore.Session
	loadedAt time.Time
}

// newTokenCache returns a cache of max entries (nil, caching nothing, when
// max < 1).
func newTokenCache(max int, ttl time.Duration) *tokenCache {
	if max < 1 {
		return nil
	}
	return &tokenCache{max: max, ttl: ttl, m: make(map[[32]byte]tokenEntry)}
}

// get returns the session cached for hash h, if it is younger than ttl and
// not expired at now.
func (c *tokenCache) get(h [32]byte, now time.Time) (*sessionstore.Session, bool) {
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[h]
	if !ok || now.Sub(e.loadedAt) >= c.ttl || now.Sub(e.loadedAt) < 0 || e.sess.ExpiresAt.Before(now) {
		return nil, false
	}
	return e.sess, true
}

// put caches sess, loaded at now, under hash h.
func (c *tokenCache) put(h [32]byte, sess *sessionstore.Session, now time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[h]; !ok && len(c.m) >= c.max {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[h] = tokenEntry{sess: sess, loadedAt: now}
}

// touched records a proof-of-life write of the session cached under h, so
// that the next sends see it and do not write it again.
func (c *tokenCache) touched(h [32]byte, t sessionstore.Touch) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[h]; ok {
		sess := *e.sess
		sess.LastVerbAt = later(sess.LastVerbAt, t.VerbAt)
		sess.ExpiresAt = later(sess.ExpiresAt, t.ExpiresAt)
		e.sess = &sess
		c.m[h] = e
	}
}

// drop forgets hash h (a token this instance rotated or deleted, or one the
// store refused).
func (c *tokenCache) drop(h []byte) {
	if c == nil || len(h) != 32 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, [32]byte(h))
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
