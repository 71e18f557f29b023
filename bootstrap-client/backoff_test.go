package bootstrap

import (
	"math/rand/v2"
	"testing"
	"time"
)

// top returns the largest value int63n may return: the delay is the ceiling's edge.
func top(n int64) int64 { return n - 1 }

func TestBackoffGrowsAndCaps(t *testing.T) {
	b := backoff{base: 250 * time.Millisecond, max: 15 * time.Second, int63n: top}
	want := []time.Duration{
		250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second,
		4 * time.Second, 8 * time.Second, 15 * time.Second, 15 * time.Second,
	}
	for attempt, w := range want {
		if got := b.ceiling(attempt); got != w {
			t.Errorf("ceiling(%d) = %v, want %v", attempt, got, w)
		}
		if got := b.delay(attempt); got != w-1 {
			t.Errorf("delay(%d) with the top random value = %v, want %v", attempt, got, w-1)
		}
	}
	// Far attempts neither overflow nor exceed the cap.
	for _, attempt := range []int{63, 64, 1000, 1 << 30} {
		if got := b.ceiling(attempt); got != 15*time.Second {
			t.Errorf("ceiling(%d) = %v, want the cap", attempt, got)
		}
	}
}

func TestBackoffFullJitter(t *testing.T) {
	zero := backoff{base: time.Second, max: time.Minute, int63n: func(int64) int64 { return 0 }}
	if got := zero.delay(5); got != 0 {
		t.Errorf("delay with the bottom random value = %v, want 0: full jitter starts at zero", got)
	}
	var asked []int64
	rec := backoff{base: time.Second, max: time.Minute, int63n: func(n int64) int64 { asked = append(asked, n); return n / 2 }}
	if got := rec.delay(2); got != 2*time.Second {
		t.Errorf("delay(2) at the middle = %v, want 2s", got)
	}
	if len(asked) != 1 || asked[0] != int64(4*time.Second) {
		t.Errorf("random source asked for %v, want [4s]", asked)
	}

	// With a seeded source every delay stays within [0, ceiling).
	r := rand.New(rand.NewPCG(1, 2))
	seeded := backoff{base: 250 * time.Millisecond, max: 15 * time.Second, int63n: r.Int64N}
	for attempt := range 20 {
		for range 50 {
			d := seeded.delay(attempt)
			if d < 0 || d >= seeded.ceiling(attempt) {
				t.Fatalf("delay(%d) = %v, outside [0, %v)", attempt, d, seeded.ceiling(attempt))
			}
		}
	}
}

func TestBackoffZeroCeiling(t *testing.T) {
	b := backoff{int63n: func(int64) int64 { t.Fatal("random source called for a zero ceiling"); return 0 }}
	if got := b.delay(3); got != 0 {
		t.Errorf("delay = %v, want 0", got)
	}
}

func TestBackoffCapped(t *testing.T) {
	b := backoff{base: 250 * time.Millisecond, max: 15 * time.Second}
	r := b.capped(4 * time.Second)
	if got := r.ceiling(10); got != 4*time.Second {
		t.Errorf("capped ceiling(10) = %v, want 4s", got)
	}
	if got := r.ceiling(1); got != 500*time.Millisecond {
		t.Errorf("capped ceiling(1) = %v, want 500ms: the cap changes only the top", got)
	}
	if got := b.ceiling(10); got != 15*time.Second {
		t.Errorf("the original's ceiling(10) = %v, want 15s: capped is a copy", got)
	}
	if got := b.capped(time.Minute).ceiling(10); got != 15*time.Second {
		t.Errorf("capped above max: ceiling(10) = %v, want max (15s)", got)
	}
}
