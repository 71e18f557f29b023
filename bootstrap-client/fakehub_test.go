package bootstrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/internal/testwait"
)

// fakeHub speaks just enough of the wire contract to drive the client's
// reactions to each hub answer from the outside: scripted send answers, close
// codes, wrong_instance, session_expired. The real hub's behaviour is pinned
// by the integration tests against hubtest.
type fakeHub struct {
	t   *testing.T
	srv *httptest.Server
	// front is another "instance" sharing the hub's state whose /v1/ws
	// answers 409 wrong_instance pointing at srv.
	front *httptest.Server

	mu            sync.Mutex
	token         string
	tokens        int
	registers     []int // statuses answered by POST /v1/sessions
	attaches      int
	conn          *websocket.Conn
	acks          []int64
	affinityReset bool
	replay        []Signal
	sendAnswer    func(n int) (int, any) // status and body of the n-th send (from 1)
	sends         int
	expired       bool // the next session call answers 410
	connDone      chan struct{}
	closedWith    websocket.StatusCode // how the client closed the last WebSocket
	hbSeconds     int                  // heartbeat interval the registration answers; default 3600
	hbPending     []Signal             // pending in every heartbeat answer
	heartbeats    int
	httpAcks      []int64
	wsRefused     bool     // /v1/ws answers 503
	wsStalled     bool     // /v1/ws never answers the upgrade
	wsRefusals    int      // /v1/ws answers refused with 503
	drainedAfter  []string // after_seq of each GET /v1/signals
	// drainAnswer, when set, answers GET /v1/signals asked after_seq and
	// history; ackAnswer, when set, POST /v1/signals/ack.
	drainAnswer func(after, history string) drainResponse
	ackAnswer   func(ackRequest) (int, any)
	drains      []string // "after@history" of each GET /v1/signals
	ackCalls    []string // "up_to_seq@history" of each POST /v1/signals/ack
}

func newFakeHub(t *testing.T) *fakeHub {
	h := &fakeHub{t: t}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sessions", h.register)
	mux.HandleFunc("GET /v1/ws", h.ws)
	mux.HandleFunc("POST /v1/signals", h.send)
	mux.HandleFunc("POST /v1/heartbeat", func(w http.ResponseWriter, r *http.Request) {
		if h.auth(w, r) {
			h.mu.Lock()
			h.heartbeats++
			pending := h.hbPending
			h.mu.Unlock()
			writeJSON(w, 200, map[string]any{"route_state": "route_without_queue", "pending": pending})
		}
	})
	mux.HandleFunc("GET /v1/signals", func(w http.ResponseWriter, r *http.Request) {
		if h.auth(w, r) {
			q := r.URL.Query()
			h.mu.Lock()
			h.drainedAfter = append(h.drainedAfter, q.Get("after_seq"))
			h.drains = append(h.drains, q.Get("after_seq")+"@"+q.Get("history"))
			answer := h.drainAnswer
			h.mu.Unlock()
			if answer != nil {
				writeJSON(w, 200, answer(q.Get("after_seq"), q.Get("history")))
				return
			}
			writeJSON(w, 200, map[string]any{"signals": []Signal{}, "next_after_seq": 0})
		}
	})
	mux.HandleFunc("POST /v1/signals/ack", func(w http.ResponseWriter, r *http.Request) {
		if h.auth(w, r) {
			var a ackRequest
			_ = json.NewDecoder(r.Body).Decode(&a)
			h.mu.Lock()
			h.httpAcks = append(h.httpAcks, a.UpToSeq)
			h.ackCalls = append(h.ackCalls, fmt.Sprintf("%d@%s", a.UpToSeq, a.History))
			answer := h.ackAnswer
			h.mu.Unlock()
			if answer != nil {
				status, body := answer(a)
				writeJSON(w, status, body)
				return
			}
			writeJSON(w, 200, map[string]any{"acked": 0})
		}
	})
	h.srv = httptest.NewServer(mux)
	h.front = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/ws" {
			writeJSON(w, 409, map[string]any{"error": map[string]any{"code": marconi.CodeWrongInstance, "message": "elsewhere", "instance_id": "b", "instance_url": h.srv.URL + "/"}})
			return
		}
		mux.ServeHTTP(w, r)
	}))
	return h
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func hubError(w http.ResponseWriter, status int, code marconi.Code) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": code, "message": code}})
}

