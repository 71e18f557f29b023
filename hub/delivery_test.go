package hub_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
)

// The delivery tests drive the hub as a user would: sends over HTTP, the
// recipient's WebSocket, drain and ack, and the operator's route_state.

// sendBody posts one send with body and returns the status and answer.
func sendBody(t *testing.T, h *hubtest.Hub, from agent, body map[string]any) (int, map[string]any) {
	t.Helper()
	return call(t, "POST", h.URL+"/v1/signals", from.Token, body)
}

// postSend is a send that is safe to call from any goroutine (it never calls t.Fatal).
func postSend(ctx context.Context, h *hubtest.Hub, from agent, body map[string]any) (int, map[string]any, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, "POST", h.URL+"/v1/signals", bytes.NewReader(raw))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+from.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		return resp.StatusCode, nil, fmt.Errorf("answer is not JSON: %q", b)
	}
	return resp.StatusCode, out, nil
}

// seqOf is a signal's seq, from a frame or a send answer.
func seqOf(t *testing.T, m map[string]any) int64 {
	t.Helper()
	f, ok := m["seq"].(float64)
	if !ok {
		t.Fatalf("no numeric seq in %v", m)
	}
	return int64(f)
}

// readSignals reads n frames and fails unless each is a signal.
func readSignals(t *testing.T, c *websocket.Conn, n int) []map[string]any {
	t.Helper()
	out := make([]map[string]any, 0, n)
	for range n {
		f := readFrame(t, c)
		if f["type"] != "signal" {
			t.Fatalf("frame %d is %v, want a signal", len(out)+1, f)
		}
		out = append(out, f)
	}
	return out
}

// seqs lists the seqs of signals.
func seqs(t *testing.T, sigs []map[string]any) []int64 {
	t.Helper()
	out := make([]int64, len(sigs))
	for i, s := range sigs {
		out[i] = seqOf(t, s)
	}
	return out
}

// wantSeqs fails unless got is exactly from..to in order.
func wantSeqs(t *testing.T, what string, got []int64, from, to int64) {
	t.Helper()
	ok := int64(len(got)) == to-from+1
	for i := 0; ok && i < len(got); i++ {
		ok = got[i] == from+int64(i)
	}
	if !ok {
		t.Fatalf("%s: seqs %v, want %d..%d in order", what, got, from, to)
	}
}

// pendingOf reads the pending_signals of a t1/p1 session through route_state.
func pendingOf(t *testing.T, h *hubtest.Hub, session string) int {
	t.Helper()
	return int(routeState(t, h, session)["pending_signals"].(float64))
}

// drain is GET /v1/signals.
func drain(t *testing.T, h *hubtest.Hub, a agent, query string) (int, map[string]any) {
	t.Helper()
	return call(t, "GET", h.URL+"/v1/signals"+query, a.Token, nil)
}

// sigList is a list of signals from a JSON answer.
func sigList(t *testing.T, v any) []map[string]any {
	t.Helper()
	arr, ok := v.([]any)
	if !ok {
		t.Fatalf("want a JSON array of signals, got %#v", v)
	}
	out := make([]map[string]any, len(arr))
	for i, x := range arr {
		out[i] = x.(map[string]any)
	}
	return out
}

// registerWithKey registers a session with another project's API key.
func registerWithKey(t *testing.T, h *hubtest.Hub, apiKey, id, surface string) agent {
	t.Helper()
	st, resp := call(t, "POST", h.URL+"/v1/sessions", apiKey, map[string]any{"session_id": id, "surface": surface})
	if st != http.StatusCreated {
		t.Fatalf("register %s: %d %v", id, st, resp)
	}
	return agent{ID: resp["session_id"].(string), Token: resp["token"].(string)}
}

// closeWS closes c normally, as a polite client does.
func closeWS(c *websocket.Conn) { _ = c.Close(websocket.StatusNormalClosure, "bye") }

