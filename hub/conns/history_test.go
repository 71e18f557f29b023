package conns_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
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

func (s *historyStore) HistoryToken() (uint64, string) {
	n := s.n.Load()
	return n, tokenOf(n)
}

// tokenOf is historyStore's token of history n.
func tokenOf(n uint64) string { return fmt.Sprintf("history-%d", n) }

// AckSignalsAs is the store's gate on the test's history: an ack whose
// holder names another history than the test's is refused, as pgstore's
// group commit refuses one under another of its own; the store under it
// is asked to check none (its history is not the test's).
func (s *historyStore) AckSignalsAs(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, upTo int64, at time.Time) (int, error) {
	if h.History != 0 && h.History != s.n.Load() {
		return 0, sessionstore.ErrHistoryChanged
	}
	h.History = 0
	return s.Store.AckSignalsAs(ctx, k, h, upTo, at)
}

// When the store's history changes, a WebSocket tells its client the new
// history (the welcome named the first) and writes its session's
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
			if f := read(t, c); f["type"] != "welcome" || f["history"] != tokenOf(1) {
				t.Fatalf("first frame %v, want a welcome with history %q", f, tokenOf(1))
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
			// The client learns the new history before the signals.
			if f := read(t, c); f["type"] != "history" || f["history"] != tokenOf(2) {
				t.Fatalf("frame %v after the history changed, want a history frame with %q", f, tokenOf(2))
			}
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

// Over HTTP, a client that drains while its WebSocket is down, and acks
// what it drained, names the history its seqs came under: every answer
// that hands it signals (drain, heartbeat, send) names the store's, a
// drain under another history reads from the acknowledged seq again and
// says so, and an ack under another is refused history_changed and
// acknowledges nothing. A client that names none is served as before.
func TestDrainAndAckOverHTTPFollowTheHistory(t *testing.T) {
	for _, store := range stores {
		t.Run(store, func(t *testing.T) {
			st := &historyStore{Store: openStore(t, store)}
			st.n.Store(1)
			h := hubtest.Start(t, hubtest.Options{Store: st, Config: hub.Config{PendingSweep: noSweep, ExpiryCheck: 10 * time.Millisecond}})
			alice, bob := h.Register(t, "alice"), h.Register(t, "bob")
			for i := range 3 {
				h.Send(t, alice, "bob", i)
			}
			drain := func(query string) map[string]any {
				t.Helper()
				code, r := hubtest.Call(t, "GET", h.URL+"/v1/signals"+query, bob.Token, nil)
				if code != http.StatusOK {
					t.Fatalf("drain %s: %d %v", query, code, r)
				}
				return r
			}
			ack := func(upTo int, history string) (int, map[string]any) {
				t.Helper()
				return hubtest.Call(t, "POST", h.URL+"/v1/signals/ack", bob.Token, map[string]any{"up_to_seq": upTo, "history": history})
			}
			seqs := func(r map[string]any) (out []float64) {
				for _, s := range r["signals"].([]any) {
					out = append(out, s.(map[string]any)["seq"].(float64))
				}
				return out
			}

			r := drain("?after_seq=0")
			if r["history"] != tokenOf(1) || r["next_after_seq"] != float64(3) || r["history_changed"] != nil {
				t.Fatalf("first drain %v, want history %q, next_after_seq 3, no history_changed", r, tokenOf(1))
			}
			if _, hb := hubtest.Call(t, "POST", h.URL+"/v1/heartbeat", bob.Token, nil); hb["history"] != tokenOf(1) || len(hb["pending"].([]any)) != 3 {
				t.Fatalf("heartbeat %v, want 3 pending under history %q", hb, tokenOf(1))
			}
			if sent := h.Send(t, bob, "alice", "hi"); sent["history"] != tokenOf(1) || len(sent["pending"].([]any)) != 3 {
				t.Fatalf("send answer %v, want 3 pending under history %q", sent, tokenOf(1))
			}
			if code, a := ack(1, tokenOf(1)); code != http.StatusOK || a["acked"] != float64(1) {
				t.Fatalf("ack under the store's history: %d %v, want 1 acked", code, a)
			}

			st.n.Store(2) // the store went back in time: seqs 2 and 3 may be others now
			r = drain("?after_seq=3&history=" + tokenOf(1))
			if r["history"] != tokenOf(2) || r["history_changed"] != true || !slices.Equal(seqs(r), []float64{2, 3}) || r["next_after_seq"] != float64(3) {
				t.Fatalf("drain after 3 under the old history: %v, want seqs 2 and 3 again under %q, history_changed", r, tokenOf(2))
			}
			code, a := ack(3, tokenOf(1))
			if code != http.StatusConflict || a["error"].(map[string]any)["code"] != "history_changed" {
				t.Fatalf("ack under the old history: %d %v, want 409 history_changed", code, a)
			}
			if n := pending(t, st, "bob"); n != 2 {
				t.Fatalf("%d pending after the refused ack, want 2: it acknowledged something", n)
			}
			if r = drain("?after_seq=3&history=" + tokenOf(2)); len(seqs(r)) != 0 || r["history_changed"] != nil || r["history"] != tokenOf(2) {
				t.Fatalf("drain after 3 under the store's history: %v, want nothing new", r)
			}
			if code, a := ack(2, tokenOf(2)); code != http.StatusOK || a["acked"] != float64(1) {
				t.Fatalf("ack under the new history: %d %v, want 1 acked", code, a)
			}
			if code, a := hubtest.Call(t, "POST", h.URL+"/v1/signals/ack", bob.Token, map[string]any{"up_to_seq": 3}); code != http.StatusOK || a["acked"] != float64(1) {
				t.Fatalf("ack naming no history: %d %v, want 1 acked", code, a)
			}
			if code, a := ack(3, "not a token!"); code != http.StatusBadRequest || a["error"].(map[string]any)["code"] != "invalid_field" {
				t.Fatalf("ack with a malformed history: %d %v, want 400 invalid_field", code, a)
			}
			if code, _ := hubtest.Call(t, "GET", h.URL+"/v1/signals?history=a/b", bob.Token, nil); code != http.StatusBadRequest {
				t.Fatalf("drain with a malformed history: %d, want 400", code)
			}
		})
	}
}
