package hub

import (
	"sync"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// rateLimiter is a token bucket per key: rate tokens a second with a burst
// of twice that. Buckets that have refilled are forgotten, so memory stays
// bounded by the keys active right now. It is safe for concurrent use.
type rateLimiter[K comparable] struct {
	rate  float64
	burst float64
	now   func() time.Time

	mu      sync.Mutex
	buckets map[K]*sendBucket
}

// sendLimiter is the per-session send limit.
type sendLimiter = rateLimiter[sessionstore.Key]

type sendBucket struct {
	tokens float64
	at     time.Time
}

func newRateLimiter[K comparable](rate float64, now func() time.Time) *rateLimiter[K] {
	return &rateLimiter[K]{rate: rate, burst: 2 * rate, now: now, buckets: make(map[K]*sendBucket)}
}

func newSendLimiter(rate float64, now func() time.Time) *sendLimiter {
	return newRateLimiter[sessionstore.Key](rate, now)
}

// allow spends a token of k's bucket and reports whether one was there.
func (l *rateLimiter[K]) allow(k K) bool {
	ok, _ := l.take(k)
	return ok
}

// take spends a token of k's bucket; when there is none it reports how long
// until one refills.
func (l *rateLimiter[K]) take(k K) (bool, time.Duration) {
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
		return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
	}
	b.tokens--
	return true, 0
}

// sweep forgets every bucket that has refilled to its burst.
func (l *rateLimiter[K]) sweep() {
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
func (l *rateLimiter[K]) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}

// pacer lets one event per key through per interval; the rest are to be
// answered without the work it paces. Keys whose interval has passed are
// forgotten by sweep, so memory stays bounded by the keys active within
// one interval. It is safe for concurrent use.
type pacer[K comparable] struct {
	every time.Duration

	mu   sync.Mutex
	last map[K]time.Time
}

func newPacer[K comparable](every time.Duration) *pacer[K] {
	return &pacer[K]{every: every, last: make(map[K]time.Time)}
}

// allow reports whether k's last event let through is an interval or more
// before now, and if so lets this one through.
func (p *pacer[K]) allow(k K, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if last, ok := p.last[k]; ok && now.Sub(last) < p.every {
		return false
	}
	p.last[k] = now
	return true
}

// sweep forgets the keys whose interval has passed.
func (p *pacer[K]) sweep(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, last := range p.last {
		if now.Sub(last) >= p.every {
			delete(p.last, k)
		}
	}
}
