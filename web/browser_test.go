package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"

	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
	"github.com/marconihub/marconi/web"
)

const chromiumPath = "/usr/bin/chromium"

// flakyStore lets the test take the store "down" for the calls the dashboard
// makes, so the page must show the hub's 503 registry_unavailable.
type flakyStore struct {
	sessionstore.Store
	down atomic.Bool
}

func (s *flakyStore) ListSessions(ctx context.Context, f sessionstore.SessionFilter, now time.Time) ([]sessionstore.Session, error) {
	if s.down.Load() {
		return nil, sessionstore.ErrUnavailable
	}
	return s.Store.ListSessions(ctx, f, now)
}

func (s *flakyStore) GetSession(ctx context.Context, k sessionstore.Key, now time.Time) (sessionstore.Session, error) {
	if s.down.Load() {
		return sessionstore.Session{}, sessionstore.ErrUnavailable
	}
	return s.Store.GetSession(ctx, k, now)
}

// TestDashboardInBrowser drives the dashboard in headless Chromium against a
// real in-process hub: sign in, see a session without a queue, watch it turn
// attached when its WebSocket arrives (no reload), open its detail by
// keyboard, see the store outage and the refused token, and save a
// screenshot (MARCONI_SCREENSHOT, or the test's temp dir).
func TestDashboardInBrowser(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("MARCONI_TEST_REQUIRE_BROWSER") == "1" {
			t.Fatalf("MARCONI_TEST_REQUIRE_BROWSER=1 but %s is missing: %v", chromiumPath, err)
		}
		t.Skipf("skipping browser test: %s not found (apt-get install chromium; set MARCONI_TEST_REQUIRE_BROWSER=1 to fail instead)", chromiumPath)
	}

	store := &flakyStore{Store: memstore.New()}
	h := hubtest.Start(t, hubtest.Options{Store: store})
	base := dashboardURL(t, h.URL)

	// The agents. builder is attached from the start; planner and reviewer
	// are registered claude_code sessions without a WebSocket; batch is a
	// piggyback-only codex session.
	builder := register(t, h, "builder", "claude_code")
	planner := register(t, h, "planner", "claude_code")
	reviewer := register(t, h, "reviewer", "claude_code")
	register(t, h, "batch", "codex")
	attach(t, h, builder)
	// Some traffic, so that self-heal outcomes and pending signals show.
	send(t, h, builder, "reviewer") // recipient side: attempted
	send(t, h, reviewer, "builder") // sender side: attempted
	send(t, h, builder, "batch")    // recipient side: unsupported_surface

	ctx := browser(t)
	step := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		actx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := chromedp.Do(actx, actions...); err != nil {
			t.Fatalf("%s: %v\npage text:\n%s", what, err, pageText(ctx))
		}
	}
	waitFor := func(what, expr string) {
		t.Helper()
		if err := pollJS(ctx, expr, 15*time.Second); err != nil {
			t.Fatalf("waiting until %s (%s): %v\npage text:\n%s", what, expr, err, pageText(ctx))
		}
	}
	const rowPlanner = `document.querySelector('tr[data-testid="session-row"][data-session-id="planner"]')`

	step("open the page", chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS(`#token`)))
	step("sign in",
		chromedp.SendKeys(chromedp.CSS(`#token`), h.AdminToken),
		chromedp.Click(chromedp.CSS(`#signin-submit`)))
	waitFor("the overview counts three sessions without a queue and one attached",
		`document.querySelector('[data-testid="count-route_without_queue"]')?.textContent === '3' &&
		 document.querySelector('[data-testid="count-attached"]')?.textContent === '1'`)
	waitFor("the token is kept in sessionStorage only",
		fmt.Sprintf(`sessionStorage.getItem('marconi.adminToken') === %q && localStorage.length === 0`, h.AdminToken))
	waitFor("the self-heal chart shows the attempted outcomes",
		`Number(document.querySelector('[data-testid="selfheal-total-attempted"]')?.textContent) >= 2`)

	step("go to sessions", chromedp.Click(chromedp.CSS(`#nav-sessions`)))
	waitFor("planner shows route_without_queue, in text and not only in colour",
		rowPlanner+`?.dataset.routeState === 'route_without_queue' &&
		 `+rowPlanner+`.querySelector('[data-testid="route-badge"]').textContent.includes('route_without_queue')`)

	// Attach planner's WebSocket; the row must turn attached by the page's
	// own refresh, not by a reload (the marker would vanish on a reload).
	step("mark the page", evalVoid(`window.__noReload = 'still here'`))
	attach(t, h, planner)
	waitFor("planner turns attached without a reload",
		rowPlanner+`?.dataset.routeState === 'attached' && window.__noReload === 'still here'`)

	step("open planner's detail with the keyboard",
		chromedp.Focus(chromedp.CSS(`tr[data-session-id="planner"] [data-testid="session-link"]`)),
		chromedp.KeyEvent("\r"))
	waitFor("planner's detail explains it is attached, and focus moved to the detail",
		`document.querySelector('[data-testid="detail-explanation"]')?.dataset.routeState === 'attached' &&
		 document.querySelector('[data-testid="detail-explanation"]').textContent.includes('attached on healthy instance test-1') &&
		 document.activeElement?.id === 'detail-h'`)

	step("open reviewer's detail by clicking its row",
		chromedp.Click(chromedp.CSS(`tr[data-session-id="reviewer"] td`)))
	waitFor("reviewer's detail says what the state means and what heals it",
		`(() => { const e = document.querySelector('[data-testid="detail-explanation"]');
		  return e?.dataset.routeState === 'route_without_queue' &&
		    /The agent proved it was alive \d+ s ago but holds no WebSocket on a healthy instance\./.test(e.textContent) &&
		    e.textContent.includes('Its own next send will carry sender_route_stale and its client will reconnect.') &&
		    document.querySelector('[data-testid="freshest"]') !== null &&
		    document.querySelector('[data-testid="detail-pending"]')?.textContent === '1'; })()`)
	screenshot(t, ctx)

	store.down.Store(true)
	waitFor("a store outage is announced in the live region",
		`(() => { const s = document.querySelector('[data-testid="status"]');
		  return !s.hidden && s.getAttribute('aria-live') === 'polite' && s.textContent.includes('The hub cannot reach its store'); })()`)
	store.down.Store(false)
	waitFor("the outage message clears when the store is back",
		`document.querySelector('[data-testid="status"]').hidden`)

	step("sign out", chromedp.Click(chromedp.CSS(`#signout`)))
	waitFor("signed out: the sign-in form shows and the token is gone",
		`!document.querySelector('#view-signin').hidden && document.querySelector('#nav').hidden &&
		 sessionStorage.getItem('marconi.adminToken') === null &&
		 document.querySelector('[data-testid="session-row"]') === null`)

	step("sign in with a wrong token",
		chromedp.SendKeys(chromedp.CSS(`#token`), "not-the-admin-token"),
		chromedp.Click(chromedp.CSS(`#signin-submit`)))
	waitFor("the wrong token is refused",
		`document.querySelector('[data-testid="signin-error"]')?.textContent === 'That admin token was refused.' &&
		 document.querySelector('#nav').hidden && sessionStorage.getItem('marconi.adminToken') === null`)

	h.Close()
	step("sign in while the hub is down",
		evalVoid(`document.getElementById('token').value = ''`),
		chromedp.SendKeys(chromedp.CSS(`#token`), h.AdminToken),
		chromedp.Click(chromedp.CSS(`#signin-submit`)))
	waitFor("an unreachable hub is named as such",
		`document.querySelector('[data-testid="signin-error"]')?.textContent.startsWith('The hub is unreachable')`)
}