// close ends the live WebSocket, then the server.
func (h *fakeHub) close() {
	h.mu.Lock()
	conn := h.conn
	h.mu.Unlock()
	if conn != nil {
		_ = conn.CloseNow()
	}
	h.srv.Close()
	h.front.Close()
}

func (h *fakeHub) register(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer key" {
		hubError(w, 401, "unauthorized")
		return
	}
	var req registerRequest
	_ = json.NewDecoder(r.Body).Decode(&req)
	h.mu.Lock()
	defer h.mu.Unlock()
	status := 201
	if presented := r.Header.Get("X-Marconi-Session-Token"); presented != "" && presented == h.token && !h.expired {
		status = 200
	}
	h.expired = false
	h.tokens++
	h.token = fmt.Sprintf("tok%d", h.tokens)
	h.registers = append(h.registers, status)
	id := req.SessionID
	if id == "" {
		id = "s1"
	}
	hb := h.hbSeconds
	if hb == 0 {
		hb = 3600
	}
	writeJSON(w, status, map[string]any{"session_id": id, "token": h.token, "heartbeat_interval_seconds": hb})
}

// auth checks the session token; false when it answered.
func (h *fakeHub) auth(w http.ResponseWriter, r *http.Request) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.expired:
		hubError(w, 410, marconi.CodeSessionExpired)
	case r.Header.Get("Authorization") != "Bearer "+h.token:
		hubError(w, 401, "unauthorized")
	default:
		return true
	}
	return false
}

func (h *fakeHub) ws(w http.ResponseWriter, r *http.Request) {
	if !h.auth(w, r) {
		return
	}
	h.mu.Lock()
	refused, stalled := h.wsRefused, h.wsStalled
	h.mu.Unlock()
	if refused {
		h.mu.Lock()
		h.wsRefusals++
		h.mu.Unlock()
		hubError(w, 503, "draining")
		return
	}
	if stalled { // as a path that died silently: the request goes nowhere
		<-r.Context().Done()
		return
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	h.mu.Lock()
	h.attaches++
	h.conn = conn
	done := make(chan struct{})
	h.connDone = done
	reset, replay := h.affinityReset, h.replay
	h.mu.Unlock()
	defer close(done)
	ctx := r.Context()
	_ = writeFrame(ctx, conn, map[string]any{"type": "welcome", "session_id": "s1", "instance_id": "a", "affinity_reset": reset, "replayed": len(replay)})
	for _, s := range replay {
		_ = writeFrame(ctx, conn, frame{Type: "signal", Signal: s})
	}
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			h.mu.Lock()
			h.closedWith = websocket.CloseStatus(err)
			h.mu.Unlock()
			return
		}
		var a ackRequest
		if json.Unmarshal(data, &a) == nil && a.Type == "ack" {
			h.mu.Lock()
			h.acks = append(h.acks, a.UpToSeq)
			h.mu.Unlock()
		}
	}
}

func writeFrame(ctx context.Context, conn *websocket.Conn, v any) error {
	b, _ := json.Marshal(v)
	return conn.Write(ctx, websocket.MessageText, b)
}

func (h *fakeHub) send(w http.ResponseWriter, r *http.Request) {
	if !h.auth(w, r) {
		return
	}
	h.mu.Lock()
	h.sends++
	n, answer := h.sends, h.sendAnswer
	h.mu.Unlock()
	if answer == nil {
		writeJSON(w, 200, map[string]any{"signal_id": fmt.Sprint("sig", n), "seq": n, "delivery": "pushed_to_ws", "recipient_route_state": "attached"})
		return
	}
	status, body := answer(n)
	writeJSON(w, status, body)
}

