package testwait_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/testwait"
)

// recorder is a testing.TB that keeps a failure instead of ending the test.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

// TestForReturnsOnceTheConditionHolds: a condition that holds on the third
// poll is polled three times, and the test goes on.
func TestForReturnsOnceTheConditionHolds(t *testing.T) {
	r := &recorder{TB: t}
	polls := 0
	testwait.For(r, "the third poll", time.Minute, func() bool { polls++; return polls == 3 })
	if r.failed != "" || polls != 3 {
		t.Fatalf("failed %q after %d polls; want no failure after 3", r.failed, polls)
	}
}

// TestForFailsNamingWhatItWaitedFor: a condition that never holds fails
// the test after the deadline, naming what it waited for.
func TestForFailsNamingWhatItWaitedFor(t *testing.T) {
	r := &recorder{TB: t}
	took := testwait.For(r, "a condition that never holds", 20*time.Millisecond, func() bool { return false })
	if took < 20*time.Millisecond || !strings.Contains(r.failed, "waiting for a condition that never holds") || strings.Contains(r.failed, "not yet") {
		t.Fatalf("after %v: %q; want a failure after the deadline naming what it waited for", took, r.failed)
	}
}

// TestForNilFailsWithTheLastError: ForNil's failure carries the condition's
// last error; a condition that succeeds at once is polled once.
func TestForNilFailsWithTheLastError(t *testing.T) {
	r := &recorder{TB: t}
	n := 0
	testwait.ForNil(r, "a store", 10*time.Millisecond, func() error { n++; return fmt.Errorf("attempt %d: %w", n, errors.ErrUnsupported) })
	if want := fmt.Sprintf("attempt %d", n); !strings.Contains(r.failed, "waiting for a store: "+want) {
		t.Fatalf("failure %q; want it to end with the last error, %q", r.failed, want)
	}
	r, n = &recorder{TB: t}, 0
	testwait.ForNil(r, "at once", time.Minute, func() error { n++; return nil })
	if r.failed != "" || n != 1 {
		t.Fatalf("a condition met at once: failed %q after %d polls", r.failed, n)
	}
}

// TestReceive: a value sent is received; none within the deadline fails
// the test, naming what it waited for.
func TestReceive(t *testing.T) {
	r := &recorder{TB: t}
	ch := make(chan int, 1)
	ch <- 7
	if v := testwait.Receive(r, "a value", time.Minute, ch); v != 7 || r.failed != "" {
		t.Fatalf("received %d, failed %q; want 7 and no failure", v, r.failed)
	}
	testwait.Receive(r, "a value never sent", 10*time.Millisecond, ch)
	if !strings.Contains(r.failed, "waiting for a value never sent") {
		t.Fatalf("failure %q; want one naming what it waited for", r.failed)
	}
}
