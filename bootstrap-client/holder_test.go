package bootstrap_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// holderPair is two stateless hubs, "hub-a" (the senders' hub URL, standing
// for a balancer) and "hub-b", on one Postgres schema, each with its own
// pool and wake-up bus, as two processes would be.
type holderPair struct {
	a, b   *hubtest.Hub
	apiKey string
}

// startHolderPair starts the pair; publicB, when set, is hub-b's
// MARCONI_PUBLIC_URL (default: its own URL).
func startHolderPair(t *testing.T, publicB string) *holderPair {
	t.Helper()
	url := pgtest.Schema(t)
	p := &holderPair{apiKey: hub.NewAPIKey()}
	admin := hub.NewAdminToken()
	start := func(id, public string) *hubtest.Hub {
		cfg := hub.Config{
			InstanceID: id, AdminToken: admin, PublicURL: public, StoreTimeout: 2 * time.Second,
			APIKeys: map[string]hub.TenantProject{p.apiKey: {TenantID: "t1", ProjectID: "p1"}},
		}
		st := pgStore(t, url)
		return hubtest.Start(t, hubtest.Options{Config: cfg, Store: st, Bus: pgstore.NewBus(st, nil)})
	}
	p.a, p.b = start("hub-a", ""), start("hub-b", publicB)
	for _, h := range []*hubtest.Hub{p.b, p.a} { // a reads b's row, URL included
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := h.Server.Fabric().Tick(ctx); err != nil {
			t.Fatalf("tick %s: %v", h.Server.InstanceID(), err)
		}
		cancel()
		waitFor(t, h.Server.InstanceID()+"'s wake-up listener", func() bool {
			return counter(t, h, "marconi_wake_listener_connects_total") >= 1
		})
	}
	return p
}

// sendsAnswered is how many POST /v1/signals h answered 200.
func sendsAnswered(t *testing.T, h *hubtest.Hub) int {
	t.Helper()
	mfs, err := h.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != "marconi_http_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["route"] == "/v1/signals" && l["method"] == http.MethodPost && l["status"] == "200" {
				n += int(m.GetCounter().GetValue())
			}
		}
	}
	return n
}

// The sender's client sends to the instance holding the recipient's queue
// once a send's answer names it, and back through its hub URL when an answer
// names none; with NoHolderRouting it never does.
func TestPGSendsGoToTheRecipientsInstance(t *testing.T) {
	t.Parallel()
	for _, off := range []bool{false, true} {
		name := map[bool]string{false: "routing", true: "NoHolderRouting"}[off]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := startHolderPair(t, "")
			var in inbox
			r := dialConfig(t, bootstrap.Config{HubURL: p.b.URL, APIKey: p.apiKey, SessionID: "bob", OnSignal: in.on})
			s := dialConfig(t, bootstrap.Config{HubURL: p.a.URL, APIKey: p.apiKey, SessionID: "alice", NoHolderRouting: off})

			const n = 10
			sendN(t, s, "bob", 1, n)
			waitFor(t, "1..10 at bob", func() bool { return in.len() == n })
			wantPayloads(t, "bob", &in, n)
			gotA, gotB := sendsAnswered(t, p.a), sendsAnswered(t, p.b)
			if off {
				if gotA != n || gotB != 0 || s.Stats().HolderSends != 0 {
					t.Fatalf("with NoHolderRouting: hub-a answered %d sends, hub-b %d, HolderSends %d; want %d, 0, 0",
						gotA, gotB, s.Stats().HolderSends, n)
				}
				return
			}
			// The first send learns where bob is; the rest go there.
			if gotA != 1 || gotB != n-1 || s.Stats().HolderSends != n-1 {
				t.Fatalf("hub-a answered %d sends, hub-b %d, HolderSends %d; want 1, %d, %d",
					gotA, gotB, s.Stats().HolderSends, n-1, n-1)
			}
			// bob leaves: hub-b's answer names no instance, and the next
			// send goes through the hub URL again.
			_ = r.Close()
			waitFor(t, "bob's queue gone", func() bool {
				return opsRouteState(t, p.b, "bob")["route_state"] != "attached"
			})
			send(t, s, "bob", n+1) // to hub-b, answered without a hint
			send(t, s, "bob", n+2)
			if gotA, gotB := sendsAnswered(t, p.a), sendsAnswered(t, p.b); gotA != 2 || gotB != n {
				t.Fatalf("after bob left: hub-a answered %d sends, hub-b %d; want 2, %d", gotA, gotB, n)
			}
		})
	}
}

