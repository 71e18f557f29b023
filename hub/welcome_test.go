package hub_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// heldAttach is a store whose AttachQueue waits until released, after
// saying it was entered.
type heldAttach struct {
	sessionstore.Store
	entered, release chan struct{}
}

func (s *heldAttach) AttachQueue(ctx context.Context, k sessionstore.Key, instance string, at time.Time, t sessionstore.Touch, now time.Time) (int, error) {
	s.entered <- struct{}{}
	<-s.release
	return s.Store.AttachQueue(ctx, k, instance, at, t, now)
}

// TestWelcomeWaitsForTheAttachRecord: a send that finds the connection in
// the registry while its attach is still being recorded (and the welcome's
// replayed counted) starts no writer; the welcome is written once the
// count is in, and announces every signal the replay then writes.
func TestWelcomeWaitsForTheAttachRecord(t *testing.T) {
	st := &heldAttach{Store: memstore.New(), entered: make(chan struct{}), release: make(chan struct{})}
	h := hubtest.Start(t, hubtest.Options{Store: st})
	alice := register(t, h, "alice", "claude_code")
	bob := register(t, h, "bob", "claude_code")
	send(t, h, alice, "bob", 1)

	type dialed struct {
		c   *websocket.Conn
		err error
	}
	done := make(chan dialed, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, _, err := websocket.Dial(ctx, h.WSURL(), &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + bob.Token}}})
		done <- dialed{c, err}
	}()
	<-st.entered // bob is in the registry; his attach is not recorded yet
	send(t, h, alice, "bob", 2)
	close(st.release)
	d := <-done
	if d.err != nil {
		t.Fatal(d.err)
	}
	t.Cleanup(func() { d.c.CloseNow() })
	if w := readFrame(t, d.c); w["type"] != "welcome" || w["replayed"] != 2.0 {
		t.Fatalf("first frame %v, want the welcome announcing 2 replayed", w)
	}
	for want := 1.0; want <= 2; want++ {
		if f := readFrame(t, d.c); f["type"] != "signal" || f["seq"] != want {
			t.Fatalf("frame %v, want signal %v", f, want)
		}
	}
}
