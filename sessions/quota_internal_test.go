package sessions

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

// What a count found is used until the recount is due, then swept: a full
// project is refused, one with room takes exactly that many from memory and
// then asks for a count; forget asks for a count at once.
func TestProjectRooms(t *testing.T) {
	m := newProjectRooms()
	now := time.Now()
	full, room := Project{TenantID: "t", ProjectID: "full"}, Project{TenantID: "t", ProjectID: "room"}
	if got := m.spend(room, now); got != roomCount {
		t.Fatalf("nothing remembered: %v, want a count", got)
	}
	m.set(full, true, 0, now.Add(time.Second))
	m.set(room, false, 2, now.Add(time.Second))
	if got := m.spend(full, now); got != roomFull {
		t.Fatalf("a project counted full: %v, want refused from memory", got)
	}
	for i := range 2 {
		if got := m.spend(room, now); got != roomSpent {
			t.Fatalf("place %d of 2 remembered: %v, want taken from memory", i+1, got)
		}
	}
	if got := m.spend(room, now); got != roomCount {
		t.Fatalf("the remembered room used up: %v, want a count", got)
	}
	if got := m.spend(full, now.Add(time.Second)); got != roomCount {
		t.Fatalf("past the recount: %v, want a count", got)
	}
	m.forget(full)
	if got := m.spend(full, now); got != roomCount {
		t.Fatalf("after forget: %v, want a count", got)
	}
	m.set(full, true, 0, now.Add(time.Second))
	m.sweep(now)
	if len(m.rooms) != 2 {
		t.Fatal("sweep forgot a project before its time")
	}
	m.sweep(now.Add(time.Second))
	if len(m.rooms) != 0 {
		t.Fatal("sweep kept a project past its time")
	}
}