func TestDeliveryClassesStoreAndDeliver(t *testing.T) {
	clock := hubtest.NewClock(time.Now().UTC().Truncate(time.Second))
	h := hubtest.Start(t, hubtest.Options{Now: clock.Now})
	alice := register(t, h, "alice", "claude_code")
	bob := register(t, h, "bob", "claude_code")
	carol := register(t, h, "carol", "claude_code")
	dave := register(t, h, "dave", "headless_cc")

	// Pushed to an attached recipient: the frame carries every Signal field.
	c, w := dial(t, h, bob)
	if w["session_id"] != "bob" || w["instance_id"] != "test-1" || w["replayed"] != float64(0) {
		t.Fatalf("welcome = %v", w)
	}
	st, r := sendBody(t, h, alice, map[string]any{"to_session": "bob", "kind": "task.ready", "payload": map[string]any{"n": 1, "s": "é"}})
	if st != 200 || r["delivery"] != "pushed_to_ws" || r["recipient_route_state"] != "attached" || r["duplicate"] != false {
		t.Fatalf("send to attached bob: %d %v", st, r)
	}
	f := readSignals(t, c, 1)[0]
	for _, k := range []string{"type", "id", "seq", "from_session", "to_session", "kind", "payload", "created_at"} {
		if _, ok := f[k]; !ok {
			t.Errorf("signal frame lacks %q: %v", k, f)
		}
	}
	pushedID := r["signal_id"]
	if f["id"] != pushedID || seqOf(t, f) != 1 || seqOf(t, r) != 1 || f["from_session"] != "alice" ||
		f["to_session"] != "bob" || f["kind"] != "task.ready" {
		t.Errorf("frame %v does not match the send %v", f, r)
	}
	if p, _ := f["payload"].(map[string]any); p["n"] != float64(1) || p["s"] != "é" {
		t.Errorf("payload = %v", f["payload"])
	}
	if ts, err := time.Parse(time.RFC3339Nano, f["created_at"].(string)); err != nil || !ts.Equal(clock.Now()) || !strings.HasSuffix(f["created_at"].(string), "Z") {
		t.Errorf("created_at = %v (%v), want %s in UTC", f["created_at"], err, clock.Now().Format(time.RFC3339))
	}

	// Queued offline: registered, fresh, no WebSocket.
	r = send(t, h, alice, "carol", "for carol")
	if r["delivery"] != "queued_offline" || r["recipient_route_state"] != "route_without_queue" {
		t.Fatalf("send to offline carol: %v", r)
	}
	// Not available offline: no proof of life within the 300 s window.
	clock.Advance(301 * time.Second)
	r = send(t, h, alice, "dave", "for dave")
	if r["delivery"] != "not_available_offline" || r["recipient_route_state"] != "stale" {
		t.Fatalf("send to stale dave: %v", r)
	}
	// Stored in every case, and each arrives on the next attach.
	if n := pendingOf(t, h, "carol"); n != 1 {
		t.Fatalf("carol pending = %d, want 1", n)
	}
	if n := pendingOf(t, h, "dave"); n != 1 {
		t.Fatalf("dave pending = %d, want 1", n)
	}
	for _, a := range []agent{carol, dave} {
		c, w := dial(t, h, a)
		if w["replayed"] != float64(1) {
			t.Errorf("%s welcome replayed = %v, want 1", a.ID, w["replayed"])
		}
		f := readSignals(t, c, 1)[0]
		if f["payload"] != "for "+a.ID || f["to_session"] != a.ID || seqOf(t, f) != 1 {
			t.Errorf("%s got %v", a.ID, f)
		}
	}
	// Bob's pushed signal is stored too (unacked, it is replayed).
	closeWS(c)
	waitFor(t, "bob detached", func() bool { return routeState(t, h, "bob")["route_state"] != "attached" })
	c, w = dial(t, h, bob)
	if w["replayed"] != float64(1) {
		t.Fatalf("bob reattach replayed = %v, want 1", w["replayed"])
	}
	if g := readSignals(t, c, 1)[0]; g["id"] != pushedID || seqOf(t, g) != 1 {
		t.Fatalf("bob's replay = %v, want the pushed signal %v", g, pushedID)
	}

	for d, want := range map[string]float64{"pushed_to_ws": 1, "queued_offline": 1, "not_available_offline": 1} {
		if got := metric(t, h, "marconi_signals_sent_total", "delivery", d); got != want {
			t.Errorf("marconi_signals_sent_total{delivery=%q} = %v, want %v", d, got, want)
		}
	}
}

func TestReplayAfterReattachInSeqOrder(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	alice := register(t, h, "alice", "claude_code")
	bob := register(t, h, "bob", "claude_code")
	c, _ := dial(t, h, bob)
	for i := 1; i <= 3; i++ {
		send(t, h, alice, "bob", i)
	}
	wantSeqs(t, "live", seqs(t, readSignals(t, c, 3)), 1, 3)
	closeWS(c)
	waitFor(t, "bob detached", func() bool { return routeState(t, h, "bob")["route_state"] == "route_without_queue" })
	for i := 4; i <= 7; i++ {
		if r := send(t, h, alice, "bob", i); r["delivery"] != "queued_offline" {
			t.Fatalf("send %d while bob is away: %v", i, r)
		}
	}
	// Nothing was acked: all seven come back, in order, then live ones.
	c, w := dial(t, h, bob)
	if w["replayed"] != float64(7) {
		t.Fatalf("welcome replayed = %v, want 7", w["replayed"])
	}
	got := readSignals(t, c, 7)
	wantSeqs(t, "replay", seqs(t, got), 1, 7)
	for i, f := range got {
		if f["payload"] != float64(i+1) {
			t.Fatalf("replayed signal %d has payload %v", i+1, f["payload"])
		}
	}
	send(t, h, alice, "bob", 8)
	wantSeqs(t, "live after replay", seqs(t, readSignals(t, c, 1)), 8, 8)
}

