package conns_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
)

// expiryHub starts a hub over st on clock, with the pending sweep off: what
// closes an expired session's WebSocket here is the expiry check alone.
func expiryHub(t *testing.T, st sessionstore.Store, clock *hubtest.Clock, ttl time.Duration) *hubtest.Hub {
	t.Helper()
	return hubtest.Start(t, hubtest.Options{Store: st, Now: clock.Now, Config: hub.Config{
		PendingSweep: noSweep, SessionTTL: ttl, ExpiryCheck: 10 * time.Millisecond,
	}})
}

// An attached session that expires has its WebSocket closed with 4410 at
// its expiry (within the expiry check's period), not at the next pending
// sweep, and the disconnect is counted as an expiry.
func TestExpiredSessionWebSocketClosesAtExpiry(t *testing.T) {
	const ttl = time.Minute
	for _, store := range stores {
		t.Run(store, func(t *testing.T) {
			clock := hubtest.NewClock(time.Now())
			h := expiryHub(t, openStore(t, store), clock, ttl)
			c := dial(t, h, register(t, h, "bob"))
			if f := read(t, c); f["type"] != "welcome" {
				t.Fatalf("first frame %v", f)
			}
			clock.Advance(ttl + time.Second)
			if got := closeCode(t, c); got != 4410 {
				t.Fatalf("closed with %d, want 4410", got)
			}
			if n := metric(t, h, "marconi_ws_disconnects_total", "reason", "expired"); n != 1 {
				t.Fatalf("marconi_ws_disconnects_total{reason=\"expired\"} = %v, want 1", n)
			}
		})
	}
}

// The instance holding a WebSocket reads its session's row before it
// closes it: an expiry extended elsewhere (a heartbeat that reached
// another instance) keeps the WebSocket open, until the extended expiry
// passes in turn.
func TestExpiryExtendedElsewhereKeepsTheWebSocket(t *testing.T) {
	const ttl = time.Minute
	bob := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	for _, store := range stores {
		t.Run(store, func(t *testing.T) {
			st := &headReads{Store: openStore(t, store), read: map[string]int{}}
			clock := hubtest.NewClock(time.Now())
			h := expiryHub(t, st, clock, ttl)
			c := dial(t, h, register(t, h, "bob"))
			if f := read(t, c); f["type"] != "welcome" {
				t.Fatalf("first frame %v", f)
			}
			// dave attaches half a TTL later and never heartbeats: his
			// closing shows that an expiry check ran after bob's row was
			// read.
			clock.Advance(ttl / 2)
			dave := dial(t, h, register(t, h, "dave"))
			if f := read(t, dave); f["type"] != "welcome" {
				t.Fatalf("dave's first frame %v", f)
			}

			// A heartbeat elsewhere, then past the expiry the holder knows of.
			clock.Advance(ttl/2 - 10*time.Second)
			now := clock.Now()
			if err := st.TouchSession(context.Background(), bob, sessionstore.Touch{SeenAt: now, ExpiresAt: now.Add(ttl)}, now); err != nil {
				t.Fatal(err)
			}
			clock.Advance(20 * time.Second)
			waitFor(t, "the holder to read bob's row", func() bool { return st.reads("bob") >= 1 })
			alice := register(t, h, "alice")
			post(t, h.URL+"/v1/signals", alice, map[string]any{"to_session": "bob", "payload": 1})
			if f := read(t, c); f["type"] != "signal" {
				t.Fatalf("frame after the extension %v, want the signal", f)
			}
			// The row read extended what the holder knows: a later check
			// (the one that closes dave) does not read it again.
			clock.Advance(ttl / 2)
			if got := closeCode(t, dave); got != 4410 {
				t.Fatalf("dave closed with %d, want 4410", got)
			}
			if n := st.reads("bob"); n != 1 {
				t.Fatalf("%d reads of bob's row, want 1", n)
			}

			clock.Advance(ttl)
			if got := closeCode(t, c); got != 4410 {
				t.Fatalf("closed with %d, want 4410", got)
			}
		})
	}
}

// headReads records which sessions' rows the batch reads (SessionHeads)
// asked for: the expiry check's reads.
type headReads struct {
	sessionstore.Store
	mu   sync.Mutex
	read map[string]int // session id → reads of its row
}

func (s *headReads) SessionHeads(ctx context.Context, keys []sessionstore.Key, now time.Time) (map[sessionstore.Key]sessionstore.SessionHead, error) {
	s.mu.Lock()
	for _, k := range keys {
		s.read[k.SessionID]++
	}
	s.mu.Unlock()
	return s.Store.SessionHeads(ctx, keys, now)
}

func (s *headReads) reads(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.read[id]
}

// A heartbeat served by the instance holding the session's WebSocket
// raises the expiry that instance knows: once the attach's expiry has
// passed, the expiry check does not read the row of a session whose
// heartbeat it served.
func TestHeartbeatHereExtendsTheKnownExpiry(t *testing.T) {
	callHereExtendsTheKnownExpiry(t, func(t *testing.T, h *hubtest.Hub, bobTok string) {
		post(t, h.URL+"/v1/heartbeat", bobTok, map[string]any{})
	})
}

