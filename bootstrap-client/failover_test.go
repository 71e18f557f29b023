package bootstrap_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/hub/hubtest"
)

// An instance that goes away under an attached client: the client moves to
// the next of its URLs, attaches there and keeps sending and receiving.
func TestFailoverToNextURL(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	first := newForwarder(t, h.URL) // stands for an instance that dies
	var in inbox
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := bootstrap.Dial(ctx, bootstrap.Config{
		HubURLs: []string{first.URL(), h.URL}, APIKey: h.APIKey, SessionID: "roamer", Surface: "claude_code",
		OnSignal: in.on, ReconnectBaseDelay: 5 * time.Millisecond, ReconnectMaxDelay: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	other := dial(t, h.URL, h.APIKey, "other", nil)

	first.setDown(true)
	waitFor(t, "the reattach through the second URL", func() bool { return c.Stats().Reconnects == 1 })
	res := send(t, other, "roamer", "after failover")
	if res.Delivery != "pushed_to_ws" {
		t.Errorf("send to the failed-over client: %+v, want pushed_to_ws", res)
	}
	waitFor(t, "delivery after failover", func() bool { return slices.Contains(in.ids(), res.SignalID) })
	// Its own sends go through the second URL too: the first refuses all.
	if got := send(t, c, "other", "from the roamer"); got.SignalID == "" {
		t.Errorf("send from the failed-over client: %+v", got)
	}
}

// Dial itself fails over: the first URL is down from the start.
func TestDialSkipsDeadURL(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	dead := newForwarder(t, h.URL)
	dead.setDown(true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := bootstrap.Config{HubURL: dead.URL(), HubURLs: []string{h.URL}, APIKey: h.APIKey, Surface: "codex",
		ReconnectBaseDelay: 5 * time.Millisecond, ReconnectMaxDelay: 50 * time.Millisecond}
	c, err := bootstrap.Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("Dial through a dead first URL and a live second: %v", err)
	}
	_ = c.Close()
}

// lossyProxy forwards to a hub and, for the first n POSTs to its path (the
// sends, unless newLossyPathProxy says otherwise), drops the answer after the
// hub has acted on the request: the client sees a dead connection.
type lossyProxy struct {
	URL  string
	path string
	rp   *httputil.ReverseProxy
	drop atomic.Int64
	mu   sync.Mutex
	keys []string // Idempotency-Key headers of the requests whose answer was dropped
}

func newLossyProxy(t *testing.T, target string, drop int64) *lossyProxy {
	return newLossyPathProxy(t, target, "/v1/signals", drop)
}

func newLossyPathProxy(t *testing.T, target, path string, drop int64) *lossyProxy {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{path: path, rp: httputil.NewSingleHostReverseProxy(u)}
	p.drop.Store(drop)
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

func (p *lossyProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != p.path || p.drop.Add(-1) < 0 {
		p.rp.ServeHTTP(w, r)
		return
	}
	p.mu.Lock()
	p.keys = append(p.keys, r.Header.Get("Idempotency-Key"))
	p.mu.Unlock()
	rec := httptest.NewRecorder()
	p.rp.ServeHTTP(rec, r) // the hub acts on the request ...
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		_ = conn.Close() // ... and the answer is lost
	}
}

// droppedKeys returns the Idempotency-Key of every request whose answer was dropped.
func (p *lossyProxy) droppedKeys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.keys)
}

// A send whose answer is lost is sent again with the same idempotency key:
// the hub stores it once, the recipient gets it once, and Send returns the
// first attempt's signal.
func TestSendRetryAfterLostAnswerIsStoredOnce(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	lossy := newLossyProxy(t, h.URL, 2)
	var in inbox
	recipient := dial(t, h.URL, h.APIKey, "recipient", &in)
	sender := dial(t, lossy.URL, h.APIKey, "sender", nil)

	res := send(t, sender, recipient.SessionID(), "once")
	if !res.Duplicate || res.Seq != 1 {
		t.Errorf("send after two lost answers = %+v, want the first attempt's signal (seq 1) answered as a duplicate", res)
	}
	after := send(t, sender, recipient.SessionID(), "next")
	if after.Seq != 2 || after.Duplicate {
		t.Errorf("next send = %+v, want seq 2, not a duplicate: nothing else was stored", after)
	}
	waitFor(t, "both signals", func() bool { return in.len() == 2 })
	if got := in.ids(); !slices.Equal(got, []string{res.SignalID, after.SignalID}) {
		t.Errorf("recipient got %v, want [%s %s]", got, res.SignalID, after.SignalID)
	}
}

