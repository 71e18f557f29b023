package conns_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket/wsjson"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
)

// historyStore is a store whose history the test moves, as a promoted
// standby's would.
type historyStore struct {
	sessionstore.Store
	n atomic.Uint64
}

func (s *historyStore) History() uint64 { return s.n.Load() }

// When the store's history changes, a WebSocket writes its session's
// unacknowledged signals again (a standby promoted may have given their
// seqs to new ones), and an ack it reads afterwards counts only for what
// it has written since.
func TestHistoryChangeWritesTheUnacknowledgedAgain(t *testing.T) {
	for _, store := range stores {
		t.Run(store, func(t *testing.T) {
			st := &historyStore{Store: openStore(t, store)}
			st.n.Store(1)
			h := hubtest.Start(t, hubtest.Options{Store: st, Config: hub.Config{
				PendingSweep: noSweep, ExpiryCheck: 10 * time.Millisecond,
			}})
			c := dial(t, h, register(t, h, "bob"))
			if f := read(t, c); f["type"] != "welcome" {
				t.Fatalf("first frame %v", f)
			}
			alice := register(t, h, "alice")
			var ids []any
			for i := range 3 {
				post(t, h.URL+"/v1/signals", alice, map[string]any{"to_session": "bob", "payload": i})
				f := read(t, c)
				if f["type"] != "signal" {
					t.Fatalf("frame %v, want a signal", f)
				}
				ids = append(ids, f["id"])
			}
			// bob acknowledges the first; the store's history moves.
			if err := wsjson.Write(context.Background(), c, map[string]any{"type": "ack", "up_to_seq": 1}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "bob's first signal to be acknowledged", func() bool {
				n, err := st.CountPending(context.Background(), sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"})
				return err == nil && n == 2
			})
			st.n.Store(2)
			for _, want := range ids[1:] {
				if f := read(t, c); f["type"] != "signal" || f["id"] != want {
					t.Fatalf("frame %v after the history changed, want signal %v written again", f, want)
				}
			}
			if n := metric(t, h, "marconi_ws_rewinds_total", "", ""); n != 1 {
				t.Fatalf("marconi_ws_rewinds_total = %v, want 1", n)
			}
		})
	}
}
