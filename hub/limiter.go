package hub

import (
	"sync"
	"time"

	"github.com/marconihub/marconi/internal/ratelimit"
	"github.com/marconihub/marconi/sessionstore"
)

// sendLimiter is the per-session send limit.
type sendLimiter = ratelimit.Limiter[sessionstore.Key]

func newSendLimiter(rate float64, now func() time.Time) *sendLimiter {
	return ratelimit.New[sessionstore.Key](rate, now)
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
