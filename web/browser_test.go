package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"

	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/testwait"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

const chromiumPath = "/usr/bin/chromium"

// flakyStore lets the test take the store "down" for the calls the dashboard
// makes, so the page must show the hub's 503 registry_unavailable: down for
// the route-state reads, fabricDown for the fabric summary alone (only the
// summary lists fallback events).
type flakyStore struct {
	sessionstore.Store
	down       atomic.Bool
	fabricDown atomic.Bool
}

func (s *flakyStore) ListFallbacks(ctx context.Context, limit int) ([]sessionstore.FallbackEvent, error) {
	if s.fabricDown.Load() {
		return nil, sessionstore.ErrUnavailable
	}
	return s.Store.ListFallbacks(ctx, limit)
}

func (s *flakyStore) ListSessions(ctx context.Context, f sessionstore.SessionFilter, now time.Time) ([]sessionstore.Session, error) {
	if s.down.Load() {
		return nil, sessionstore.ErrUnavailable
	}
	return s.Store.ListSessions(ctx, f, now)
}

// readOnly is the class a store names while Postgres fails over
// (pgstore.Classify of a standby's refusal).
const readOnly = "Postgres is read-only (a standby, or a failover under way)"

// Classify and Diagnose name every failure as a failover would: the
// dashboard shows it.
func (s *flakyStore) Classify(error) string { return readOnly }
func (s *flakyStore) Diagnose(error) string { return readOnly }

func (s *flakyStore) GetSession(ctx context.Context, k sessionstore.Key, now time.Time) (sessionstore.Session, error) {
	if s.down.Load() {
		return sessionstore.Session{}, sessionstore.ErrUnavailable
	}
	return s.Store.GetSession(ctx, k, now)
}