// closeWS closes the live WebSocket from the hub's side with code.
func (h *fakeHub) closeWS(code websocket.StatusCode) {
	h.mu.Lock()
	conn, done := h.conn, h.connDone
	h.mu.Unlock()
	_ = conn.Close(code, "test")
	<-done
}

func (h *fakeHub) attachCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.attaches
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.For(t, what, 5*time.Second, cond)
}

func dialFake(t *testing.T, url string, cfg Config) *Client {
	t.Helper()
	cfg.HubURL, cfg.APIKey, cfg.Surface = url, "key", "claude_code"
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	cfg.ReconnectBaseDelay = time.Millisecond
	if cfg.ReconnectMaxDelay == 0 {
		cfg.ReconnectMaxDelay = 10 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	return c
}

func TestFakeWrongInstanceWelcomeReplayAndAck(t *testing.T) {
	home := newFakeHub(t)
	defer home.close()
	home.affinityReset = true
	home.replay = []Signal{{ID: "a", Seq: 1}, {ID: "b", Seq: 2}, {ID: "a", Seq: 1}, {ID: "c", Seq: 3}}

	var mu sync.Mutex
	var events []string
	c := dialFake(t, home.front.URL, Config{
		OnSignal:        func(s Signal) { mu.Lock(); events = append(events, s.ID); mu.Unlock() },
		OnAffinityReset: func() { mu.Lock(); events = append(events, "reset"); mu.Unlock() },
	})
	defer c.Close()
	eventually(t, "three signals", func() bool { mu.Lock(); defer mu.Unlock(); return len(events) == 4 })
	mu.Lock()
	if got := strings.Join(events, ","); got != "reset,a,b,c" {
		t.Errorf("handler saw %s, want reset,a,b,c (reset first, duplicate dropped)", got)
	}
	mu.Unlock()
	if n := home.attachCount(); n != 1 {
		t.Errorf("attaches on the home instance = %d, want 1 (wrong_instance followed)", n)
	}
	eventually(t, "ack up to 3", func() bool {
		home.mu.Lock()
		defer home.mu.Unlock()
		return len(home.acks) > 0 && home.acks[len(home.acks)-1] == 3
	})
	// Stats.Acks counts the ack frames the hub read (the count moves
	// once the write has returned, so it may trail the hub's by a moment).
	eventually(t, "Stats.Acks to count the hub's ack frames", func() bool {
		home.mu.Lock()
		defer home.mu.Unlock()
		return c.Stats().Acks == len(home.acks)
	})
}

// staleAnswer answers sends as a hub that has no queue for the sender until
// its first reattachment (sender), and none for the recipient (recipient).
func (h *fakeHub) staleAnswer(sender, recipient bool) func(int) (int, any) {
	return func(n int) (int, any) {
		body := map[string]any{"signal_id": fmt.Sprint("sig", n), "seq": n, "delivery": "queued_offline",
			"recipient_route_state": "route_without_queue", "selfheal_outcome": "attempted"}
		if sender && h.attachCount() == 1 {
			body["sender_route_stale"] = true
		}
		if recipient {
			body["recipient_route_stale"] = true
		}
		return 200, body
	}
}

func TestFakeSenderRouteStaleReconnectsOnce(t *testing.T) {
	h := newFakeHub(t)
	defer h.close()
	c := dialFake(t, h.srv.URL, Config{})
	defer c.Close()

	h.mu.Lock()
	h.sendAnswer = h.staleAnswer(true, true)
	h.mu.Unlock()
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Send(context.Background(), "peer", "", "hi")
			if err != nil {
				t.Errorf("Send = %+v, %v", res, err)
			}
		}()
	}
	wg.Wait()
	eventually(t, "the reconnect", func() bool { return c.Stats().Reconnects == 1 && h.attachCount() == 2 })
	if got := c.Stats(); got.SelfHealReconnects != 1 {
		t.Errorf("stats %+v after 20 concurrent stale answers, want exactly one self-heal reconnect", got)
	}
	h.mu.Lock()
	if st := h.registers; len(st) != 1 || st[0] != 201 {
		t.Errorf("register answers %v: the reconnect must attach with the token it holds, not rotate it (a resume whose answer is lost would strand the client)", st)
	}
	h.mu.Unlock()

}