// raceReplayWithSends attaches bob while several senders send n signals to
// him at once, and checks that each arrives exactly once (after dedupe by
// id), in strictly increasing seq, with seqs 1..n.
func raceReplayWithSends(t *testing.T, h *hubtest.Hub, n, senders int) {
	t.Helper()
	bob := register(t, h, "bob", "claude_code")
	from := make([]agent, senders)
	for i := range from {
		from[i] = register(t, h, fmt.Sprintf("sender-%d", i), "headless_cc")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var (
		wg      sync.WaitGroup
		sent    atomic.Int64
		mu      sync.Mutex
		answers = map[string]int64{} // signal_id → seq
		errs    []string
	)
	per := n / senders
	for i, a := range from {
		count := per
		if i == senders-1 {
			count = n - per*(senders-1)
		}
		wg.Go(func() {
			for j := range count {
				st, r, err := postSend(ctx, h, a, map[string]any{"to_session": "bob", "payload": map[string]any{"from": a.ID, "j": j}})
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, err.Error())
				case st != 200:
					errs = append(errs, fmt.Sprintf("send: %d %v", st, r))
				default:
					answers[r["signal_id"].(string)] = int64(r["seq"].(float64))
				}
				mu.Unlock()
				sent.Add(1)
				if err != nil || st != 200 {
					return
				}
			}
		})
	}
	// Attach in the middle of the sends: some are replayed, some are live.
	waitFor(t, "the first sends", func() bool { return sent.Load() >= int64(n/6) })
	c, w := dial(t, h, bob)
	t.Logf("attached after %d sends; welcome replayed %v", sent.Load(), w["replayed"])

	seen := map[string]int64{}
	var order []int64
	dups := 0
	for len(seen) < n {
		f := readFrame(t, c)
		if f["type"] != "signal" {
			t.Fatalf("unexpected frame %v", f)
		}
		id, s := f["id"].(string), seqOf(t, f)
		if prev, ok := seen[id]; ok {
			dups++
			if prev != s {
				t.Fatalf("signal %s came with seq %d and %d", id, prev, s)
			}
			continue
		}
		seen[id] = s
		order = append(order, s)
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d sends failed, first: %s", len(errs), errs[0])
	}
	if dups > 0 {
		t.Logf("%d duplicate frames (allowed: delivery is at least once)", dups)
	}
	wantSeqs(t, "arrival order", order, 1, int64(n))
	if len(answers) != n {
		t.Fatalf("%d distinct signal ids answered, want %d", len(answers), n)
	}
	for id, s := range answers {
		if seen[id] != s {
			t.Fatalf("signal %s answered seq %d, arrived with seq %d", id, s, seen[id])
		}
	}
}

func TestReplayRacingConcurrentSends(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{WSQueueSize: 1024, SendRatePerSecond: 10000}})
	raceReplayWithSends(t, h, 300, 6)
}

func TestAckStopsRedelivery(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	alice := register(t, h, "alice", "claude_code")
	bob := register(t, h, "bob", "claude_code")
	for i := 1; i <= 6; i++ {
		send(t, h, alice, "bob", i)
	}

	// Over the WebSocket.
	c, w := dial(t, h, bob)
	if w["replayed"] != float64(6) {
		t.Fatalf("replayed = %v, want 6", w["replayed"])
	}
	wantSeqs(t, "first attach", seqs(t, readSignals(t, c, 6)), 1, 6)
	writeFrame(t, c, map[string]any{"type": "ack", "up_to_seq": 2})
	waitFor(t, "the websocket ack", func() bool { return pendingOf(t, h, "bob") == 4 })
	closeWS(c)
	waitFor(t, "bob detached", func() bool { return routeState(t, h, "bob")["route_state"] == "route_without_queue" })
	c, w = dial(t, h, bob)
	if w["replayed"] != float64(4) {
		t.Fatalf("replayed after ws ack = %v, want 4", w["replayed"])
	}
	wantSeqs(t, "after ws ack", seqs(t, readSignals(t, c, 4)), 3, 6)
	closeWS(c)
	waitFor(t, "bob detached", func() bool { return routeState(t, h, "bob")["route_state"] == "route_without_queue" })

	// Over HTTP: the answer counts what this call acknowledged.
	st, r := call(t, "POST", h.URL+"/v1/signals/ack", bob.Token, map[string]any{"up_to_seq": 4})
	if st != 200 || r["acked"] != float64(2) {
		t.Fatalf("ack up to 4: %d %v, want acked 2", st, r)
	}
	if st, r := call(t, "POST", h.URL+"/v1/signals/ack", bob.Token, map[string]any{"up_to_seq": 4}); st != 200 || r["acked"] != float64(0) {
		t.Fatalf("ack again: %d %v, want acked 0", st, r)
	}
	for _, bad := range []any{map[string]any{}, map[string]any{"up_to_seq": -1}, map[string]any{"up_to_seq": "x"}} {
		if st, r := call(t, "POST", h.URL+"/v1/signals/ack", bob.Token, bad); st != 400 || errCode(r) != "invalid_field" {
			t.Errorf("ack %v: %d %v, want 400 invalid_field", bad, st, r)
		}
	}
	c, w = dial(t, h, bob)
	if w["replayed"] != float64(2) {
		t.Fatalf("replayed after http ack = %v, want 2", w["replayed"])
	}
	wantSeqs(t, "after http ack", seqs(t, readSignals(t, c, 2)), 5, 6)
	// A bad ack frame gets an error frame; the connection stays up.
	writeFrame(t, c, map[string]any{"type": "ack"})
	if f := readFrame(t, c); f["type"] != "error" || f["code"] != "invalid_field" {
		t.Fatalf("bad ack frame answered %v", f)
	}
	writeFrame(t, c, map[string]any{"type": "ack", "up_to_seq": 6})
	waitFor(t, "the last ack", func() bool { return pendingOf(t, h, "bob") == 0 })
	if got := metric(t, h, "marconi_signals_acked_total"); got != 6 {
		t.Errorf("marconi_signals_acked_total = %v, want 6", got)
	}
}

