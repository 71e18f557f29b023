package ratelimit

import (
	"testing"
	"time"
)

// An empty bucket says how long until its next token; a refilled one is
// forgotten by Sweep.
func TestTakeWaitAndSweep(t *testing.T) {
	now := time.Now()
	l := New[string](4, func() time.Time { return now })
	for range 8 {
		if ok, _ := l.Take("k"); !ok {
			t.Fatal("refused within the burst")
		}
	}
	ok, wait := l.Take("k")
	if ok || wait != 250*time.Millisecond {
		t.Fatalf("past the burst: ok %v, wait %v; want refused with 250ms to wait", ok, wait)
	}
	l.Sweep()
	if l.Len() != 1 {
		t.Fatal("Sweep forgot a bucket that had not refilled")
	}
	now = now.Add(2 * time.Second)
	l.Sweep()
	if l.Len() != 0 {
		t.Fatal("Sweep kept a refilled bucket")
	}
}
