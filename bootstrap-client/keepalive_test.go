package bootstrap_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/netcount"
	"github.com/marconihub/marconi/internal/testproxy"
)

// A path that dies silently (no FIN, no RST: a NAT or balancer that forgot
// it) leaves the client attached in its own eyes. The keepalive finds it: an
// unanswered ping closes the connection and the client reattaches with its
// backoff, and what was sent meanwhile arrives.
func TestPingTimeoutRedialsASilentlyDeadPath(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	p := testproxy.Start(t, strings.TrimPrefix(h.URL, "http://"))
	var got inbox
	a := dial(t, h.URL, h.APIKey, "ka-a", nil)
	b := dialConfig(t, bootstrap.Config{
		HubURL: "http://" + p.Addr(), APIKey: h.APIKey, SessionID: "ka-b", OnSignal: got.on,
		PingInterval: 50 * time.Millisecond, PingTimeout: time.Second,
	})

	send(t, a, "ka-b", 1)
	waitFor(t, "b to receive 1", func() bool { return got.len() == 1 })

	// Every connection through the proxy, the WebSocket and idle HTTP ones,
	// now carries nothing and stays open; the hub still sees b attached.
	p.Freeze()
	if res := send(t, a, "ka-b", 2); res.Delivery != "pushed_to_ws" {
		t.Fatalf("delivery %q while the path is frozen, want pushed_to_ws (the hub cannot tell yet)", res.Delivery)
	}
	waitFor(t, "b to find the path dead and reattach", func() bool {
		st := b.Stats()
		return st.PingTimeouts >= 1 && st.Reconnects >= 1
	})
	send(t, a, "ka-b", 3)
	waitFor(t, "b to receive 2 and 3", func() bool { return got.len() >= 3 })
	wantPayloads(t, "b after the reattach", &got, 3)
	if st := b.Stats(); st.SelfHealReconnects != 0 || st.Reregistrations != 0 {
		t.Errorf("stats %+v: the keepalive alone should have repaired the route", st)
	}
}

// A handler that holds the reader up (OnSignal busy, the delivery queue
// full) leaves the hub's pong unread: that is no dead path, and the client
// must not reconnect for it.
func TestBusyHandlerIsNoPingTimeout(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	release := make(chan struct{})
	var once sync.Once
	got := inbox{gate: func(bootstrap.Signal) { <-release }}
	logs := &logRecorder{}
	a := dial(t, h.URL, h.APIKey, "busy-a", nil)
	b := dialConfig(t, bootstrap.Config{
		HubURL: h.URL, APIKey: h.APIKey, SessionID: "busy-b", OnSignal: got.on,
		Logger:       slog.New(logs),
		PingInterval: 5 * time.Millisecond, PingTimeout: time.Second,
	})
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before b's Close, which waits for OnSignal
	// One signal in OnSignal, 64 queued, the reader waiting with the next.
	const n = 70
	sendN(t, a, "busy-b", 1, n)
	waitFor(t, "a ping to go unanswered behind the busy handler", func() bool {
		return len(logs.find("marconi: ping unanswered while OnSignal held the reader up; not judged")) > 0
	})
	once.Do(func() { close(release) })
	waitFor(t, "b to receive every signal", func() bool { return got.len() == n })
	wantPayloads(t, "b", &got, n)
	if st := b.Stats(); st.PingTimeouts != 0 || st.Reconnects != 0 {
		t.Fatalf("stats %+v: a busy handler was taken for a dead path", st)
	}
}

// The client's pings are control frames, which the hub's frame-rate quota
// (MARCONI_WS_FRAMES_PER_SECOND) counts as data frames: a keepalive within
// the quota never gets the connection closed with 1008.
func TestPingsDoNotTripTheFrameRateQuota(t *testing.T) {
	// 50 pings a second against a quota of 100 (burst 200).
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{WSFramesPerSecond: 100}})
	var writes atomic.Int64
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true // every connection is the WebSocket's or one call's
	// After the handshake, one write per frame the client sends.
	tr.DialContext = netcount.Dial(&writes)
	t.Cleanup(tr.CloseIdleConnections)
	var got inbox
	a := dial(t, h.URL, h.APIKey, "fr-a", nil)
	b := dialConfig(t, bootstrap.Config{
		HubURL: h.URL, APIKey: h.APIKey, SessionID: "fr-b", OnSignal: got.on, HTTPClient: &http.Client{Transport: tr},
		PingInterval: 20 * time.Millisecond, PingTimeout: time.Second,
	})
	start := writes.Load()
	waitFor(t, "b to send 20 pings", func() bool { return writes.Load()-start >= 20 })
	send(t, a, "fr-b", 1)
	waitFor(t, "b to receive 1", func() bool { return got.len() >= 1 })
	wantPayloads(t, "b on its first connection", &got, 1)
	if st := b.Stats(); st.Reconnects != 0 || st.PingTimeouts != 0 {
		t.Fatalf("stats %+v after 20 pings: the connection was closed", st)
	}
}

// A negative PingTimeout is refused at Dial, naming the field.
func TestPingConfig(t *testing.T) {
	_, err := bootstrap.Dial(context.Background(), bootstrap.Config{
		HubURL: "http://127.0.0.1:1", APIKey: "k", Surface: "claude_code", PingTimeout: -time.Second,
	})
	if err == nil || !strings.Contains(err.Error(), "PingTimeout") {
		t.Fatalf("Dial with a negative PingTimeout: %v, want an error naming PingTimeout", err)
	}
}
