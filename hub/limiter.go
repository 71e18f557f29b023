package hub

import (
	"time"

	"github.com/marconihub/marconi/internal/ratelimit"
	"github.com/marconihub/marconi/sessionstore"
)

// sendLimiter is the per-session send limit.
type sendLimiter = ratelimit.Limiter[sessionstore.Key]

func newSendLimiter(rate float64, now func() time.Time) *sendLimiter {
	return ratelimit.New[sessionstore.Key](rate, now)
}
