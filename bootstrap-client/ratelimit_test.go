package bootstrap_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/wsproxy"
)

// TestFleetOnOneKeyComesUp: 300 agents started at once on one API key,
// against a hub allowing 30 registrations a second per key (burst 60). The
// registrations past the quota are answered 429 with Retry-After; each
// client waits it out and registers again, so every agent comes up. The
// clients share one HTTP client (one bounded pool), as a process running a
// fleet would. The rate is below the default (50, burst 100) so that the
// fleet meets it however slowly a loaded machine registers: 300 agents at
// 30 a second take 8 s at the least, and a hub that registers more than 30
// a second (any, by far) answers some of them 429.
func TestFleetOnOneKeyComesUp(t *testing.T) {
	if testing.Short() {
		t.Skip("300 agents: not with -short")
	}
	const agents = 300
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{QuotaRegistrationsPerSecond: 30}})
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 32
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	clients := make([]*bootstrap.Client, agents)
	errs := make([]error, agents)
	var wg sync.WaitGroup
	for i := range agents {
		wg.Go(func() {
			clients[i], errs[i] = bootstrap.Dial(ctx, bootstrap.Config{
				HubURL: h.URL, APIKey: h.APIKey, SessionID: fmt.Sprintf("fleet-%03d", i),
				Surface: "claude_code", HTTPClient: hc,
			})
		})
	}
	wg.Wait()
	limited := 0
	for i, c := range clients {
		if errs[i] != nil {
			t.Errorf("agent %d: %v", i, errs[i])
			continue
		}
		limited += c.Stats().RateLimited
		defer c.Close()
	}
	if limited == 0 {
		t.Errorf("no registration was answered 429: the fleet never met the quota this test is about")
	}
	t.Logf("%d agents up; %d registrations waited out a 429", agents, limited)
}

