package signals_test

import (
	"context"
	"crypto/sha256"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
	"github.com/marconihub/marconi/signals"
	"github.com/marconihub/marconi/signals/selfheal"
)

// readCounting counts the recipient reads that reach the store.
type readCounting struct {
	*memstore.Store
	reads atomic.Int64
}

func (s *readCounting) GetSession(ctx context.Context, k sessionstore.Key, now time.Time) (sessionstore.Session, error) {
	s.reads.Add(1)
	return s.Store.GetSession(ctx, k, now)
}

// rowRouter routes by the store row alone: a session whose row records a
// queue is attached there.
type rowRouter struct{}

func (rowRouter) Route(_ context.Context, s sessionstore.Session) signals.Route {
	return signals.Route{Attached: s.QueueInstance != "", InstanceID: s.QueueInstance, InstanceHealthy: s.QueueInstance != "", AttachedAt: s.QueueAttachedAt}
}

func (rowRouter) Deliver(context.Context, sessionstore.Session, sessionstore.Signal) {}

type recipientWorld struct {
	t      *testing.T
	store  *readCounting
	svc    *signals.Service
	clock  time.Time
	sender sessionstore.Session
	bob    sessionstore.Key
}

func newRecipientWorld(t *testing.T, age time.Duration) *recipientWorld {
	w := &recipientWorld{t: t, store: &readCounting{Store: memstore.New()}, clock: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	now := func() time.Time { return w.clock }
	sh, err := selfheal.New(selfheal.Config{}.WithDefaults(marconi.Development), now, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	w.svc, err = signals.New(signals.Config{RecipientCacheAge: age}, w.store, rowRouter{}, sh, now, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	w.sender = w.register("alice", w.clock)
	w.bob = w.register("bob", w.clock).Key
	return w
}

func (w *recipientWorld) register(id string, at time.Time) sessionstore.Session {
	w.t.Helper()
	k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: id}
	h := sha256.Sum256([]byte(id + at.String()))
	s, err := w.store.CreateSession(w.t.Context(), sessionstore.Session{Key: k, Surface: "claude_code", RuntimeMode: "stateless",
		RuntimeModeSource: "default", TokenHash: h[:], RegisteredAt: at, LastSeenAt: at, ExpiresAt: at.Add(time.Hour)}, at)
	if err != nil {
		w.t.Fatalf("register %s: %v", id, err)
	}
	return s
}

// send sends to bob and checks the answer's route state, and how many
// recipient reads it cost.
func (w *recipientWorld) send(what string, state marconi.RouteState, reads int64) {
	w.t.Helper()
	before := w.store.reads.Load()
	res, err := w.svc.Send(w.t.Context(), signals.SendRequest{Sender: w.sender, To: "bob"})
	if err != nil {
		w.t.Fatalf("%s: send: %v", what, err)
	}
	if res.RouteState != state {
		w.t.Errorf("%s: route state %s, want %s", what, res.RouteState, state)
	}
	if got := w.store.reads.Load() - before; got != reads {
		w.t.Errorf("%s: %d recipient reads, want %d", what, got, reads)
	}
}

// A recipient read by a send serves the next sends for the cache's age,
// and never hides what the append checks: an attach, a move, a detach, a
// resume, a registration again are each seen by the next send, which reads
// the recipient again.
func TestSendUsesARecentRecipientUnlessItChanged(t *testing.T) {
	w := newRecipientWorld(t, time.Second)
	ctx := t.Context()
	w.send("first send", marconi.StateRouteWithoutQueue, 1)
	w.send("second send, within the age", marconi.StateRouteWithoutQueue, 0)

	if err := w.store.SetQueue(ctx, w.bob, "hub-b", w.clock); err != nil {
		t.Fatal(err)
	}
	w.send("after an attach elsewhere", marconi.StateAttached, 1)
	w.send("attached, cached", marconi.StateAttached, 0)
	row, err := w.store.Store.GetSession(ctx, w.bob, w.clock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.store.ClearQueue(ctx, w.bob, "hub-b", row.QueueAttachedAt, w.clock); err != nil {
		t.Fatal(err)
	}
	w.send("after the detach", marconi.StateRouteWithoutQueue, 1)

	if _, err := w.store.ResumeSession(ctx, w.bob, row.TokenHash, []byte("another token hash, 32 bytes...."), sessionstore.Touch{}, w.clock); err != nil {
		t.Fatal(err)
	}
	w.send("after a resume", marconi.StateRouteWithoutQueue, 1)

	if err := w.store.DeleteSession(ctx, w.bob); err != nil {
		t.Fatal(err)
	}
	_, err = w.svc.Send(ctx, signals.SendRequest{Sender: w.sender, To: "bob"})
	if marconi.ErrorCode(err) != marconi.CodeRecipientNotRegistered {
		t.Fatalf("send after bob deregistered: %v, want recipient_not_registered", err)
	}
	w.clock = w.clock.Add(time.Millisecond)
	w.register("bob", w.clock)
	w.send("bob registered again", marconi.StateRouteWithoutQueue, 1)

	w.clock = w.clock.Add(time.Second)
	w.send("past the age", marconi.StateRouteWithoutQueue, 1)
}

// With the cache off every send reads its recipient.
func TestSendReadsEveryRecipientWithTheCacheOff(t *testing.T) {
	w := newRecipientWorld(t, -1)
	w.send("first send", marconi.StateRouteWithoutQueue, 1)
	w.send("second send", marconi.StateRouteWithoutQueue, 1)
}
