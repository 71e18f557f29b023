package hub

import (
	"sync"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// sendLimiter is the per-session send limit: a token bucket of rate tokens a
// second with a burst of twice that. Buckets that have refilled are
// forgotten, so memory stays bounded by the sessions sending right now.
// It is safe for concurrent use.
type sendLimiter struct {
	rate  float64
	burst float64
	now   func() time.Time

	mu      sync.Mutex
	buckets map[sessionstore.Key]*sendBucket
}

type sendBucket struct {
	tokens float64
	at     time.Time
}

func newSendLimiter(rate float64, now func() time.Time) *sendLimiter {
	return &sendLimiter{rate: rate, burst: 2 * rate, now: now, buckets: make(map[sessionstore.Key]*sendBucket)}
}

// allow spends a token of k's bucket and reports whether one was there.
func (l *sendLimiter) allow(k sessionstore.Key) bool {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[k]
	if !ok {
		b = &sendBucket{tokens: l.burst, at: now}
		l.buckets[k] = b
	}
	b.tokens = min(l.burst, b.tokens+now.Sub(b.at).Seconds()*l.rate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// sweep forgets every bucket that has refilled to its burst.
func (l *sendLimiter) sweep() {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, b := range l.buckets {
		if b.tokens+now.Sub(b.at).Seconds()*l.rate >= l.burst {
			delete(l.buckets, k)
		}
	}
}

// len is the number of buckets held (for tests).
func (l *sendLimiter) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}