func TestDrain(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	alice := register(t, h, "alice", "claude_code")
	bob := register(t, h, "bob", "codex")
	ids := make([]any, 0, 5)
	for i := 1; i <= 5; i++ {
		ids = append(ids, send(t, h, alice, "bob", i)["signal_id"])
	}
	st, r := drain(t, h, bob, "?after_seq=0&limit=2")
	if st != 200 || r["next_after_seq"] != float64(2) {
		t.Fatalf("drain page 1: %d %v", st, r)
	}
	page := sigList(t, r["signals"])
	wantSeqs(t, "page 1", seqs(t, page), 1, 2)
	if page[0]["id"] != ids[0] || page[1]["id"] != ids[1] || page[0]["from_session"] != "alice" || page[0]["payload"] != float64(1) {
		t.Fatalf("page 1 = %v", page)
	}
	st, r = drain(t, h, bob, "?after_seq=2")
	if st != 200 || r["next_after_seq"] != float64(5) {
		t.Fatalf("drain page 2: %d %v", st, r)
	}
	wantSeqs(t, "page 2", seqs(t, sigList(t, r["signals"])), 3, 5)
	st, r = drain(t, h, bob, "?after_seq=5&limit=10")
	if st != 200 || r["next_after_seq"] != float64(5) || len(sigList(t, r["signals"])) != 0 {
		t.Fatalf("drain past the end: %d %v", st, r)
	}
	// Drain does not acknowledge: the same signals come again.
	st, r = drain(t, h, bob, "")
	if st != 200 || len(sigList(t, r["signals"])) != 5 {
		t.Fatalf("drain without params: %d %v", st, r)
	}
	// Acked signals leave the drain.
	call(t, "POST", h.URL+"/v1/signals/ack", bob.Token, map[string]any{"up_to_seq": 3})
	_, r = drain(t, h, bob, "?after_seq=0")
	wantSeqs(t, "after ack", seqs(t, sigList(t, r["signals"])), 4, 5)

	for _, q := range []string{"?after_seq=-1", "?after_seq=abc", "?limit=0", "?limit=-3", "?limit=x", "?after_seq=1.5"} {
		if st, r := drain(t, h, bob, q); st != 400 || errCode(r) != "invalid_field" {
			t.Errorf("drain %s: %d %v, want 400 invalid_field", q, st, r)
		}
	}
}

func TestPiggyback(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	alice := register(t, h, "alice", "claude_code")
	bob := register(t, h, "bob", "claude_code")
	for i := 1; i <= 55; i++ {
		send(t, h, bob, "alice", i)
	}
	// Alice has no queue: her send and her heartbeat carry her 50 oldest.
	r := send(t, h, alice, "bob", "hi")
	p := sigList(t, r["pending"])
	wantSeqs(t, "send piggyback", seqs(t, p), 1, 50)
	if p[0]["to_session"] != "alice" || p[0]["from_session"] != "bob" || p[0]["payload"] != float64(1) {
		t.Fatalf("pending[0] = %v", p[0])
	}
	st, hb := call(t, "POST", h.URL+"/v1/heartbeat", alice.Token, nil)
	if st != 200 {
		t.Fatalf("heartbeat: %d %v", st, hb)
	}
	wantSeqs(t, "heartbeat piggyback", seqs(t, sigList(t, hb["pending"])), 1, 50)
	// Acked ones leave it.
	call(t, "POST", h.URL+"/v1/signals/ack", alice.Token, map[string]any{"up_to_seq": 52})
	r = send(t, h, alice, "bob", "hi")
	wantSeqs(t, "piggyback after ack", seqs(t, sigList(t, r["pending"])), 53, 55)

	// With her queue attached nothing rides on the answers.
	c, _ := dial(t, h, alice)
	readSignals(t, c, 3)
	if r := send(t, h, alice, "bob", "hi"); len(sigList(t, r["pending"])) != 0 {
		t.Fatalf("send from attached alice carries pending: %v", r["pending"])
	}
	if _, hb := call(t, "POST", h.URL+"/v1/heartbeat", alice.Token, nil); len(sigList(t, hb["pending"])) != 0 || hb["route_state"] != "attached" {
		t.Fatalf("heartbeat of attached alice: %v", hb)
	}
}

