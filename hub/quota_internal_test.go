package hub

import (
	"context"
	"testing"
	"time"
)

// The per-project lock gives up when its context ends, and forgets a key
// once nobody holds or waits for it (memory bounded by requests in flight).
func TestKeyedMutex(t *testing.T) {
	m := newKeyedMutex[string]()
	unlock, err := m.lock(context.Background(), "p")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.lock(ctx, "p"); err == nil {
		t.Fatal("a second lock of a held key returned while its context was done")
	}
	other, err := m.lock(context.Background(), "q")
	if err != nil {
		t.Fatal("another key is blocked by a held one")
	}
	other()
	unlock()
	if n := len(m.locks); n != 0 {
		t.Fatalf("%d keys kept after every holder and waiter left, want 0", n)
	}
	again, err := m.lock(context.Background(), "p")
	if err != nil {
		t.Fatal(err)
	}
	again()
}

// A full project is remembered until its recount is due, then swept.
func TestProjectMemo(t *testing.T) {
	m := newProjectMemo()
	now := time.Now()
	tp := TenantProject{TenantID: "t", ProjectID: "p"}
	m.add(tp, now.Add(time.Second))
	if !m.has(tp, now) || m.has(tp, now.Add(time.Second)) {
		t.Fatal("the memo does not hold exactly until its time")
	}
	m.sweep(now)
	if len(m.until) != 1 {
		t.Fatal("sweep forgot a project before its time")
	}
	m.sweep(now.Add(time.Second))
	if len(m.until) != 0 {
		t.Fatal("sweep kept a project past its time")
	}
}

// An empty bucket says how long until its next token.
func TestRateLimiterWait(t *testing.T) {
	now := time.Now()
	l := newRateLimiter[string](4, func() time.Time { return now })
	for range 8 {
		if ok, _ := l.take("k"); !ok {
			t.Fatal("refused within the burst")
		}
	}
	ok, wait := l.take("k")
	if ok || wait != 250*time.Millisecond {
		t.Fatalf("past the burst: ok %v, wait %v; want refused with 250ms to wait", ok, wait)
	}
}
