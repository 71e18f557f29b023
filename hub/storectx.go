package hub

import (
	"context"
	"sync"
	"time"
)

// storeContext is the request's context with the store deadline: what
// context.WithDeadline(parent, deadline) gives, made only when a store call
// asks for its Done channel. An in-memory store never does, and a request
// then costs no timer, no channel and no place among the request context's
// children. Safe for concurrent use.
type storeContext struct {
	parent   context.Context
	deadline time.Time
	// state is the request's, answered to Value(requestStateKey{}); nil
	// when the context is not a request's.
	state *requestState

	mu       sync.Mutex
	inner    context.Context // the WithDeadline context, once Done is asked for
	cancel   context.CancelFunc
	released bool // the handler has returned: Err is Canceled from now on
}

func newStoreContext(parent context.Context, timeout time.Duration) *storeContext {
	return &storeContext{parent: parent, deadline: time.Now().Add(timeout)}
}

// Deadline is the earlier of the store deadline and the parent's.
func (c *storeContext) Deadline() (time.Time, bool) {
	c.mu.Lock()
	own := c.deadline
	c.mu.Unlock()
	if d, ok := c.parent.Deadline(); ok && d.Before(own) {
		return d, true
	}
	return own, true
}

// rearm moves the deadline to timeout from now and reports whether it
// could: not once a store call has asked for Done, nor once released.
func (c *storeContext) rearm(timeout time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner != nil || c.released {
		return false
	}
	c.deadline = time.Now().Add(timeout)
	return true
}

// Done makes the WithDeadline context, once, and returns its channel.
func (c *storeContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner == nil {
		c.inner, c.cancel = context.WithDeadline(c.parent, c.deadline)
		if c.released {
			c.cancel()
		}
	}
	return c.inner.Done()
}

// Err is the WithDeadline context's, once made; before that, the parent's
// error, DeadlineExceeded past the deadline, or Canceled once released.
func (c *storeContext) Err() error {
	c.mu.Lock()
	inner, released, deadline := c.inner, c.released, c.deadline
	c.mu.Unlock()
	switch {
	case inner != nil:
		return inner.Err()
	case c.parent.Err() != nil:
		return c.parent.Err()
	case !time.Now().Before(deadline):
		return context.DeadlineExceeded
	case released:
		return context.Canceled
	}
	return nil
}

// AfterFunc runs f once c is done, as context.AfterFunc does. The context
// package uses it to tie a context derived from c (a store's own query
// timeout) to c; without it, each derived context would cost a goroutine
// watching c's Done.
func (c *storeContext) AfterFunc(f func()) (stop func() bool) {
	c.Done() // makes inner
	c.mu.Lock()
	inner := c.inner
	c.mu.Unlock()
	return context.AfterFunc(inner, f)
}

// Value is the request's state for requestStateKey{}, otherwise the
// parent's.
func (c *storeContext) Value(key any) any {
	if _, ok := key.(requestStateKey); ok && c.state != nil {
		return c.state
	}
	return c.parent.Value(key)
}

// release is the CancelFunc's part: it stops the timer, if one was made.
func (c *storeContext) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released = true
	if c.cancel != nil {
		c.cancel()
	}
}