func TestIdempotency(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	alice := register(t, h, "alice", "claude_code")
	bob := register(t, h, "bob", "claude_code")
	carol := register(t, h, "carol", "claude_code")
	c, _ := dial(t, h, bob)

	body := map[string]any{"to_session": "bob", "payload": "once", "idempotency_key": "k-1"}
	st, first := sendBody(t, h, alice, body)
	if st != 200 || first["duplicate"] != false {
		t.Fatalf("first send: %d %v", st, first)
	}
	st, again := sendBody(t, h, alice, body)
	if st != 200 || again["duplicate"] != true || again["signal_id"] != first["signal_id"] || again["seq"] != first["seq"] ||
		again["delivery"] != first["delivery"] || again["recipient_route_state"] != first["recipient_route_state"] {
		t.Fatalf("repeat send: %d %v, want the first answer %v with duplicate true", st, again, first)
	}
	// Another sender with the same key sends a new signal.
	st, other := sendBody(t, h, carol, body)
	if st != 200 || other["duplicate"] != false || other["signal_id"] == first["signal_id"] || seqOf(t, other) != 2 {
		t.Fatalf("same key from carol: %d %v", st, other)
	}
	// Bob got the first and carol's, and nothing for the repeat.
	got := readSignals(t, c, 2)
	if got[0]["id"] != first["signal_id"] || got[1]["id"] != other["signal_id"] {
		t.Fatalf("bob got %v", got)
	}
	send(t, h, alice, "bob", "marker")
	if f := readSignals(t, c, 1)[0]; f["payload"] != "marker" || seqOf(t, f) != 3 {
		t.Fatalf("after the marker bob got %v", f)
	}
	if n := pendingOf(t, h, "bob"); n != 3 {
		t.Fatalf("bob has %d stored signals, want 3", n)
	}
	if got := metric(t, h, "marconi_signals_sent_total", "delivery", "pushed_to_ws"); got != 3 {
		t.Errorf("sent_total{pushed_to_ws} = %v, want 3 (the duplicate is not counted)", got)
	}
	if got := metric(t, h, "marconi_signals_duplicate_total"); got != 1 {
		t.Errorf("duplicate_total = %v, want 1", got)
	}
}

func TestPayloadTooLarge(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{MaxPayloadBytes: 100}})
	alice := register(t, h, "alice", "claude_code")
	register(t, h, "bob", "claude_code")
	// A JSON string of 98 characters encodes to exactly the limit.
	if st, r := sendBody(t, h, alice, map[string]any{"to_session": "bob", "payload": strings.Repeat("a", 98)}); st != 200 {
		t.Fatalf("payload at the limit: %d %v", st, r)
	}
	for name, p := range map[string]string{"one over": strings.Repeat("a", 99), "far over": strings.Repeat("a", 100<<10)} {
		st, r := sendBody(t, h, alice, map[string]any{"to_session": "bob", "payload": p})
		if st != 413 || errCode(r) != "payload_too_large" {
			t.Errorf("%s: %d %v, want 413 payload_too_large", name, st, r)
		}
	}
	if n := pendingOf(t, h, "bob"); n != 1 {
		t.Fatalf("bob has %d stored signals, want only the one at the limit", n)
	}
}

func TestRecipientNotRegisteredAndTenantIsolation(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	alice := register(t, h, "alice", "claude_code")
	bob1 := register(t, h, "bob", "claude_code")

	st, r := call(t, "POST", h.URL+"/v1/ops/api_keys", h.AdminToken, map[string]any{"tenant_id": "t2", "project_id": "p1"})
	if st != 201 {
		t.Fatalf("create t2 key: %d %v", st, r)
	}
	t2Key := r["api_key"].(string)
	bob2 := registerWithKey(t, h, t2Key, "bob", "claude_code")
	registerWithKey(t, h, t2Key, "carol", "claude_code")
	dave2 := registerWithKey(t, h, t2Key, "dave", "claude_code")
	c2, _ := dial(t, h, bob2)

	for _, to := range []string{"nobody", "carol"} {
		st, r := sendBody(t, h, alice, map[string]any{"to_session": to, "payload": "x"})
		if st != 404 || errCode(r) != "recipient_not_registered" {
			t.Fatalf("send to %s: %d %v, want 404 recipient_not_registered", to, st, r)
		}
	}
	st, rs := call(t, "GET", h.URL+"/v1/ops/route_state/t2/p1/carol", h.AdminToken, nil)
	if st != 200 || rs["pending_signals"] != float64(0) {
		t.Fatalf("t2 carol after the refused send: %d %v", st, rs)
	}
	if rs := routeState(t, h, "carol"); rs["route_state"] != "not_registered" {
		t.Fatalf("t1 carol = %v", rs["route_state"])
	}

	// Same name, two tenants: t1's bob gets it, t2's attached bob never does.
	r = send(t, h, alice, "bob", "for t1 bob")
	if r["delivery"] != "queued_offline" || r["recipient_route_state"] != "route_without_queue" {
		t.Fatalf("send to t1 bob (offline) answered as if t2's attached bob: %v", r)
	}
	c1, _ := dial(t, h, bob1)
	if f := readSignals(t, c1, 1)[0]; f["payload"] != "for t1 bob" {
		t.Fatalf("t1 bob got %v", f)
	}
	send(t, h, dave2, "bob", "marker")
	if f := readSignals(t, c2, 1)[0]; f["payload"] != "marker" || f["from_session"] != "dave" || seqOf(t, f) != 1 {
		t.Fatalf("t2 bob's first signal is %v, want dave's marker with seq 1", f)
	}
	if _, d := drain(t, h, bob2, ""); len(sigList(t, d["signals"])) != 1 {
		t.Fatalf("t2 bob's store holds %v", d["signals"])
	}
	if got := metric(t, h, "marconi_signals_sent_total", "delivery", "queued_offline"); got != 1 {
		t.Errorf("sent_total{queued_offline} = %v, want 1 (refused sends are not counted)", got)
	}
}

