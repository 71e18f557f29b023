// Package ratelimit is the token bucket per key that the hub's rate quotas
// share: sends per session (hub) and registrations per API key (sessions).
package ratelimit

import (
	"sync"
	"time"
)

// Limiter is a token bucket per key: rate tokens a second with a burst of
// twice that. Buckets that have refilled are forgotten by Sweep, so memory
// stays bounded by the keys active right now. It is safe for concurrent use.
type Limiter[K comparable] struct {
	rate  float64
	burst float64
	now   func() time.Time

	mu      sync.Mutex
	buckets map[K]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// New returns a Limiter of rate tokens a second per key, burst twice it,
// reading the time from now.
func New[K comparable](rate float64, now func() time.Time) *Limiter[K] {
	return &Limiter[K]{rate: rate, burst: 2 * rate, now: now, buckets: make(map[K]*bucket)}
}

// Allow spends a token of k's bucket and reports whether one was there.
func (l *Limiter[K]) Allow(k K) bool {
	ok, _ := l.Take(k)
	return ok
}

// Take spends a token of k's bucket; when there is none it reports how long
// until one refills.
func (l *Limiter[K]) Take(k K) (bool, time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[k]
	if !ok {
		b = &bucket{tokens: l.burst, at: now}
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

// Sweep forgets every bucket that has refilled to its burst.
func (l *Limiter[K]) Sweep() {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, b := range l.buckets {
		if b.tokens+now.Sub(b.at).Seconds()*l.rate >= l.burst {
			delete(l.buckets, k)
		}
	}
}

// Len is the number of buckets held.
func (l *Limiter[K]) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}