// TestDashboardInBrowser drives the dashboard in headless Chromium against a
// real in-process hub, served by the hub itself at "/": sign in, see a
// session without a queue, watch it turn attached when its WebSocket arrives
// (no reload), open its detail by keyboard, see the store outage, the fabric
// summary (gate, allowlist, instance load, a mismatch, a grace_expired
// fallback of a classifier-placed session) and the refused token, and save a
// screenshot (MARCONI_SCREENSHOT, or the test's temp dir).
func TestDashboardInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (a browser): skipped by -short")
	}
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("MARCONI_TEST_REQUIRE_BROWSER") == "1" {
			t.Fatalf("MARCONI_TEST_REQUIRE_BROWSER=1 but %s is missing: %v", chromiumPath, err)
		}
		t.Skipf("skipping browser test: %s not found (apt-get install chromium; set MARCONI_TEST_REQUIRE_BROWSER=1 to fail instead)", chromiumPath)
	}

	store := &flakyStore{Store: memstore.New()}
	clock := hubtest.NewClock(time.Now().UTC().Truncate(time.Second))
	h := hubtest.Start(t, hubtest.Options{Store: store, Now: clock.Now, Config: hub.Config{
		Fabric: fabric.Config{
			Grace:     time.Minute,
			Placement: fabric.PlacementConfig{Adaptive: true, AdaptiveClients: []string{"canary"}},
		},
		// The retention loop samples marconi_pending_signals; often, so the
		// overview shows it soon after sign-in.
		Retention: hub.Retention{Every: 200 * time.Millisecond},
	}})
	base := h.URL + "/" // the hub serves the dashboard itself

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
	step, waitFor := driver(t, ctx)
	const rowPlanner = `document.querySelector('tr[data-testid="session-row"][data-session-id="planner"]')`

	step("open the page", chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS(`#token`)))
	step("sign in",
		chromedp.SendKeys(chromedp.CSS(`#token`), h.AdminToken),
		clickOn(`#signin-submit`))
	waitFor("the overview counts two sessions without a queue, the piggyback-only one apart, and one attached",
		`document.querySelector('[data-testid="count-route_without_queue"]')?.textContent === '2' &&
		 document.querySelector('[data-testid="count-piggyback"]')?.textContent === '1' &&
		 document.querySelector('[data-testid="count-attached"]')?.textContent === '1'`)
	waitFor("the token is kept in sessionStorage only",
		fmt.Sprintf(`sessionStorage.getItem('marconi.adminToken') === %q && localStorage.length === 0`, h.AdminToken))
	waitFor("the self-heal chart shows the attempted outcomes",
		`Number(document.querySelector('[data-testid="selfheal-total-attempted"]')?.textContent) >= 2`)
	// Three signals wait for an ack: reviewer's and batch's (no WebSocket)
	// and builder's (pushed, never acked by this test's reader).
	waitFor("the overview shows the pending-signals gauge",
		`document.querySelector('#ov-pending [data-testid="pending-signals"]')?.textContent === '3'`)

	step("go to sessions", clickOn(`#nav-sessions`))
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

	// Some seconds pass on the hub's clock, so the ages read as they would.
	clock.Advance(7 * time.Second)
	tick(t, h)
	step("open reviewer's detail by clicking its row",
		clickOn(`tr[data-session-id="reviewer"] td`))
	waitFor("reviewer's detail says what the state means and what heals it",
		`(() => { const e = document.querySelector('[data-testid="detail-explanation"]');
		  return e?.dataset.routeState === 'route_without_queue' &&
		    /The agent proved it was alive \d+ s ago but holds no WebSocket on a healthy instance\./.test(e.textContent) &&
		    e.textContent.includes('Its own next send will carry sender_route_stale and its client will reconnect.') &&
		    e.textContent.includes('If its process stopped (a crash, kill -9), nothing comes until the agent starts again') &&
		    document.querySelector('[data-testid="freshest"]') !== null &&
		    document.querySelector('[data-testid="detail-pending"]')?.textContent === '1'; })()`)
	screenshot(t, ctx)

	store.down.Store(true)
	waitFor("a store outage is announced in the live region",
		`(() => { const s = document.querySelector('[data-testid="status"]');
		  return !s.hidden && s.getAttribute('aria-live') === 'polite' && s.textContent.includes('The hub cannot reach its store') &&
		  s.textContent.includes('`+readOnly+`'); })()`)
	store.down.Store(false)
	waitFor("the outage message clears when the store is back",
		`document.querySelector('[data-testid="status"]').hidden`)

	// The fabric. canary is placed by the adaptive classifier (its client is
	// on the allowlist and it declares local state), reports a placement
	// mismatch, and comes back after its grace window: a grace_expired
	// fallback event whose source is adaptive-classifier.
	canary, reg := registerWith(t, h, map[string]any{"session_id": "canary", "surface": "claude_code",
		"client_id": "canary", "hints": map[string]any{"local_state": true}})
	if reg["runtime_mode"] != "sticky" || reg["runtime_mode_source"] != "adaptive-classifier" {
		t.Fatalf("canary placed %v by %v, want sticky by adaptive-classifier", reg["runtime_mode"], reg["runtime_mode_source"])
	}
	_, closeCanary := attach(t, h, canary)
	call(t, h.URL+"/v1/placement-mismatch", canary.token, map[string]string{"reason": "needed the shell's cwd"}, http.StatusNoContent, nil)
	closeCanary()
	eventually(t, "the store records canary's detach", func() bool {
		var rs struct {
			Queue struct {
				Attached bool `json:"attached"`
			} `json:"queue"`
		}
		getJSON(t, h.URL+"/v1/ops/route_state/t1/p1/canary", h.AdminToken, &rs)
		return !rs.Queue.Attached
	})
	clock.Advance(61 * time.Second) // past MARCONI_RECONNECT_GRACE_SECONDS
	tick(t, h)                      // this instance heartbeats at the new time: still healthy
	if w, _ := attach(t, h, canary); w["affinity_reset"] != true {
		t.Fatalf("canary back after its grace window: welcome %v, want affinity_reset", w)
	}

	step("go to the overview", clickOn(`#nav-overview`))
	waitFor("the overview shows the gate on, the allowlist and one mismatch",
		`document.querySelector('#ov-gate [data-testid="gate"]')?.textContent === 'on' &&
		 document.querySelector('#ov-gate [data-testid="allowlist"]')?.textContent === 'canary' &&
		 document.querySelector('#ov-gate [data-testid="mismatches"]')?.textContent.startsWith('1 rollback signal')`)
	const instRow = `document.querySelector('#ov-instances tr[data-testid="instance-row"][data-instance-id="test-1"]')`
	waitFor("the overview lists this instance healthy with its load",
		instRow+`?.querySelector('[data-testid="instance-health"]').textContent === 'healthy' &&
		 `+instRow+`.querySelector('[data-testid="instance-sessions"]').textContent === '1' &&
		 `+instRow+`.querySelector('[data-testid="instance-queues"]').textContent === '3'`)

	store.fabricDown.Store(true)
	waitFor("a summary that cannot be read is named unavailable, and the route-state counts stay",
		`(() => { const g = document.querySelector('#ov-gate [data-testid="summary-unavailable"]');
		  return g?.textContent.includes('could not be read: the hub cannot reach its store (503 registry_unavailable)') &&
		    document.querySelector('#ov-instances [data-testid="summary-unavailable"]') !== null &&
		    document.querySelector('#ov-instances [data-testid="no-instances"]') === null &&
		    document.querySelector('[data-testid="count-attached"]')?.textContent === '3' &&
		    document.querySelector('[data-testid="status"]').textContent.startsWith('The fabric summary could not be read'); })()`)
	store.fabricDown.Store(false)
	waitFor("the summary is back",
		`document.querySelector('[data-testid="summary-unavailable"]') === null &&
		 document.querySelector('#ov-gate [data-testid="gate"]')?.textContent === 'on' &&
		 document.querySelector('[data-testid="status"]').hidden`)

	step("go to the fabric view", clickOn(`#nav-fabric`))
	waitFor("the fabric view shows the gate, the allowlist, the mismatch and the instance",
		`document.querySelector('[data-testid="fabric-gate"]')?.textContent === 'on' &&
		 document.querySelector('[data-testid="fabric-allowlist"]')?.textContent === 'canary' &&
		 document.querySelector('[data-testid="fabric-mismatches"]')?.textContent === '1' &&
		 document.querySelector('#fabric-body tr[data-testid="instance-row"][data-instance-id="test-1"] [data-testid="instance-health"]')?.textContent === 'healthy'`)
	waitFor("the in-memory store's instance has no bus key: its version is unknown",
		`document.querySelector('#fabric-body tr[data-testid="instance-row"][data-instance-id="test-1"] [data-testid="instance-bus-key"]')?.textContent === 'unknown'`)
	waitFor("the canary view lists canary's one adaptive placement, on the allowlist",
		`(() => { const r = [...document.querySelectorAll('[data-testid="canary-row"]')];
		  return r.length === 1 && r[0].dataset.clientId === 'canary' && !r[0].classList.contains('attention') &&
		    r[0].querySelector('[data-testid="canary-sessions"]').textContent === '1' &&
		    r[0].querySelector('[data-testid="canary-allowlist"]').textContent === 'on the allowlist'; })()`)
	waitFor("the grace_expired fallback of canary stands out as placed by the classifier",
		`(() => { const r = [...document.querySelectorAll('[data-testid="fallback-row"]')];
		  return r.length === 1 && r[0].textContent.includes('canary') && r[0].classList.contains('attention') &&
		    r[0].querySelector('[data-testid="fallback-reason"]').textContent === 'grace_expired' &&
		    r[0].querySelector('[data-testid="fallback-source"]').textContent.startsWith('adaptive-classifier placed by the classifier'); })()`)

	step("sign out", clickOn(`#signout`))
	waitFor("signed out: the sign-in form shows and the token is gone",
		`!document.querySelector('#view-signin').hidden && document.querySelector('#nav').hidden &&
		 sessionStorage.getItem('marconi.adminToken') === null &&
		 document.querySelector('[data-testid="session-row"]') === null`)

	step("sign in with a wrong token",
		chromedp.SendKeys(chromedp.CSS(`#token`), "not-the-admin-token"),
		clickOn(`#signin-submit`))
	waitFor("the wrong token is refused",
		`document.querySelector('[data-testid="signin-error"]')?.textContent === 'That admin token was refused.' &&
		 document.querySelector('#nav').hidden && sessionStorage.getItem('marconi.adminToken') === null`)

	h.Close()
	step("sign in while the hub is down",
		evalVoid(`document.getElementById('token').value = ''`),
		chromedp.SendKeys(chromedp.CSS(`#token`), h.AdminToken),
		clickOn(`#signin-submit`))
	waitFor("an unreachable hub is named as such",
		`document.querySelector('[data-testid="signin-error"]')?.textContent.startsWith('The hub is unreachable')`)
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