func TestSecondWebSocketReplacesFirst(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	alice := register(t, h, "alice", "claude_code")
	bob := register(t, h, "bob", "claude_code")
	c1, _ := dial(t, h, bob)
	waitFor(t, "one connection", func() bool { return metric(t, h, "marconi_ws_connections") == 1 })
	c2, w := dial(t, h, bob)
	if w["resumed"] != true {
		t.Errorf("welcome of the replacing connection: resumed = %v, want true", w["resumed"])
	}
	_, _, err := c1.Read(t.Context())
	if code := closeStatus(err); code != 4409 {
		t.Fatalf("first connection closed with %d (%v), want 4409", code, err)
	}
	r := send(t, h, alice, "bob", "to the second")
	if r["delivery"] != "pushed_to_ws" {
		t.Fatalf("send after the replace: %v", r)
	}
	if f := readSignals(t, c2, 1)[0]; f["payload"] != "to the second" {
		t.Fatalf("second connection got %v", f)
	}
	waitFor(t, "the first handler to end", func() bool { return metric(t, h, "marconi_ws_connections") == 1 })
	if rs := routeState(t, h, "bob"); rs["route_state"] != "attached" {
		t.Fatalf("route_state after the replaced one ended: %v", rs["route_state"])
	}
	waitFor(t, "the replaced disconnect to be counted", func() bool {
		return metric(t, h, "marconi_ws_disconnects_total", "reason", "replaced") >= 1
	})
	if got := metric(t, h, "marconi_ws_disconnects_total", "reason", "replaced"); got != 1 {
		t.Errorf("disconnects{replaced} = %v after one replaced connection, want 1", got)
	}
}

// randomPayload is an incompressible string of about n bytes.
func randomPayload(n int) string {
	b := make([]byte, n/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func TestSlowConsumerClosedWith4429AndNothingLost(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{WSQueueSize: 2, SendRatePerSecond: 100000}})
	alice := register(t, h, "alice", "claude_code")
	bob := register(t, h, "bob", "claude_code")
	c, _ := dial(t, h, bob) // and then bob stops reading

	payload := randomPayload(60000)
	sent := 0
	for metric(t, h, "marconi_queue_drops_total", "reason", "slow_consumer") == 0 {
		if sent == 3000 {
			t.Fatalf("no slow-consumer drop after %d large signals", sent)
		}
		send(t, h, alice, "bob", payload)
		sent++
	}
	t.Logf("queue overflowed after %d signals", sent)
	drops := metric(t, h, "marconi_queue_drops_total", "reason", "slow_consumer")

	// The connection is being closed: it is no queue any more. A send now is
	// stored for later, not reported as pushed, and bob's heartbeat collects it.
	r := send(t, h, alice, "bob", "after the overflow")
	sent++
	if r["delivery"] != "queued_offline" || r["recipient_route_state"] != "route_without_queue" {
		t.Errorf("send to a closing slow consumer: delivery %v, route %v; want queued_offline, route_without_queue",
			r["delivery"], r["recipient_route_state"])
	}
	if got := metric(t, h, "marconi_queue_drops_total", "reason", "slow_consumer"); got != drops {
		t.Errorf("queue drops moved from %v to %v after the connection was already closing", drops, got)
	}

	// Bob reads again: the frames the hub had written, then 4429.
	var got []int64
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, data, err := c.Read(ctx)
		cancel()
		if err != nil {
			if code := closeStatus(err); code != 4429 {
				t.Fatalf("after %d frames the connection ended with %d (%v), want 4429", len(got), code, err)
			}
			break
		}
		var f map[string]any
		if err := json.Unmarshal(data, &f); err != nil || f["type"] != "signal" {
			t.Fatalf("frame %q", data)
		}
		got = append(got, seqOf(t, f))
	}
	if len(got) > 0 {
		wantSeqs(t, "before 4429", got, 1, int64(len(got)))
	}
	if len(got) >= sent {
		t.Fatalf("bob got all %d signals before the close: the queue never overflowed", sent)
	}
	waitFor(t, "the slow consumer's disconnect", func() bool {
		return metric(t, h, "marconi_ws_disconnects_total", "reason", "slow_consumer") == 1
	})

	// Nothing is lost: the next attach replays every signal, in order.
	c, w := dial(t, h, bob)
	if w["replayed"] != float64(sent) {
		t.Fatalf("replayed = %v, want %d", w["replayed"], sent)
	}
	wantSeqs(t, "after reattach", seqs(t, readSignals(t, c, sent)), 1, int64(sent))
}