func TestFakeRecipientRouteStaleAloneChangesNothing(t *testing.T) {
	h := newFakeHub(t)
	defer h.close()
	c := dialFake(t, h.srv.URL, Config{})
	defer c.Close()
	h.mu.Lock()
	h.sendAnswer = h.staleAnswer(false, true)
	h.mu.Unlock()
	for range 5 {
		res, err := c.Send(context.Background(), "peer", "k", nil)
		if err != nil || !res.RecipientRouteStale || res.SenderRouteStale {
			t.Fatalf("Send = %+v, %v", res, err)
		}
	}
	c.mu.Lock()
	pending := len(c.heal)
	c.mu.Unlock()
	if got := c.Stats(); got != (Stats{}) || pending != 0 || h.attachCount() != 1 {
		t.Errorf("stats %+v, wake-ups %d, attaches %d: recipient_route_stale alone must cause nothing", got, pending, h.attachCount())
	}
}

func TestFakeReplacedIsNotRedialed(t *testing.T) {
	h := newFakeHub(t)
	defer h.close()
	c := dialFake(t, h.srv.URL, Config{})
	defer c.Close()
	h.closeWS(marconi.CloseReplaced)
	eventually(t, "the client to stand down", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.stopped
	})
	if n := h.attachCount(); n != 1 || c.Stats().Reconnects != 0 {
		t.Errorf("attaches %d, stats %+v after 4409: the client fought the newer connection", n, c.Stats())
	}
}

func TestFakeRestartingHubIsRedialed(t *testing.T) {
	for _, code := range []websocket.StatusCode{websocket.StatusServiceRestart, 4429} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			h := newFakeHub(t)
			defer h.close()
			c := dialFake(t, h.srv.URL, Config{})
			defer c.Close()
			h.closeWS(code)
			eventually(t, "the redial", func() bool { return c.Stats().Reconnects == 1 && h.attachCount() == 2 })
			if got := c.Stats(); got.SelfHealReconnects != 0 || got.Reregistrations != 0 {
				t.Errorf("stats %+v", got)
			}
		})
	}
}

func TestFakeSessionExpiredReregisters(t *testing.T) {
	h := newFakeHub(t)
	defer h.close()
	c := dialFake(t, h.srv.URL, Config{SessionID: "agent-7"})
	defer c.Close()
	h.mu.Lock()
	h.expired = true
	h.mu.Unlock()
	res, err := c.Send(context.Background(), "peer", "", 1)
	if err != nil || res.SignalID == "" {
		t.Fatalf("Send after expiry = %+v, %v: want it re-registered and retried", res, err)
	}
	eventually(t, "the reattach", func() bool { return h.attachCount() == 2 })
	if got := c.Stats(); got.Reregistrations != 1 {
		t.Errorf("stats %+v, want one re-registration", got)
	}
	if c.SessionID() != "agent-7" {
		t.Errorf("session id %q after re-registration, want the same agent-7", c.SessionID())
	}
	h.mu.Lock()
	if st := h.registers; len(st) != 2 || st[1] != 201 {
		t.Errorf("register answers %v, want a new registration (201)", st)
	}
	h.mu.Unlock()
}