// With SendAttempts 1 a lost answer is the caller's: Send returns the error.
func TestSendAttemptsOneDoesNotRetry(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	lossy := newLossyProxy(t, h.URL, 1)
	dial(t, h.URL, h.APIKey, "recipient", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sender, err := bootstrap.Dial(ctx, bootstrap.Config{HubURL: lossy.URL, APIKey: h.APIKey, Surface: "codex", SendAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Close()
	if _, err := sender.Send(ctx, "recipient", "", "x"); err == nil {
		t.Fatal("Send with SendAttempts 1 and a lost answer returned no error")
	}
	// The caller retries with its own key: the hub had stored the first.
	res, err := sender.Send(ctx, "recipient", "", "x", bootstrap.WithIdempotencyKey("caller-key"))
	if err != nil || res.Seq != 2 {
		t.Fatalf("send with a fresh key = %+v, %v; want seq 2 (the lost one was stored)", res, err)
	}
}

// A caller-chosen idempotency key makes a repeated send a duplicate of the
// first; another key is another signal.
func TestSendWithIdempotencyKey(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	var in inbox
	recipient := dial(t, h.URL, h.APIKey, "recipient", &in)
	sender := dial(t, h.URL, h.APIKey, "sender", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := sender.Send(ctx, recipient.SessionID(), "", 1, bootstrap.WithIdempotencyKey("job-42"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := sender.Send(ctx, recipient.SessionID(), "", 1, bootstrap.WithIdempotencyKey("job-42"))
	if err != nil {
		t.Fatal(err)
	}
	if first.Duplicate || !again.Duplicate || again.SignalID != first.SignalID {
		t.Errorf("first %+v, again %+v: want the second a duplicate of the first", first, again)
	}
	other, err := sender.Send(ctx, recipient.SessionID(), "", 1, bootstrap.WithIdempotencyKey("job-43"))
	if err != nil || other.Duplicate || other.Seq != 2 {
		t.Errorf("another key = %+v, %v; want a new signal, seq 2", other, err)
	}
	plain1, plain2 := send(t, sender, recipient.SessionID(), 1), send(t, sender, recipient.SessionID(), 1)
	if plain1.Duplicate || plain2.Duplicate || plain1.SignalID == plain2.SignalID {
		t.Errorf("two sends without a key: %+v, %+v; want two signals (a key per call)", plain1, plain2)
	}
	waitFor(t, "four signals", func() bool { return in.len() == 4 })
}

// Deregister ends the session on the hub at once and stops the client; it
// is not registered again.
func TestDeregisterEndsSession(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	var resets atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := bootstrap.Dial(ctx, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "finished", Surface: "claude_code",
		OnAffinityReset: func() { resets.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	other := dial(t, h.URL, h.APIKey, "other", nil)
	if err := c.Deregister(ctx); err != nil {
		t.Fatalf("Deregister: %v", err)
	}
	_, err = other.Send(ctx, "finished", "", "anyone?")
	var he *bootstrap.Error
	if !errors.As(err, &he) || he.Code != "recipient_not_registered" {
		t.Errorf("send to a deregistered session: %v, want recipient_not_registered", err)
	}
	if _, err := c.Send(ctx, "other", "", "x"); err == nil {
		t.Error("Send on a deregistered client succeeded")
	}
	if st := c.Stats(); st.Reregistrations != 0 || resets.Load() != 0 {
		t.Errorf("stats %+v, %d resets after Deregister; want no re-registration", st, resets.Load())
	}
	if err := c.Deregister(ctx); err == nil {
		t.Error("second Deregister returned nil, want the closed-client error")
	}
}

// A session the hub lost (here: its TTL ran out) is registered again, and
// the application is told once, through OnAffinityReset, before any signal
// of the new registration.
func TestReregistrationCallsOnAffinityReset(t *testing.T) {
	clock := hubtest.NewClock(time.Now())
	h := hubtest.Start(t, hubtest.Options{Now: clock.Now})
	var (
		mu     sync.Mutex
		events []string
	)
	record := func(e string) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := bootstrap.Dial(ctx, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "phoenix", Surface: "claude_code",
		ReconnectBaseDelay: 5 * time.Millisecond, ReconnectMaxDelay: 50 * time.Millisecond,
		OnAffinityReset: func() { record("reset") },
		OnSignal:        func(s bootstrap.Signal) { record("signal " + s.ID) }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	clock.Advance(2 * time.Hour) // beyond the default TTL of one hour
	witness := dial(t, h.URL, h.APIKey, "witness", nil)
	send(t, c, "witness", "x") // meets 410 and registers again
	waitFor(t, "phoenix to reattach", func() bool { return c.Stats().Reconnects == 1 })
	got := send(t, witness, "phoenix", "y")
	waitFor(t, "the signal", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(events, "signal "+got.SignalID)
	})
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"reset", "signal " + got.SignalID}; !slices.Equal(events, want) {
		t.Errorf("events %v, want %v: one reset, before the new registration's signals", events, want)
	}
}