// limitingProxy stands in front of a hub and answers the first n
// registrations 429 with the given code and Retry-After header (none when
// empty), passing everything else (WebSockets included) to the hub.
func limitingProxy(t *testing.T, hubURL string, n int, code, retryAfter string) *atomic.Int64 {
	t.Helper()
	target, err := url.Parse(hubURL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	refused := new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/sessions" && refused.Load() < int64(n) {
			refused.Add(1)
			if retryAfter != "" {
				w.Header().Set("Retry-After", retryAfter)
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = fmt.Fprintf(w, `{"error":{"code":%q,"message":"refused by the test's proxy"}}`, code)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	proxies.Store(refused, srv.URL)
	return refused
}

// proxies maps the counter limitingProxy returns to its URL.
var proxies sync.Map

func proxyURL(refused *atomic.Int64) string {
	u, _ := proxies.Load(refused)
	return u.(string)
}

// TestRateLimitWithoutUsableRetryAfter: a 429 too_many_requests whose
// Retry-After is missing or unreadable is waited out with the bounded
// backoff, and the registration made again.
func TestRateLimitWithoutUsableRetryAfter(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	for _, header := range []string{"", "soon", "-3"} {
		refused := limitingProxy(t, h.URL, 2, "too_many_requests", header)
		c := dialConfig(t, bootstrap.Config{HubURL: proxyURL(refused), APIKey: h.APIKey, SessionID: "unusable-retry-after"})
		if got := c.Stats().RateLimited; got != 2 || refused.Load() != 2 {
			t.Errorf("Retry-After %q: waited out %d 429s of %d, want 2", header, got, refused.Load())
		}
		_ = c.Deregister(t.Context())
	}
}

// TestRateLimitBeyondTheBudgetIsReturned: a Retry-After longer than the
// client may wait (Config.RateLimitWait, or ctx's deadline) is returned at
// once as the hub's 429, a negative RateLimitWait never waits, and a
// quota_exceeded without Retry-After (the hub's way of saying waiting does
// not help) is not waited for.
func TestRateLimitBeyondTheBudgetIsReturned(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	for _, tt := range []struct {
		code, retryAfter string
		wait             time.Duration
	}{{"quota_exceeded", "3600", 0}, {"too_many_requests", "1", -1}, {"quota_exceeded", "", 0}} {
		refused := limitingProxy(t, h.URL, 1, tt.code, tt.retryAfter)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		_, err := bootstrap.Dial(ctx, bootstrap.Config{
			HubURL: proxyURL(refused), APIKey: h.APIKey, Surface: "claude_code", RateLimitWait: tt.wait,
		})
		expired := ctx.Err()
		cancel()
		var he *bootstrap.Error
		if !errors.As(err, &he) || he.Status != http.StatusTooManyRequests || (he.RetryAfter > 0) != (tt.retryAfter != "") || expired != nil {
			t.Errorf("%s, Retry-After %q, RateLimitWait %v: Dial = %v; want the 429 at once, with its RetryAfter", tt.code, tt.retryAfter, tt.wait, err)
		}
	}
}

// TestSendWaitsOutTheSendRate: sends past the per-session rate (1 a second,
// burst 2) are answered 429 too_many_requests with Retry-After; Send waits
// them out and every signal is stored once.
func TestSendWaitsOutTheSendRate(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{SendRatePerSecond: 1}})
	var in inbox
	a := dial(t, h.URL, h.APIKey, "rate-a", nil)
	dial(t, h.URL, h.APIKey, "rate-b", &in)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range 4 {
		wg.Go(func() { _, errs[i] = a.Send(ctx, "rate-b", "", i+1) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("sends past the rate: %v", err)
	}
	if a.Stats().RateLimited == 0 {
		t.Errorf("no send was answered 429: the test did not meet the rate it is about")
	}
	waitFor(t, "b to get the 4 signals", func() bool { return in.len() == 4 })
}

// TestRegistrationKeyCarries128Bits: the Idempotency-Key of a registration is
// at least 22 base64url characters (128 bits), as the hub requires.
func TestRegistrationKeyCarries128Bits(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	target, _ := url.Parse(h.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	keys := make(chan string, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/sessions" {
			keys <- r.Header.Get("Idempotency-Key")
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	dialConfig(t, bootstrap.Config{HubURL: srv.URL, APIKey: h.APIKey, SessionID: "regkey-bits"})
	key := <-keys
	if !regexp.MustCompile(`^[A-Za-z0-9_-]{22,}$`).MatchString(key) {
		t.Errorf("registration Idempotency-Key %q: want 22 or more base64url characters", key)
	}
}

// TestSessionQuotaIsNotWaitedFor: a project at its live-session quota is
// answered 429 quota_exceeded with no Retry-After (waiting does not help);
// Dial returns it at once instead of waiting out RateLimitWait.
func TestSessionQuotaIsNotWaitedFor(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{QuotaSessionsPerProject: 1}})
	dial(t, h.URL, h.APIKey, "quota-first", nil)
	logs := &logRecorder{}
	_, err := bootstrap.Dial(t.Context(), bootstrap.Config{
		HubURL: h.URL, APIKey: h.APIKey, SessionID: "quota-second", Surface: "claude_code", Logger: slog.New(logs),
	})
	wantHubError(t, err, http.StatusTooManyRequests, "quota_exceeded")
	if waits := logs.find("marconi: hub asks to wait (429); retrying after it"); len(waits) != 0 {
		t.Errorf("Dial waited %d times for a quota that waiting cannot free", len(waits))
	}
}

// An attach refused 429 (the hub's per-session attach rate) is tried again
// after the answer's Retry-After, not at the backoff's pace: the client's
// backoff here is at most 50 ms, so without waiting it out it would be
// refused again and again within the hub's window; it is refused once and
// then attached.
func TestAttachWaitsOutRetryAfter(t *testing.T) {
	// 0.5 attaches a second, a burst of one: Dial's attach spends it, and the
	// redial after the cut is refused for about two seconds.
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{QuotaAttachesPerSecond: 0.5}})
	p := wsproxy.New(t, h.URL)
	c := dial(t, p.URL(), h.APIKey, "agent", nil)
	p.Sever()
	waitFor(t, "the client to attach again", func() bool { return c.Stats().Reconnects == 1 })
	if n := quotaRefusals(t, h, "attaches_per_session"); n != 1 {
		t.Fatalf("attach refusals = %v, want 1: the client retried within the hub's Retry-After", n)
	}
	if n := c.Stats().RateLimited; n != 1 {
		t.Errorf("Stats().RateLimited = %d, want 1 (the attach's 429 waited out)", n)
	}
}

// quotaRefusals reads marconi_quota_refusals_total{quota} from h's registry.
func quotaRefusals(t *testing.T, h *hubtest.Hub, quota string) float64 {
	t.Helper()
	mfs, err := h.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "marconi_quota_refusals_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "quota" && l.GetValue() == quota {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("marconi_quota_refusals_total{quota=%q} not found", quota)
	return 0
}