// A call answered 410 while Deregister is under way (a heartbeat that
// raced the DELETE) does not register the session again: the agent asked
// for it to end, and a new registration would outlive the client until its
// TTL.
func TestFakeNoReregistrationWhileDeregistering(t *testing.T) {
	h := newFakeHub(t)
	defer h.close()
	c := dialFake(t, h.srv.URL, Config{SessionID: "agent-7"})
	defer c.Close()
	c.mu.Lock()
	c.ending = true // as Deregister sets it before its DELETE
	c.mu.Unlock()
	h.mu.Lock()
	h.expired = true
	h.mu.Unlock()
	_, err := c.Send(context.Background(), "peer", "", 1)
	if !errors.Is(err, errEnding) {
		t.Fatalf("Send answered 410 while deregistering = %v, want errEnding", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.registers) != 1 {
		t.Errorf("register answers %v, want the dial's only", h.registers)
	}
	if got := c.Stats().Reregistrations; got != 0 {
		t.Errorf("Reregistrations = %d, want 0", got)
	}
}

// TestFakeDrainAfterReregistrationStartsAtZero: signals 1..3 of the first
// registration were delivered; the session is registered again, and while
// its WebSocket cannot attach the client drains over HTTP. The new
// registration numbers its signals from 1, so the drain must ask from 0,
// not after 3 (which would skip them until the WebSocket attaches).
func TestFakeDrainAfterReregistrationStartsAtZero(t *testing.T) {
	h := newFakeHub(t)
	defer h.close()
	h.replay = []Signal{{ID: "a", Seq: 1}, {ID: "b", Seq: 2}, {ID: "c", Seq: 3}}
	var got atomic.Int32
	c := dialFake(t, h.srv.URL, Config{SessionID: "agent-8", OnSignal: func(Signal) { got.Add(1) }})
	defer c.Close()
	eventually(t, "the first registration's three signals", func() bool { return got.Load() == 3 })

	h.mu.Lock()
	h.replay, h.expired, h.wsRefused = nil, true, true
	h.mu.Unlock()
	if _, err := c.Send(context.Background(), "peer", "", 1); err != nil {
		t.Fatalf("Send after expiry: %v", err)
	}
	eventually(t, "a drain while the WebSocket is refused", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.drainedAfter) > 0
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, after := range h.drainedAfter {
		if after != "0" {
			t.Fatalf("drains after the re-registration asked after_seq=%v, want 0 each time", h.drainedAfter)
		}
	}
}

// TestFakeRestartCapsTheBackoff: after a close with 1012 the hub is
// restarting, and the redial's backoff ceiling is ReconnectRestartMaxDelay,
// not ReconnectMaxDelay. With an hour's cap, the 30 refused attempts here
// would reach ceilings of minutes (1 ms doubled 30 times); capped at 5 ms
// they take well under the test's deadline.
func TestFakeRestartCapsTheBackoff(t *testing.T) {
	h := newFakeHub(t)
	defer h.close()
	c := dialFake(t, h.srv.URL, Config{ReconnectMaxDelay: time.Hour, ReconnectRestartMaxDelay: 5 * time.Millisecond})
	defer c.Close()
	const refusals = 30
	h.mu.Lock()
	h.wsRefused = true
	conn := h.conn
	h.mu.Unlock()
	_ = conn.Close(websocket.StatusServiceRestart, "restarting")
	eventually(t, "the refused redials", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.wsRefusals >= refusals {
			h.wsRefused = false
		}
		return !h.wsRefused
	})
	eventually(t, "the attach after the restart", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.attaches == 2
	})
}