// dashboardURL is where the browser opens the dashboard: the hub itself when
// it serves the page at "/", else a front server in this test that serves
// web.Handler() at "/" and passes /v1/ and /metrics to the hub (same origin,
// as in production).
func dashboardURL(t *testing.T, hubURL string) string {
	t.Helper()
	res, err := http.Get(hubURL + "/")
	if err == nil {
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode == http.StatusOK && bytes.Contains(body, []byte("Marconi operator dashboard")) {
			return hubURL + "/"
		}
	}
	target, err := url.Parse(hubURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ErrorLog = nil
	proxy.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) }
	mux := http.NewServeMux()
	mux.Handle("/", web.Handler())
	mux.Handle("/v1/", proxy)
	mux.Handle("/metrics", proxy)
	front := httptest.NewServer(mux)
	t.Cleanup(front.Close)
	t.Logf("the hub does not serve the dashboard at / yet; serving web.Handler() in front of it at %s", front.URL)
	return front.URL + "/"
}

// browser starts headless Chromium with a fresh profile and returns its
// context; the browser stops when the test ends.
func browser(t *testing.T) context.Context {
	t.Helper()
	profile := t.TempDir() // removed after the browser has exited (cleanups run last-in first-out)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromiumPath),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1366, 900), // a laptop screen
	)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil { // start the browser with no deadline: see chromedp.Run
		t.Fatalf("starting %s: %v", chromiumPath, err)
	}
	return ctx
}