// Another authenticated call (a send) served by the instance holding the
// session's WebSocket raises the expiry that instance knows, as a heartbeat
// does.
func TestOtherCallHereExtendsTheKnownExpiry(t *testing.T) {
	callHereExtendsTheKnownExpiry(t, func(t *testing.T, h *hubtest.Hub, bobTok string) {
		register(t, h, "erin")
		post(t, h.URL+"/v1/signals", bobTok, map[string]any{"to_session": "erin", "payload": 1})
	})
}

// callHereExtendsTheKnownExpiry has bob make call (with his token) on the
// hub holding his WebSocket shortly before his attach's expiry, and checks
// that the expiry check never reads his row once that expiry has passed,
// and that his WebSocket stays open. carol, attached at the same time and
// silent since, is the witness that a check ran past that expiry: it reads
// her row and closes her WebSocket.
func callHereExtendsTheKnownExpiry(t *testing.T, call func(t *testing.T, h *hubtest.Hub, bobTok string)) {
	const ttl = time.Minute
	for _, store := range stores {
		t.Run(store, func(t *testing.T) {
			st := &headReads{Store: openStore(t, store), read: map[string]int{}}
			clock := hubtest.NewClock(time.Now())
			h := expiryHub(t, st, clock, ttl)
			bobTok := register(t, h, "bob")
			bob, carol := dial(t, h, bobTok), dial(t, h, register(t, h, "carol"))
			for _, c := range []*websocket.Conn{bob, carol} {
				if f := read(t, c); f["type"] != "welcome" {
					t.Fatalf("first frame %v", f)
				}
			}

			clock.Advance(ttl - 10*time.Second)
			call(t, h, bobTok)
			clock.Advance(20 * time.Second) // past both attaches' expiry
			if got := closeCode(t, carol); got != 4410 {
				t.Fatalf("carol closed with %d, want 4410", got)
			}
			if n := st.reads("bob"); n != 0 {
				t.Fatalf("the expiry check read bob's row %d times after his call here, want 0", n)
			}
			alice := register(t, h, "alice")
			post(t, h.URL+"/v1/signals", alice, map[string]any{"to_session": "bob", "payload": 1})
			if f := read(t, bob); f["type"] != "signal" {
				t.Fatalf("bob's frame after his call %v, want the signal", f)
			}
		})
	}
}

// goneAtAttach deletes a session just before its attach is recorded: it
// ended between the handshake's authentication and the attach.
type goneAtAttach struct{ sessionstore.Store }

func (s goneAtAttach) AttachQueue(ctx context.Context, k sessionstore.Key, instance string, at time.Time, t sessionstore.Touch, now time.Time) (int, error) {
	if err := s.DeleteSession(ctx, k); err != nil {
		return 0, err
	}
	return s.Store.AttachQueue(ctx, k, instance, at, t, now)
}

// A session that ends while its WebSocket attaches has it closed with 4410
// after the welcome, with the pending sweep off.
func TestSessionGoneAtAttachClosesTheWebSocket(t *testing.T) {
	for _, store := range stores {
		t.Run(store, func(t *testing.T) {
			clock := hubtest.NewClock(time.Now())
			h := expiryHub(t, goneAtAttach{openStore(t, store)}, clock, time.Hour)
			c := dial(t, h, register(t, h, "bob"))
			if got := closeCode(t, c); got != 4410 {
				t.Fatalf("closed with %d, want 4410", got)
			}
		})
	}
}

// An expiry check whose read fails leaves the connections it was for due:
// each later check reads them again (one read per check, the check's
// interval being the pace) until the store answers, and then closes the
// expired session's WebSocket, with the pending sweep off.
func TestExpiryCheckOnAStoreDownIsRetried(t *testing.T) {
	const ttl = time.Minute
	for _, store := range stores {
		t.Run(store, func(t *testing.T) {
			st := &rowsDown{Store: openStore(t, store)}
			clock := hubtest.NewClock(time.Now())
			h := expiryHub(t, st, clock, ttl)
			c := dial(t, h, register(t, h, "bob"))
			if f := read(t, c); f["type"] != "welcome" {
				t.Fatalf("first frame %v", f)
			}

			st.down.Store(true)
			clock.Advance(ttl + time.Second)
			waitFor(t, "three expiry checks to fail", func() bool { return st.headsFailed.Load() >= 3 })
			st.down.Store(false)
			if got := closeCode(t, c); got != 4410 {
				t.Fatalf("closed with %d, want 4410", got)
			}
			if n := metric(t, h, "marconi_ws_disconnects_total", "reason", "expired"); n != 1 {
				t.Fatalf("marconi_ws_disconnects_total{reason=\"expired\"} = %v, want 1", n)
			}
		})
	}
}