// TestFakeStalledUpgradeIsBounded: an upgrade request that is never answered
// (a pooled connection whose path died silently) fails after the attach
// timeout instead of holding Dial, or a redial, forever.
func TestFakeStalledUpgradeIsBounded(t *testing.T) {
	h := newFakeHub(t)
	defer h.close()
	h.wsStalled = true
	defer func(d time.Duration) { welcomeTimeout = d }(welcomeTimeout)
	welcomeTimeout = 200 * time.Millisecond
	_, err := Dial(context.Background(), Config{HubURL: h.srv.URL, APIKey: "key", Surface: "claude_code"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial against an upgrade never answered = %v, want the attach timeout", err)
	}
}

func TestFakeDialErrorsAreTyped(t *testing.T) {
	h := newFakeHub(t)
	defer h.close()
	_, err := Dial(context.Background(), Config{HubURL: h.srv.URL, APIKey: "wrong", Surface: "claude_code"})
	var he *Error
	if !errorsAs(err, &he) || he.Status != 401 || he.Code != "unauthorized" {
		t.Fatalf("Dial with a bad key = %v, want *Error 401 unauthorized", err)
	}
}

func TestFakeCloseIsNormalAndLeavesNothing(t *testing.T) {
	h := newFakeHub(t)
	c := dialFake(t, h.srv.URL, Config{OnSignal: func(Signal) {}})
	if _, err := c.Send(context.Background(), "peer", "", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	done := h.connDone
	h.mu.Unlock()
	<-done
	h.mu.Lock()
	code := h.closedWith
	h.mu.Unlock()
	if code != websocket.StatusNormalClosure {
		t.Errorf("hub saw the WebSocket end with %v, want 1000", code)
	}
	if _, err := c.Send(context.Background(), "peer", "", nil); err == nil {
		t.Error("Send after Close succeeded")
	}
	_ = c.Close() // idempotent
	h.close()
	goleak.VerifyNone(t)
}

// Heartbeat answers' pending signals reach the handler; with the WebSocket
// down they are acknowledged over HTTP.
func TestFakeHeartbeatPendingDeliveredAndAckedOverHTTP(t *testing.T) {
	h := newFakeHub(t)
	defer h.close()
	h.hbSeconds = 1
	h.hbPending = []Signal{{ID: "p1", Seq: 1}, {ID: "p2", Seq: 2}}
	var mu sync.Mutex
	var got []string
	c := dialFake(t, h.srv.URL, Config{OnSignal: func(s Signal) { mu.Lock(); got = append(got, s.ID); mu.Unlock() }})
	defer c.Close()
	c.mu.Lock()
	c.conn = nil // as if the WebSocket were down: acks must go over HTTP
	c.mu.Unlock()
	eventually(t, "two heartbeats", func() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.heartbeats >= 2 })
	eventually(t, "the HTTP ack", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.httpAcks) > 0 && h.httpAcks[len(h.httpAcks)-1] == 2
	})
	eventually(t, "Stats.Acks to count the HTTP acks", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return c.Stats().Acks == len(h.httpAcks)
	})
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(got, ",") != "p1,p2" {
		t.Errorf("handler saw %v across repeated heartbeats, want p1,p2 once each", got)
	}
}

// A 409 wrong_instance whose instance_url the session token may not go to
// is not followed: plain http named by a hub reached over https (the token
// would cross the network in clear), or a loopback address named to a
// client that reaches its hub by another name. The attach fails with the
// hub's error, and the named instance is never asked.
func TestFakeWrongInstanceNotFollowedWhereTheTokenMayNotGo(t *testing.T) {
	home := newFakeHub(t)
	defer home.close()
	for _, tt := range []struct{ name, instanceURL string }{
		{"http from an https hub", home.srv.URL},
		{"not a URL", "ftp://" + home.srv.Listener.Addr().String()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			front := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v1/ws" {
					writeJSON(w, 409, map[string]any{"error": map[string]any{"code": marconi.CodeWrongInstance, "message": "elsewhere", "instance_id": "b", "instance_url": tt.instanceURL}})
					return
				}
				home.srv.Config.Handler.ServeHTTP(w, r)
			}))
			defer front.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := Dial(ctx, Config{HubURL: front.URL, APIKey: "key", Surface: "claude_code", HTTPClient: front.Client()})
			if err == nil {
				_ = c.Close()
				t.Fatal("Dial attached through a wrong_instance it must not follow")
			}
			var he *Error
			if !errors.As(err, &he) || he.Code != marconi.CodeWrongInstance {
				t.Fatalf("Dial: %v, want the hub's wrong_instance", err)
			}
			if n := home.attachCount(); n != 0 {
				t.Fatalf("the named instance was asked %d times", n)
			}
		})
	}
}

