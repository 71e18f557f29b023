package bootstrap_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/marconihub/marconi"
	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/hub/hubtest"
)

// heads records the method, path and project header of every request that
// passes through it; it is safe for concurrent use.
type heads struct {
	mu   sync.Mutex
	seen []head
}

type head struct {
	method, path string
	project      []string // the X-Marconi-Project values, nil when absent
}

func (r *heads) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.seen = append(r.seen, head{req.Method, req.URL.Path, req.Header.Values(marconi.HeaderProject)})
		r.mu.Unlock()
		next.ServeHTTP(w, req)
	})
}

func (r *heads) all() []head {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

func (r *heads) saw(method, path string) bool {
	return slices.ContainsFunc(r.all(), func(h head) bool { return h.method == method && h.path == path })
}

// Every request a client makes for a registered session names the session's
// project for the balancer (X-Marconi-Project, docs/operations.md "Behind a
// load balancer"): the attach, sends, heartbeats, drains, acks over HTTP,
// the deregistration (a holder-routed send, only between peered instances,
// is made by the same call as any other). The first registration, which
// does not know the project yet, names none.
func TestEveryCallOfASessionNamesItsProject(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	target, err := url.Parse(h.URL)
	if err != nil {
		t.Fatal(err)
	}
	rec := &heads{}
	srv := httptest.NewServer(rec.wrap(httputil.NewSingleHostReverseProxy(target)))
	t.Cleanup(srv.Close)
	front := srv.URL

	var inB inbox
	a := dial(t, front, h.APIKey, "proj-a", nil)
	b := dial(t, front, h.APIKey, "proj-b", &inB)
	send(t, a, "proj-b", 1)
	waitFor(t, "b to get the signal", func() bool { return inB.len() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}

	// A piggyback session: drained, and acked over HTTP.
	var inC inbox
	c, err := bootstrap.DialPiggyback(ctx, bootstrap.Config{HubURL: front, APIKey: h.APIKey, SessionID: "proj-c",
		Surface: "codex", OnSignal: inC.on, AckInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	send(t, a, "proj-c", 3)
	if _, err := c.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "c's ack over HTTP", func() bool { return rec.saw(http.MethodPost, "/v1/signals/ack") })
	if err := c.Deregister(ctx); err != nil {
		t.Fatal(err)
	}

	all := rec.all()
	for _, want := range []struct{ method, path string }{
		{http.MethodGet, "/v1/ws"}, {http.MethodPost, "/v1/signals"}, {http.MethodPost, "/v1/heartbeat"},
		{http.MethodGet, "/v1/signals"}, {http.MethodPost, "/v1/signals/ack"}, {http.MethodDelete, "/v1/session"},
	} {
		if !rec.saw(want.method, want.path) {
			t.Errorf("no %s %s passed the proxy: %v", want.method, want.path, all)
		}
	}
	registrations := 0
	for _, r := range all {
		if r.method == http.MethodPost && r.path == "/v1/sessions" {
			registrations++
			if r.project != nil {
				t.Errorf("a first registration named a project it cannot know yet: %v", r.project)
			}
			continue
		}
		if !slices.Equal(r.project, []string{"t1/p1"}) {
			t.Errorf("%s %s named the project %q, want exactly [t1/p1]", r.method, r.path, r.project)
		}
	}
	if registrations != 3 {
		t.Errorf("%d registrations passed the proxy, want 3", registrations)
	}
}
