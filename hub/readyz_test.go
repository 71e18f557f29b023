package hub_test

import (
	"context"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/internal/testproxy"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// probedStore is a memstore whose readiness probe counts its runs and
// fails once the test cuts it.
type probedStore struct {
	sessionstore.Store
	probes atomic.Int32
	cut    atomic.Bool
}

func (s *probedStore) Ready(context.Context) error {
	s.probes.Add(1)
	if s.cut.Load() {
		return sessionstore.ErrUnavailable
	}
	return nil
}

// TestReadyzChecksShareAProbe: concurrent /readyz checks within the cache
// window cost the store one probe; the first check past it probes again.
func TestReadyzChecksShareAProbe(t *testing.T) {
	t.Parallel()
	const n = 8
	clock := hubtest.NewClock(time.Now())
	st := &probedStore{Store: memstore.New()}
	h := hubtest.Start(t, hubtest.Options{Store: st, Now: clock.Now, Config: hub.Config{ReadyzCache: time.Second}})
	codes := make(chan int, n)
	for range n {
		go func() {
			code, _ := call(t, "GET", h.URL+"/readyz", "", nil)
			codes <- code
		}()
	}
	for range n {
		if code := <-codes; code != http.StatusOK {
			t.Fatalf("/readyz: %d", code)
		}
	}
	if got := st.probes.Load(); got != 1 {
		t.Fatalf("%d probes for %d checks within the window, want 1", got, n)
	}
	clock.Advance(time.Second)
	if code, _ := call(t, "GET", h.URL+"/readyz", "", nil); code != http.StatusOK || st.probes.Load() != 2 {
		t.Fatalf("/readyz past the window: %d after %d probes, want 200 after 2", code, st.probes.Load())
	}
}

// TestReadyzCachedReadyEndsWithItsWindow: a store cut that no call meets
// is reported by the first check at the end of the window, not before
// (the store counts no failures here: the window alone bounds the verdict).
func TestReadyzCachedReadyEndsWithItsWindow(t *testing.T) {
	t.Parallel()
	const window = 500 * time.Millisecond
	clock := hubtest.NewClock(time.Now())
	st := &probedStore{Store: memstore.New()}
	h := hubtest.Start(t, hubtest.Options{Store: st, Now: clock.Now, Config: hub.Config{ReadyzCache: window}})
	if code, _ := call(t, "GET", h.URL+"/readyz", "", nil); code != http.StatusOK {
		t.Fatalf("/readyz: %d", code)
	}
	st.cut.Store(true)
	clock.Advance(window - time.Millisecond)
	if code, _ := call(t, "GET", h.URL+"/readyz", "", nil); code != http.StatusOK || st.probes.Load() != 1 {
		t.Fatalf("/readyz within the window: %d after %d probes, want the cached 200", code, st.probes.Load())
	}
	clock.Advance(time.Millisecond)
	if code, body := call(t, "GET", h.URL+"/readyz", "", nil); code != http.StatusServiceUnavailable || errCode(body) != "registry_unavailable" {
		t.Fatalf("/readyz at the end of the window: %d %v, want 503 registry_unavailable", code, body)
	}
}

// readyzOnProxiedStore starts a hub on a pgstore reached through a proxy
// the test can cut, with the given /readyz cache window.
func readyzOnProxiedStore(t *testing.T, window time.Duration) (*hubtest.Hub, *pgstore.Store, *testproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(pgtest.Schema(t))
	if err != nil {
		t.Fatal(err)
	}
	p := testproxy.Start(t, u.Host)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := pgstore.Open(ctx, viaProxy(u, p.Addr()), pgstore.WithQueryTimeout(2*time.Second), pgstore.WithConnectTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	t.Cleanup(p.Close) // before the store closes: nothing waits on a cut link
	h := hubtest.Start(t, hubtest.Options{Store: st, Config: hub.Config{ReadyzCache: window, StoreTimeout: 2 * time.Second}})
	if code, body := call(t, "GET", h.URL+"/readyz", "", nil); code != http.StatusOK {
		t.Fatalf("/readyz with the store up: %d %v", code, body)
	}
	return h, st, p
}

// TestReadyzFailureMetByAnyCallEndsACachedReady: with a window far longer
// than the test, a store failure met by a call that is not a request (here
// the store's own, as a background loop's would be) makes the next /readyz
// probe again and answer 503.
func TestReadyzFailureMetByAnyCallEndsACachedReady(t *testing.T) {
	t.Parallel()
	h, st, p := readyzOnProxiedStore(t, time.Hour)
	p.Cut()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := st.GetSession(ctx, sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "x"}, time.Now()); err == nil {
		t.Fatal("a store call with Postgres cut succeeded")
	}
	if code, body := call(t, "GET", h.URL+"/readyz", "", nil); code != http.StatusServiceUnavailable || errCode(body) != "registry_unavailable" {
		t.Fatalf("/readyz after a store call failed: %d %v, want 503 registry_unavailable (no cached ready)", code, body)
	}
}

// TestReadyzCachedReadyOutlivesACutByTheWindowAtMost: on Postgres, after a
// cut, /readyz may answer a cached 200 for one window at most, never to a
// check begun later than that (a background call meeting the cut may end
// it sooner).
func TestReadyzCachedReadyOutlivesACutByTheWindowAtMost(t *testing.T) {
	t.Parallel()
	const window = 300 * time.Millisecond
	h, _, p := readyzOnProxiedStore(t, window)
	p.Cut()
	cut := time.Now()
	deadline := cut.Add(10 * time.Second)
	for {
		began := time.Now()
		code, _ := call(t, "GET", h.URL+"/readyz", "", nil)
		if code == http.StatusOK && began.Sub(cut) >= window {
			t.Fatalf("/readyz begun %v after the cut answered 200; the window is %v", began.Sub(cut), window)
		}
		if code == http.StatusServiceUnavailable {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d 10 s after the cut", code)
		}
	}
}
