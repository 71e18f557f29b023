package conns_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/testwait"
	"github.com/marconihub/marconi/sessionstore"
)

// handBus is a bus whose listener the test drives: it hands the hub's
// onWake to the test, which calls it as a wake-up from another instance
// would arrive.
type handBus struct{ onWake chan func(sessionstore.Wake) }

func (b handBus) Publish(context.Context, string, sessionstore.Wake) error { return nil }

func (b handBus) Listen(ctx context.Context, _ string, _ time.Time, onWake func(sessionstore.Wake), _ func()) error {
	b.onWake <- onWake
	<-ctx.Done()
	return nil
}

// heldRead holds the first read of pending signals of one session, once it
// has read them, until released: the connection's writer is busy in its
// first catch-up, and what is queued meanwhile stays queued.
type heldRead struct {
	sessionstore.Store
	key     sessionstore.Key
	once    sync.Once
	held    chan struct{} // closed once the read is held
	release chan struct{}
}

func (s *heldRead) PendingSignals(ctx context.Context, k sessionstore.Key, after int64, limit int) ([]sessionstore.Signal, error) {
	sigs, err := s.Store.PendingSignals(ctx, k, after, limit)
	if k == s.key {
		s.once.Do(func() {
			close(s.held)
			<-s.release
		})
	}
	return sigs, err
}

// closeCode reads c until it ends and returns the close code the hub sent,
// failing t when it has not ended within 5 s.
func closeCode(t *testing.T, c *websocket.Conn) websocket.StatusCode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		if _, _, err := c.Read(ctx); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("the connection is still open after 5 s: %v", err)
			}
			return websocket.CloseStatus(err)
		}
	}
}

// A check wake-up (a session's row changed on another instance) reaches
// the connection even when its queue is full: the connection is closed
// with the code the row calls for, with the pending sweep off.
func TestCheckWakeUpOnAFullQueueClosesTheConnection(t *testing.T) {
	bob := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	changes := []rowChange{
		{"deregistered", func(t *testing.T, st sessionstore.Store) {
			if err := st.DeleteSession(context.Background(), bob); err != nil {
				t.Fatal(err)
			}
		}, 4410},
		tokenReplaced(bob),
	}
	for _, store := range stores {
		for _, ch := range changes {
			t.Run(store+"/"+ch.name, func(t *testing.T) {
				st := openStore(t, store)
				held := &heldRead{Store: st, key: bob, held: make(chan struct{}), release: make(chan struct{})}
				bus := handBus{onWake: make(chan func(sessionstore.Wake), 1)}
				const queue = 2
				h := hubtest.Start(t, hubtest.Options{Store: held, Bus: bus, Config: hub.Config{PendingSweep: noSweep, WSQueueSize: queue}})
				t.Cleanup(func() { close(held.release) }) // before the hub closes
				onWake := testwait.Receive(t, "the bus listener", 10*time.Second, bus.onWake)
				alice := register(t, h, "alice")
				c := dial(t, h, register(t, h, "bob"))

				// Bob's writer is held in its first catch-up: the sends fill
				// his queue.
				testwait.Receive(t, "bob's first catch-up", 10*time.Second, held.held)
				for range queue {
					post(t, h.URL+"/v1/signals", alice, map[string]any{"to_session": "bob", "payload": 1})
				}
				ch.change(t, st) // as another instance would
				onWake(sessionstore.Wake{Key: bob, Seq: fabric.CheckSeq})
				held.release <- struct{}{}

				if got := closeCode(t, c); got != ch.want {
					t.Fatalf("closed with %d, want %d", got, ch.want)
				}
			})
		}
	}
}

// rowChange is what another instance does to a session's row, and the
// close code a connection of the session then gets here.
type rowChange struct {
	name   string
	change func(t *testing.T, st sessionstore.Store)
	want   websocket.StatusCode
}

// tokenReplaced is k resumed with another token: 4409.
func tokenReplaced(k sessionstore.Key) rowChange {
	return rowChange{"token replaced", func(t *testing.T, st sessionstore.Store) {
		now := time.Now()
		sess, err := st.GetSession(context.Background(), k, now)
		if err == nil {
			_, err = st.ResumeSession(context.Background(), k, sess.TokenHash, []byte("another token's hash"),
				sessionstore.Touch{SeenAt: now, ExpiresAt: now.Add(time.Hour)}, now)
		}
		if err != nil {
			t.Fatal(err)
		}
	}, 4409}
}

// noSweep is a pending-sweep interval no test outlives: what a test sees
// closed was not closed by the sweep.
const noSweep = time.Hour