func TestFrameOverReadLimitCloses1009(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{WSReadLimit: 1024}})
	bob := register(t, h, "bob", "claude_code")
	c, _ := dial(t, h, bob)
	writeFrame(t, c, map[string]any{"type": "ack", "up_to_seq": 0, "pad": strings.Repeat("x", 2048)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, err := c.Read(ctx)
	if code := closeStatus(err); code != 1009 {
		t.Fatalf("closed with %d (%v), want 1009", code, err)
	}
	waitFor(t, "the detach", func() bool { return routeState(t, h, "bob")["route_state"] == "route_without_queue" })
	if got := metric(t, h, "marconi_ws_disconnects_total", "reason", "message_too_big"); got != 1 {
		t.Errorf("disconnects{message_too_big} = %v, want 1", got)
	}
}

func TestPongTimeoutDetaches(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{WSPingInterval: 200 * time.Millisecond}})
	bob := register(t, h, "bob", "claude_code")
	dial(t, h, bob) // never reads again, so never answers a ping
	if rs := routeState(t, h, "bob"); rs["route_state"] != "attached" {
		t.Fatalf("route_state right after attach = %v", rs["route_state"])
	}
	waitFor(t, "the silent peer to be dropped", func() bool {
		return routeState(t, h, "bob")["route_state"] == "route_without_queue"
	})
	if rs := routeState(t, h, "bob"); rs["queue"].(map[string]any)["attached"] != false {
		t.Fatalf("queue after the drop: %v", rs["queue"])
	}
	waitFor(t, "the ping_timeout count", func() bool {
		return metric(t, h, "marconi_ws_disconnects_total", "reason", "ping_timeout") == 1
	})
	if got := metric(t, h, "marconi_ws_connections"); got != 0 {
		t.Errorf("marconi_ws_connections = %v, want 0", got)
	}
}

func TestPingAnsweredKeepsConnection(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{WSPingInterval: 50 * time.Millisecond}})
	alice := register(t, h, "alice", "claude_code")
	bob := register(t, h, "bob", "claude_code")
	c, _ := dial(t, h, bob)
	// A client that reads answers pings: after many intervals it is still attached.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	frames := make(chan []byte, 16)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(frames)
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				return
			}
			frames <- data
		}
	})
	defer wg.Wait()
	defer cancel()
	// Each answered ping is proof of life: wait for several of them.
	seen := map[any]bool{}
	waitFor(t, "several answered pings", func() bool {
		seen[routeState(t, h, "bob")["store"].(map[string]any)["last_seen_at"]] = true
		return len(seen) >= 4
	})
	if rs := routeState(t, h, "bob"); rs["route_state"] != "attached" {
		t.Fatalf("a peer answering pings was dropped: %v", rs["route_state"])
	}
	send(t, h, alice, "bob", "still here")
	select {
	case data := <-frames:
		if !strings.Contains(string(data), "still here") {
			t.Fatalf("frame %s", data)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no frame")
	}
}

func TestRouteStateEachStateAndList(t *testing.T) {
	clock := hubtest.NewClock(time.Now().UTC().Truncate(time.Second))
	h := hubtest.Start(t, hubtest.Options{Now: clock.Now})
	alice := register(t, h, "alice", "claude_code")
	register(t, h, "stale-one", "codex")
	clock.Advance(301 * time.Second)
	register(t, h, "fresh", "claude_code")
	c, _ := dial(t, h, alice)
	send(t, h, alice, "fresh", "x")

	check := func(session, state string) map[string]any {
		t.Helper()
		rs := routeState(t, h, session)
		if rs["route_state"] != state || rs["session_id"] != session || rs["tenant_id"] != "t1" || rs["project_id"] != "p1" {
			t.Fatalf("%s: route_state %v, want %s", session, rs, state)
		}
		if state == "not_registered" {
			return rs
		}
		for _, k := range []string{"queue", "store", "freshest_proof_of_life", "proof_of_life_age_seconds", "freshness_seconds", "selfheal", "pending_signals"} {
			if _, ok := rs[k]; !ok {
				t.Errorf("%s: route_state lacks %s: %v", session, k, rs)
			}
		}
		q := rs["queue"].(map[string]any)
		for _, k := range []string{"attached", "instance_id", "instance_healthy", "attached_at"} {
			if _, ok := q[k]; !ok {
				t.Errorf("%s: queue lacks %s: %v", session, k, q)
			}
		}
		s := rs["store"].(map[string]any)
		for _, k := range []string{"surface", "registered_at", "last_seen_at", "last_verb_at", "expires_at", "runtime_mode", "runtime_mode_source"} {
			if _, ok := s[k]; !ok {
				t.Errorf("%s: store lacks %s: %v", session, k, s)
			}
		}
		sh := rs["selfheal"].(map[string]any)
		for _, k := range []string{"enabled", "eligible_surface", "recipient_tokens", "sender_tokens"} {
			if _, ok := sh[k]; !ok {
				t.Errorf("%s: selfheal lacks %s: %v", session, k, sh)
			}
		}
		if rs["freshness_seconds"] != float64(300) {
			t.Errorf("%s: freshness_seconds = %v", session, rs["freshness_seconds"])
		}
		return rs
	}

	rs := check("alice", "attached")
	if q := rs["queue"].(map[string]any); q["attached"] != true || q["instance_id"] != "test-1" || q["instance_healthy"] != true || q["attached_at"] == nil {
		t.Errorf("attached queue = %v", q)
	}
	rs = check("fresh", "route_without_queue")
	if q := rs["queue"].(map[string]any); q["attached"] != false || q["attached_at"] != nil {
		t.Errorf("fresh queue = %v", q)
	}
	if rs["pending_signals"] != float64(1) || rs["proof_of_life_age_seconds"] != float64(0) {
		t.Errorf("fresh: pending %v age %v", rs["pending_signals"], rs["proof_of_life_age_seconds"])
	}
	rs = check("stale-one", "stale")
	if rs["proof_of_life_age_seconds"] != float64(301) || rs["store"].(map[string]any)["surface"] != "codex" ||
		rs["selfheal"].(map[string]any)["eligible_surface"] != false {
		t.Errorf("stale: %v", rs)
	}
	check("ghost", "not_registered")

	// A second tenant's session, to see the tenant filter work.
	_, k := call(t, "POST", h.URL+"/v1/ops/api_keys", h.AdminToken, map[string]any{"tenant_id": "t2", "project_id": "p2"})
	registerWithKey(t, h, k["api_key"].(string), "other", "claude_code")

	list := func(q string) []string {
		t.Helper()
		st, r := call(t, "GET", h.URL+"/v1/ops/route_state"+q, h.AdminToken, nil)
		if st != 200 {
			t.Fatalf("list %s: %d %v", q, st, r)
		}
		var ids []string
		for _, s := range r["sessions"].([]any) {
			m := s.(map[string]any)
			ids = append(ids, m["tenant_id"].(string)+"/"+m["session_id"].(string))
		}
		return ids
	}
	for q, want := range map[string]string{
		"":                                   "t1/alice t1/fresh t1/stale-one t2/other",
		"?tenant_id=t1":                      "t1/alice t1/fresh t1/stale-one",
		"?tenant_id=t2&project_id=p2":        "t2/other",
		"?tenant_id=t2&project_id=p1":        "",
		"?state=attached":                    "t1/alice",
		"?state=route_without_queue":         "t1/fresh t2/other",
		"?state=stale":                       "t1/stale-one",
		"?tenant_id=t1&limit=2":              "t1/alice t1/fresh",
		"?state=route_without_queue&limit=1": "t1/fresh",
	} {
		if got := strings.Join(list(q), " "); got != want {
			t.Errorf("list %q = %q, want %q", q, got, want)
		}
	}
	for _, q := range []string{"?state=bogus", "?state=not_registered", "?limit=0", "?limit=x", "?limit=100000"} {
		if st, r := call(t, "GET", h.URL+"/v1/ops/route_state"+q, h.AdminToken, nil); st != 400 || errCode(r) != "invalid_field" {
			t.Errorf("list %s: %d %v, want 400 invalid_field", q, st, r)
		}
	}
	closeWS(c)
}

