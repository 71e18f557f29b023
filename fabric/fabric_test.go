package fabric

import (
	"context"
	"testing"
	"time"

	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

type testClock struct{ t time.Time }

func (c *testClock) now() time.Time { return c.t }

func newTestFabric(t *testing.T, st sessionstore.Store, clk *testClock, id string) *Fabric {
	t.Helper()
	f, err := New(Config{InstanceID: id, PublicURL: "http://" + id}, st, clk.now, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestHealthFromTheCachedView(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a, b := newTestFabric(t, st, clk, "a"), newTestFabric(t, st, clk, "b")
	if a.Healthy(ctx, "b") {
		t.Fatal("b healthy before anyone heartbeated")
	}
	for _, f := range []*Fabric{b, a} {
		if err := f.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !a.Healthy(ctx, "b") || a.URL("b") != "http://b" {
		t.Fatalf("a sees b healthy=%v url=%q", a.Healthy(ctx, "b"), a.URL("b"))
	}
	clk.t = clk.t.Add(9 * time.Second)
	if !a.Healthy(ctx, "b") {
		t.Fatal("b unhealthy 9s after its heartbeat (dead after 10s)")
	}
	clk.t = clk.t.Add(time.Second)
	if a.Healthy(ctx, "b") {
		t.Fatal("b healthy 10s after its heartbeat")
	}
	if !a.Healthy(ctx, "a") {
		t.Fatal("an instance that is not draining is healthy to itself")
	}
	if err := b.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Healthy(ctx, "b") {
		t.Fatal("a saw b's new heartbeat without a refresh: Healthy must not read the store")
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if !a.Healthy(ctx, "b") {
		t.Fatal("b unhealthy after a fresh heartbeat and a refresh")
	}
	if err := b.SetDraining(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Healthy(ctx, "b") || b.Healthy(ctx, "b") {
		t.Fatal("a draining instance is healthy")
	}
}

func TestAssignLeastLoaded(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a, b, c := newTestFabric(t, st, clk, "a"), newTestFabric(t, st, clk, "b"), newTestFabric(t, st, clk, "c")
	for _, f := range []*Fabric{a, b, c, a, b} {
		if err := f.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for i := range 6 {
		inst, err := b.Assign(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, inst)
		k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: string(rune('a' + i))}
		_, err = st.CreateSession(ctx, sessionstore.Session{Key: k, RuntimeMode: string(ModeSticky), TokenHash: []byte(k.SessionID),
			RegisteredAt: clk.t, ExpiresAt: clk.t.Add(time.Hour), AssignedInstance: inst}, clk.t)
		if err != nil {
			t.Fatal(err)
		}
	}
	// b answers: ties go to b first, then to the lowest id.
	want := []string{"b", "a", "c", "b", "a", "c"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("assignments %v, want %v", got, want)
		}
	}
	// c dies: it gets nothing more.
	clk.t = clk.t.Add(11 * time.Second)
	for _, f := range []*Fabric{a, b} {
		if err := f.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if inst, _ := b.Assign(ctx); inst == "c" {
			t.Fatal("assigned to an unhealthy instance")
		}
	}
}