// clickOn clicks the first element matching sel, in one step inside the page,
// as soon as there is one. The dashboard redraws its tables on every refresh,
// so a node looked up by the driver and clicked in a second round trip may be
// gone by then ("Could not find node with given id").
func clickOn(sel string) chromedp.Action[chromedp.Void] {
	q, err := json.Marshal(sel)
	if err != nil {
		panic(err)
	}
	expr := `(() => { const e = document.querySelector(` + string(q) + `); if (!e) return false; e.click(); return true })()`
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			ok, err := chromedp.Evaluate[bool](expr)(ctx, t)
			if err == nil && ok {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("no %s to click: %w", sel, ctx.Err())
			case <-tick.C:
			}
		}
	})
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
	s, _ := registerWith(t, h, map[string]any{"session_id": id, "surface": surface})
	return s
}

// registerWith registers with the given body and returns the session and
// the hub's whole answer.
func registerWith(t *testing.T, h *hubtest.Hub, body map[string]any) (session, map[string]any) {
	t.Helper()
	var out map[string]any
	call(t, h.URL+"/v1/sessions", h.APIKey, body, http.StatusCreated, &out)
	token, _ := out["token"].(string)
	return session{id: body["session_id"].(string), token: token}, out
}

// tick runs one round of the hub's fabric loop now: heartbeat at the test
// clock's time, refresh of the instance view.
func tick(t *testing.T, h *hubtest.Hub) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.Server.Fabric().Tick(ctx); err != nil {
		t.Fatalf("fabric tick: %v", err)
	}
}

// eventually polls cond until it is true, failing the test after 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.For(t, what, 10*time.Second, cond)
}

func getJSON(t *testing.T, u, bearer string, out any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+bearer)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d: %s", u, res.StatusCode, data)
	}
	if err := json.Unmarshal(data, out); err != nil {
		t.Fatalf("GET %s: %v in %s", u, err, data)
	}
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

// attach opens the session's WebSocket and returns the welcome; the
// connection stays open, its messages read and dropped, until the returned
// func or the end of the test closes it.
func attach(t *testing.T, h *hubtest.Hub, s session) (welcome map[string]any, closeWS func()) {
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
	if err != nil || json.Unmarshal(msg, &welcome) != nil || welcome["type"] != "welcome" {
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
	var once sync.Once
	closeWS = func() {
		once.Do(func() { conn.Close(websocket.StatusNormalClosure, "test over") })
		<-done
	}
	t.Cleanup(closeWS)
	return welcome, closeWS
}