func TestSendRateLimit(t *testing.T) {
	clock := hubtest.NewClock(time.Now().UTC())
	h := hubtest.Start(t, hubtest.Options{Now: clock.Now, Config: hub.Config{SendRatePerSecond: 1}})
	alice := register(t, h, "alice", "claude_code")
	carol := register(t, h, "carol", "claude_code")
	register(t, h, "bob", "claude_code")
	post := func(from agent) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("POST", h.URL+"/v1/signals", strings.NewReader(`{"to_session":"bob","payload":1}`))
		req.Header.Set("Authorization", "Bearer "+from.Token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	for i := 1; i <= 2; i++ {
		if resp := post(alice); resp.StatusCode != 200 {
			t.Fatalf("send %d within the burst: %d", i, resp.StatusCode)
		}
	}
	resp := post(alice)
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != 429 || errCode(body) != "too_many_requests" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third send: %d %v Retry-After %q, want 429 too_many_requests with Retry-After", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	// The limit is per session, and refills with time.
	if resp := post(carol); resp.StatusCode != 200 {
		t.Fatalf("carol's send: %d", resp.StatusCode)
	}
	clock.Advance(time.Second)
	if resp := post(alice); resp.StatusCode != 200 {
		t.Fatalf("alice's send a second later: %d", resp.StatusCode)
	}
	if n := pendingOf(t, h, "bob"); n != 4 {
		t.Fatalf("bob has %d signals, want 4 (the refused one is not stored)", n)
	}
}

func TestConnectionMetrics(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	bob := register(t, h, "bob", "claude_code")
	carol := register(t, h, "carol", "claude_code")
	cb, _ := dial(t, h, bob)
	cc, _ := dial(t, h, carol)
	waitFor(t, "two connections", func() bool { return metric(t, h, "marconi_ws_connections") == 2 })
	closeWS(cb)
	waitFor(t, "one connection", func() bool { return metric(t, h, "marconi_ws_connections") == 1 })
	// The gauge and the counter move one after the other: poll for both.
	waitFor(t, "disconnects{client_closed} = 1", func() bool {
		return metric(t, h, "marconi_ws_disconnects_total", "reason", "client_closed") == 1
	})
	cc.CloseNow() // no close frame: the connection is lost
	waitFor(t, "no connection", func() bool { return metric(t, h, "marconi_ws_connections") == 0 })
	waitFor(t, "disconnects{connection_lost} = 1", func() bool {
		return metric(t, h, "marconi_ws_disconnects_total", "reason", "connection_lost") == 1
	})
	// Shutdown closes the rest with 1012.
	cb, _ = dial(t, h, bob)
	closed := make(chan error, 1)
	go func() {
		_, _, err := cb.Read(context.Background())
		closed <- err
	}()
	h.Close()
	err := <-closed
	if code := closeStatus(err); code != 1012 {
		t.Fatalf("shutdown closed with %d (%v), want 1012", code, err)
	}
	if got := metric(t, h, "marconi_ws_disconnects_total", "reason", "shutdown"); got != 1 {
		t.Errorf("disconnects{shutdown} = %v, want 1", got)
	}
}