// The holder goes while a sender sends to it: stopped (draining, then its
// connections closed), or killed (its address refuses connections and the
// live ones are cut, as when its machine dies). The sends go through the hub
// URL, none lost, none stored twice, in order; the recipient follows its
// own client's failover to hub-a.
func TestPGHolderGoesMidRun(t *testing.T) {
	t.Parallel()
	for _, killed := range []bool{false, true} {
		t.Run(map[bool]string{false: "stopped", true: "killed"}[killed], func(t *testing.T) {
			t.Parallel()
			// hub-b's public URL is a forwarder to it, which "killed" closes.
			fwd := newForwarder(t, "http://127.0.0.1:1")
			p := startHolderPair(t, fwd.URL())
			fwd.retarget(p.b.URL)
			var in inbox
			_ = dialConfig(t, bootstrap.Config{HubURL: p.b.URL, HubURLs: []string{p.a.URL}, APIKey: p.apiKey, SessionID: "bob", OnSignal: in.on})
			hc, open := countingHTTPClient(t, fwd.URL())
			s := dialConfig(t, bootstrap.Config{HubURL: p.a.URL, APIKey: p.apiKey, SessionID: "alice", HTTPClient: hc})

			const n, goAt = 60, 20
			done := make(chan error, 1)
			// "killed" cuts hub-b between two sends, and lets the sender's
			// transport see its idle connection closed, so that the next send
			// certainly dials the dead address. A send written to a cut
			// connection may have been stored: the client then forgets the
			// hint and retries through the hub URL, with no refused dial.
			paused, resume := make(chan struct{}), make(chan struct{})
			reached := paused           // paused is the sender's to clear
			seqs := make([]int64, 0, n) // the answers' seqs; read after done
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				for i := 1; i <= n; i++ {
					res, err := s.Send(ctx, "bob", "test", i)
					if err != nil {
						done <- err
						return
					}
					seqs = append(seqs, res.Seq)
					if killed && paused != nil && s.Stats().HolderSends == goAt {
						close(paused)
						paused = nil
						<-resume
					}
				}
				done <- nil
			}()
			if killed {
				<-reached
				fwd.close()
				waitFor(t, "the sender's connections to hub-b closed", func() bool { return open.Load() == 0 })
				close(resume)
			} else {
				waitFor(t, "sends reaching hub-b", func() bool { return s.Stats().HolderSends >= goAt })
			}
			p.b.Close()
			if err := <-done; err != nil {
				t.Fatalf("a send failed after the holder went: %v", err)
			}
			waitFor(t, "1..60 at bob", func() bool { return in.len() >= n })
			wantPayloads(t, "bob", &in, n)
			for i, seq := range seqs { // a signal stored twice would take a seq of its own
				if seq != int64(i+1) {
					t.Fatalf("the answers' seqs %v, want 1..%d", seqs, n)
				}
			}
			st := s.Stats()
			if st.HolderSends < goAt || sendsAnswered(t, p.a) < 1 {
				t.Fatalf("HolderSends %d, hub-a answered %d: the run did not go through both", st.HolderSends, sendsAnswered(t, p.a))
			}
			if killed && st.HolderFallbacks < 1 {
				t.Fatal("no send fell back from the killed holder's refused dial")
			}
		})
	}
}

// A hint that cannot be reached (a closed port, or a balancer's own 503):
// the send goes through the hub URL at once, and the sends after it do not
// try that URL again within HolderRetryAfter.
func TestPGUnreachableHolderFallsBackOnce(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := "http://" + ln.Addr().String()
	_ = ln.Close()
	for _, name := range []string{"closed port", "balancer 503"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			public := closedPort
			var balancerHits atomic.Int64
			if name == "balancer 503" { // HAProxy's answer when no server is up
				balancer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					balancerHits.Add(1)
					w.Header().Set("Content-Type", "text/html")
					w.WriteHeader(http.StatusServiceUnavailable)
					_, _ = w.Write([]byte("<html><body><h1>503 Service Unavailable</h1>\nNo server is available to handle this request.\n</body></html>\n"))
				}))
				t.Cleanup(balancer.Close)
				public = balancer.URL
			}
			p := startHolderPair(t, public)
			var in inbox
			_ = dialConfig(t, bootstrap.Config{HubURL: p.b.URL, APIKey: p.apiKey, SessionID: "bob", OnSignal: in.on})
			s := dialConfig(t, bootstrap.Config{HubURL: p.a.URL, APIKey: p.apiKey, SessionID: "alice", HolderRetryAfter: time.Hour})

			const n = 10
			sendN(t, s, "bob", 1, n)
			waitFor(t, "1..10 at bob", func() bool { return in.len() == n })
			wantPayloads(t, "bob", &in, n)
			if st := s.Stats(); st.HolderFallbacks != 1 || st.HolderSends != 0 || sendsAnswered(t, p.a) != n {
				t.Fatalf("HolderFallbacks %d, HolderSends %d, hub-a answered %d; want 1, 0, %d",
					st.HolderFallbacks, st.HolderSends, sendsAnswered(t, p.a), n)
			}
			if got := balancerHits.Load(); public != closedPort && got != 1 {
				t.Fatalf("the balancer was asked %d times, want once", got)
			}
		})
	}
}

// countingHTTPClient is an HTTP client whose open connections to target's
// host are counted, for a test to wait until its transport has seen them
// closed. The client's idle connections are closed at cleanup.
func countingHTTPClient(t *testing.T, target string) (*http.Client, *atomic.Int64) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	open := new(atomic.Int64)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	var d net.Dialer
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil || addr != u.Host {
			return c, err
		}
		open.Add(1)
		return &countedConn{Conn: c, open: open}, nil
	}
	hc := &http.Client{Transport: tr}
	t.Cleanup(hc.CloseIdleConnections)
	return hc, open
}

// countedConn takes itself off its count at its first Close.
type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}
