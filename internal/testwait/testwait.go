// Package testwait is how a test waits for something that happens on its
// own: it polls a condition until it holds, and fails the test, naming what
// it waited for, once a deadline has passed (CONVENTIONS.md: poll with a
// deadline, never sleep to wait; after nats-server's checkFor). The pause
// between two polls starts at a millisecond and doubles to MaxPause, so a
// condition that holds at once is seen at once and a long wait costs few
// polls.
package testwait

import (
	"errors"
	"testing"
	"time"
)

// MaxPause is the longest pause between two polls.
const MaxPause = 50 * time.Millisecond

// errNotYet is what For's condition says while it does not hold.
var errNotYet = errors.New("not yet")

// For polls cond until it holds and returns how long that took. Once within
// has passed with cond false, it fails t (t.Fatalf) naming what.
func For(t testing.TB, what string, within time.Duration, cond func() bool) time.Duration {
	t.Helper()
	return ForNil(t, what, within, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

// ForNil polls cond until it returns nil and returns how long that took.
// Once within has passed with cond still failing, it fails t (t.Fatalf)
// naming what and cond's last error.
func ForNil(t testing.TB, what string, within time.Duration, cond func() error) time.Duration {
	t.Helper()
	start, pause := time.Now(), time.Millisecond
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if took := time.Since(start); took > within {
			if errors.Is(err, errNotYet) {
				t.Fatalf("timed out after %v waiting for %s", took.Round(time.Millisecond), what)
			} else {
				t.Fatalf("timed out after %v waiting for %s: %v", took.Round(time.Millisecond), what, err)
			}
			return took
		}
		time.Sleep(pause) // a pause between polls, not a wait for the event
		pause = min(2*pause, MaxPause)
	}
}

// Receive returns the next value from ch (its zero value once ch is
// closed). Once within has passed without one, it fails t (t.Fatalf)
// naming what.
func Receive[T any](t testing.TB, what string, within time.Duration, ch <-chan T) T {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("timed out after %v waiting for %s", within, what)
		var zero T
		return zero
	}
}