func TestTokenURL(t *testing.T) {
	for _, tt := range []struct {
		hubs      []string
		raw, want string
	}{
		{[]string{"https://hub.example"}, "https://i1.example/", "https://i1.example"},
		{[]string{"https://hub.example"}, "http://i1.example", ""},
		{[]string{"http://hub.example"}, "http://i1.example", "http://i1.example"},
		{[]string{"https://hub.example"}, "https://127.0.0.1:8080", ""},
		{[]string{"http://127.0.0.1:9000"}, "http://127.0.0.1:8080", "http://127.0.0.1:8080"},
		{[]string{"https://hub.example"}, "https://u:p@i1.example", ""},
		{[]string{"https://hub.example"}, "https://i1.example/?x=1", ""},
		{[]string{"https://hub.example"}, "wss://i1.example", ""},
		{[]string{"https://hub.example"}, "", ""},
	} {
		if got := tokenURL(tt.hubs, tt.raw); got != tt.want {
			t.Errorf("tokenURL(%q, %q) = %q, want %q", tt.hubs, tt.raw, got, tt.want)
		}
	}
}

// Close sends the ack that the pacing holds back: a signal handled within
// AckInterval of the last ack is acknowledged before the connection
// closes, not left to come again to the session's next client.
func TestFakeCloseSendsThePacedAck(t *testing.T) {
	home := newFakeHub(t)
	defer home.close()
	home.replay = []Signal{{ID: "a", Seq: 1}}
	var mu sync.Mutex
	var got []int64
	c := dialFake(t, home.srv.URL, Config{
		AckInterval: time.Hour, // the second signal's ack waits for Close
		OnSignal:    func(s Signal) { mu.Lock(); got = append(got, s.Seq); mu.Unlock() },
	})
	eventually(t, "the first signal acked at once", func() bool {
		home.mu.Lock()
		defer home.mu.Unlock()
		return len(home.acks) == 1 && home.acks[0] == 1
	})
	home.mu.Lock()
	conn := home.conn
	home.mu.Unlock()
	if err := writeFrame(t.Context(), conn, frame{Type: "signal", Signal: Signal{ID: "b", Seq: 2}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the second signal handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 2 })
	home.mu.Lock()
	held := len(home.acks)
	home.mu.Unlock()
	if held != 1 {
		t.Fatalf("the hub got %d acks before Close, want 1 (the second held back by AckInterval)", held)
	}
	_ = c.Close()
	home.mu.Lock()
	defer home.mu.Unlock()
	if len(home.acks) != 2 || home.acks[1] != 2 {
		t.Fatalf("acks at the hub after Close: %v, want [1 2]", home.acks)
	}
}

// With DeferAck, Client.Ack is paced by AckInterval as the client's own
// acks are: the first is sent at once, those within the interval are folded
// into one, sent once the interval has passed or at Close.
func TestFakeDeferredAcksArePaced(t *testing.T) {
	for _, tt := range []struct {
		name     string
		interval time.Duration
		close    bool
	}{
		{"sent at Close", time.Hour, true},
		{"sent when the interval has passed", time.Second, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			home := newFakeHub(t)
			defer home.close()
			home.replay = []Signal{{ID: "a", Seq: 1}, {ID: "b", Seq: 2}, {ID: "c", Seq: 3}}
			handed := make(chan Signal, 3)
			c := dialFake(t, home.srv.URL, Config{DeferAck: true, AckInterval: tt.interval,
				OnSignal: func(s Signal) { handed <- s }})
			defer c.Close()
			for range 3 {
				if err := c.Ack(t.Context(), <-handed); err != nil {
					t.Fatal(err)
				}
			}
			if n := c.Stats().Acks; n != 1 {
				t.Fatalf("%d acks sent right after three Acks, want 1 (the others held back)", n)
			}
			if tt.close {
				_ = c.Close()
			}
			eventually(t, "the held-back ack of 3", func() bool {
				home.mu.Lock()
				defer home.mu.Unlock()
				return len(home.acks) == 2
			})
			home.mu.Lock()
			defer home.mu.Unlock()
			if home.acks[0] != 1 || home.acks[1] != 3 {
				t.Fatalf("acks at the hub: %v, want [1 3]", home.acks)
			}
		})
	}
}
