package bootstrap

import "time"

// Default reconnect backoff, used when Config leaves the knobs at zero.
const (
	defaultReconnectBaseDelay       = 250 * time.Millisecond
	defaultReconnectMaxDelay        = 15 * time.Second
	defaultReconnectRestartMaxDelay = 4 * time.Second
)

// backoff is exponential backoff with full jitter: the wait before attempt n
// (counting from 0) is uniform in [0, min(max, base·2ⁿ)). Full jitter spreads
// the clients of a restarted hub over the whole window instead of letting them
// reconnect in waves. A backoff is a value; it is safe for concurrent use when
// int63n is.
type backoff struct {
	base, max time.Duration
	// int63n returns a uniform number in [0, n) for n > 0 (rand.Int64N);
	// injected so tests check growth and cap without timing.
	int63n func(n int64) int64
}

// ceiling is the upper bound of the wait before attempt n: base·2ⁿ, capped at max.
func (b backoff) ceiling(attempt int) time.Duration {
	d := b.base
	for i := 0; i < attempt && d < b.max; i++ {
		d *= 2 // d < max here, and max is far below overflow
	}
	return min(d, b.max)
}

// delay is the wait before attempt n: uniform in [0, ceiling(n)).
func (b backoff) delay(attempt int) time.Duration {
	c := b.ceiling(attempt)
	if c <= 0 {
		return 0
	}
	return time.Duration(b.int63n(int64(c)))
}

// capped is b with its ceiling capped at most max.
func (b backoff) capped(max time.Duration) backoff {
	b.max = min(b.max, max)
	return b
}
