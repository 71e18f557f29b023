package bootstrap_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// recordedFront starts a reverse proxy to hubURL that records every request
// passing through it, and returns the record and the proxy's URL.
func recordedFront(t *testing.T, hubURL string) (*heads, string) {
	t.Helper()
	target, err := url.Parse(hubURL)
	if err != nil {
		t.Fatal(err)
	}
	rec := &heads{}
	srv := httptest.NewServer(rec.wrap(httputil.NewSingleHostReverseProxy(target)))
	t.Cleanup(srv.Close)
	return rec, srv.URL
}

// reset forgets what was seen.
func (r *heads) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = nil
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
	rec, front := recordedFront(t, h.URL)

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

// An agent restarted with a kept token names its project from its very first
// request: the resume, which a balancer hashing on the project sends to the
// project's instance, as it does the attach after it. A file an older client
// wrote (no project) resumes as before, naming the project once the hub has
// answered, and is rewritten with it; a kept project that is not a pair of
// the contract's ids is never sent, is logged, and the token still resumes;
// a kept project the hub contradicts gives way to the hub's, in the file too.
func TestARestartedAgentNamesItsKeptProjectFromItsFirstRequest(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	rec, front := recordedFront(t, h.URL)
	path := filepath.Join(t.TempDir(), "token.json")
	store := bootstrap.FileTokenStore(path)

	// The first run registers (no project known yet) and keeps the project.
	restart(t, rec, front, h.APIKey, store, nil)
	kept, err := store.Load(t.Context())
	if err != nil || kept.TenantID != "t1" || kept.ProjectID != "p1" {
		t.Fatalf("kept after the first run: %+v, %v; want tenant t1, project p1", kept, err)
	}

	for _, c := range []struct {
		name, file string   // file: the kept token's JSON, %q its token
		resume     []string // the project header the resume carries
		warned     bool     // the kept project is logged as unusable
		followed   bool     // the hub's other project is logged as followed
	}{
		{"kept project", `{"session_id":"restarted","token":%q,"tenant_id":"t1","project_id":"p1"}`, []string{"t1/p1"}, false, false},
		{"file of an older client", `{"session_id":"restarted","token":%q}`, nil, false, false},
		{"line break in the project", `{"session_id":"restarted","token":%q,"tenant_id":"t1","project_id":"p1\r\nX-Evil: 1"}`, nil, true, false},
		{"slash in the tenant", `{"session_id":"restarted","token":%q,"tenant_id":"t1/p1","project_id":"p1"}`, nil, true, false},
		{"tenant without a project", `{"session_id":"restarted","token":%q,"tenant_id":"t1"}`, nil, true, false},
		{"number as the tenant", `{"session_id":"restarted","token":%q,"tenant_id":5,"project_id":"p1"}`, nil, true, false},
		{"object as the project", `{"session_id":"restarted","token":%q,"tenant_id":"t1","project_id":{"id":"p1"}}`, nil, true, false},
		{"another project than the hub's", `{"session_id":"restarted","token":%q,"tenant_id":"t9","project_id":"p9"}`, []string{"t9/p9"}, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			before, err := store.Load(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, fmt.Appendf(nil, c.file, before.Token), 0o600); err != nil {
				t.Fatal(err)
			}
			logs := &logRecorder{}
			cl := restart(t, rec, front, h.APIKey, store, logs)
			seen := rec.all()
			if first := seen[0]; first.method != http.MethodPost || first.path != "/v1/sessions" || !slices.Equal(first.project, c.resume) {
				t.Errorf("first request %s %s named the project %q, want POST /v1/sessions naming %q", first.method, first.path, first.project, c.resume)
			}
			for _, r := range seen[1:] {
				if !slices.Equal(r.project, []string{"t1/p1"}) {
					t.Errorf("%s %s after the resume named the project %q, want exactly [t1/p1]", r.method, r.path, r.project)
				}
			}
			if st := cl.Stats(); st.Reregistrations != 0 || st.Takeovers != 0 {
				t.Errorf("stats %+v: want a plain resume with the kept token", st)
			}
			after, err := store.Load(t.Context())
			if err != nil || after.Token == before.Token || after.TenantID != "t1" || after.ProjectID != "p1" {
				t.Errorf("kept after the resume: %+v, %v; want a new token and the hub's project t1/p1", after, err)
			}
			warned := logs.find("marconi: the kept token's tenant or project is not an id of the contract; resuming without naming the project to the balancer until the hub answers")
			if (len(warned) == 1) != c.warned {
				t.Errorf("%d warnings of an unusable kept project, want it logged: %v", len(warned), c.warned)
			}
			for _, w := range warned {
				if strings.Contains(fmt.Sprint(w.attrs), before.Token) {
					t.Errorf("the warning of an unusable kept project logs the token: %v", w.attrs)
				}
			}
			if followed := logs.find("marconi: the hub names another project than the kept token's; following the hub's"); (len(followed) == 1) != c.followed {
				t.Errorf("%d lines of the hub's project followed, want it logged: %v", len(followed), c.followed)
			}
		})
	}
}

// restart dials the session "restarted" through the recording proxy at
// front with the token kept in store, waits until it is attached, closes it
// (the session stays live) and returns it; rec holds only its requests.
func restart(t *testing.T, rec *heads, front, apiKey string, store bootstrap.TokenStore, logs *logRecorder) *bootstrap.Client {
	t.Helper()
	rec.reset()
	cfg := bootstrap.Config{HubURL: front, APIKey: apiKey, SessionID: "restarted", TokenStore: store}
	if logs != nil {
		cfg.Logger = slog.New(logs)
	}
	c := dialConfig(t, cfg)
	waitFor(t, "the attach to pass the proxy", func() bool { return rec.saw(http.MethodGet, "/v1/ws") })
	_ = c.Close()
	return c
}