// pollJS evaluates expr in the page until it is true or the deadline passes.
func pollJS(ctx context.Context, expr string, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		if err == nil && ok {
			return nil
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return fmt.Errorf("still false after %v (last error: %w)", within, lastErr)
			}
			return fmt.Errorf("still false after %v", within)
		case <-tick.C:
		}
	}
}

// evalVoid runs expr in the page for its effect.
func evalVoid(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Evaluate[chromedp.Void](expr)(ctx, t)
		return err
	})
}

func pageText(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	if err != nil {
		return "(could not read the page: " + err.Error() + ")"
	}
	return s
}

// screenshot saves a full-page PNG to MARCONI_SCREENSHOT, or to the test's
// temp dir.
func screenshot(t *testing.T, ctx context.Context) {
	t.Helper()
	path := os.Getenv("MARCONI_SCREENSHOT")
	if path == "" {
		path = filepath.Join(t.TempDir(), "dashboard.png")
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	t.Logf("screenshot saved to %s", path)
}

// session is an agent registered on the hub.
type session struct{ id, token string }

func register(t *testing.T, h *hubtest.Hub, id, surface string) session {
	t.Helper()
	var out struct {
		Token string `json:"token"`
	}
	call(t, h.URL+"/v1/sessions", h.APIKey, map[string]string{"session_id": id, "surface": surface}, http.StatusCreated, &out)
	return session{id: id, token: out.Token}
}

func send(t *testing.T, h *hubtest.Hub, from session, to string) {
	t.Helper()
	call(t, h.URL+"/v1/signals", from.token, map[string]any{"to_session": to, "payload": map[string]string{"hello": to}}, http.StatusOK, nil)
}

func call(t *testing.T, u, bearer string, body any, want int, out any) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, u, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+bearer)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", u, err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		t.Fatalf("POST %s: status %d, want %d: %s", u, res.StatusCode, want, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("POST %s: %v in %s", u, err, data)
		}
	}
}

// attach opens the session's WebSocket and waits for the welcome; the
// connection stays open, its messages read and dropped, until the test ends.
func attach(t *testing.T, h *hubtest.Hub, s session) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, h.WSURL(), &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": []string{"Bearer " + s.token}},
	})
	if err != nil {
		t.Fatalf("attach %s: %v", s.id, err)
	}
	_, msg, err := conn.Read(ctx)
	if err != nil || !strings.Contains(string(msg), `"welcome"`) {
		t.Fatalf("attach %s: first message %q, %v; want the welcome", s.id, msg, err)
	}
	// One reader that discards what the hub pushes (CloseRead would close
	// the connection on the first signal); it ends when the connection does.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, _, err := conn.Read(context.Background()); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		conn.Close(websocket.StatusNormalClosure, "test over")
		<-done
	})
}
