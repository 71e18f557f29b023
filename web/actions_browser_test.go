package web_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/metrictest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
	"github.com/marconihub/marconi/signals/selfheal"
)

// needChromium skips the test without Debian's chromium, or fails it when
// MARCONI_TEST_REQUIRE_BROWSER=1.
func needChromium(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("slow (a browser): skipped by -short")
	}
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("MARCONI_TEST_REQUIRE_BROWSER") == "1" {
			t.Fatalf("MARCONI_TEST_REQUIRE_BROWSER=1 but %s is missing: %v", chromiumPath, err)
		}
		t.Skipf("skipping browser test: %s not found", chromiumPath)
	}
}

// driver returns step, which runs actions in the page, and waitFor, which
// polls a JavaScript condition; either fails the test with the page's text.
func driver(t *testing.T, ctx context.Context) (step func(string, ...chromedp.Action[chromedp.Void]), waitFor func(string, string)) {
	step = func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		actx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := chromedp.Do(actx, actions...); err != nil {
			t.Fatalf("%s: %v\npage text:\n%s", what, err, pageText(ctx))
		}
	}
	waitFor = func(what, expr string) {
		t.Helper()
		if err := pollJS(ctx, expr, 15*time.Second); err != nil {
			t.Fatalf("waiting until %s (%s): %v\npage text:\n%s", what, expr, err, pageText(ctx))
		}
	}
	return step, waitFor
}

// TestDashboardActsInBrowser: with the adaptive gate off, the panel folds to
// one line; a piggyback-only session is neutral, not "needs attention"; an
// instance gone for minutes is hidden until asked for; the self-heal chart
// shows outcomes from before the page opened (the hub's history); a session
// is found by id, its pending signals listed, and it is disconnected and
// deregistered, each after a confirmation.
func TestDashboardActsInBrowser(t *testing.T) {
	needChromium(t)
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	clock := hubtest.NewClock(time.Now().UTC().Truncate(time.Second))
	h := hubtest.Start(t, hubtest.Options{Store: store, Now: clock.Now, Config: hub.Config{
		SelfhealHistoryBucket: time.Second,
	}})
	alice := register(t, h, "alice", "claude_code")
	register(t, h, "bob", "claude_code")
	register(t, h, "batch", "codex")
	attach(t, h, alice)
	send(t, h, alice, "bob") // recipient side: attempted, before the page opens
	send(t, h, alice, "bob")

	// Two other instances: one died 30 s ago (unhealthy, listed), one has
	// been gone for 10 minutes (hidden).
	ctx0 := t.Context()
	for _, in := range []sessionstore.Instance{
		{ID: "hub-recent", URL: "http://127.0.0.1:1", StartedAt: clock.Now().Add(-time.Hour), LastHeartbeatAt: clock.Now().Add(-30 * time.Second)},
		{ID: "hub-old", URL: "http://127.0.0.1:2", StartedAt: clock.Now().Add(-2 * time.Hour), LastHeartbeatAt: clock.Now().Add(-10 * time.Minute)},
	} {
		if err := store.HeartbeatInstance(ctx0, in); err != nil {
			t.Fatal(err)
		}
	}
	tick(t, h)

	ctx := browser(t)
	step, waitFor := driver(t, ctx)
	q := func(sel string) string { return fmt.Sprintf("document.querySelector(%q)", sel) }

	step("open the page and sign in", chromedp.Navigate(h.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), h.AdminToken), clickOn(`#signin-submit`))
	waitFor("the piggyback-only session is counted apart, without 'needs attention'",
		q(`[data-testid="count-route_without_queue"]`)+`?.textContent === '1' && `+
			q(`[data-testid="count-piggyback"]`)+`?.textContent === '1' && `+
			q(`[data-testid="count-piggyback"]`)+`.closest('tr').classList.contains('attention') === false && `+
			q(`[data-testid="count-piggyback"]`)+`.closest('tr').textContent.includes('normal')`)
	waitFor("the adaptive panel folds to one line when its gate is off",
		q(`#ov-gate-card`)+`.hidden && `+q(`[data-testid="gate-folded"]`)+`?.textContent.includes('off') && `+
			q(`#ov-states-card`)+`.classList.contains('wide')`)
	waitFor("the self-heal chart shows the attempts made before the page opened",
		`Number(`+q(`[data-testid="selfheal-recent-attempted"]`)+`?.textContent) >= 2 && `+
			`Number(`+q(`[data-testid="selfheal-total-attempted"]`)+`?.textContent) >= 2`)
	const row = `#ov-instances tr[data-testid="instance-row"][data-instance-id="%s"]`
	waitFor("a recently dead instance is listed, one gone for minutes is hidden",
		q(fmt.Sprintf(row, "test-1"))+` !== null && `+q(fmt.Sprintf(row, "hub-recent"))+` !== null && `+
			q(fmt.Sprintf(row, "hub-old"))+` === null && `+q(`[data-testid="gone-note"]`)+`?.textContent.startsWith('1 instance gone')`)
	step("show the gone instances", clickOn(`[data-testid="gone-toggle"]`))
	waitFor("the gone instance is listed on demand", q(fmt.Sprintf(row, "hub-old"))+` !== null`)

	step("go to sessions", clickOn(`#nav-sessions`))
	waitFor("batch's badge is neutral",
		`(() => { const r = document.querySelector('tr[data-session-id="batch"]');
		  return r && r.classList.contains('state-piggyback') && !r.classList.contains('state-route_without_queue') &&
		    r.querySelector('[data-testid="route-badge"]').textContent === 'route_without_queue · piggyback-only'; })()`)
	step("search for bob by id",
		chromedp.SendKeys(chromedp.CSS(`#f-session`), "BO"), chromedp.KeyEvent("\r"))
	waitFor("only bob is listed",
		`(() => { const r = [...document.querySelectorAll('tr[data-testid="session-row"]')];
		  return r.length === 1 && r[0].dataset.sessionId === 'bob' && location.hash.includes('session=BO'); })()`)
	step("open bob's detail", clickOn(`tr[data-session-id="bob"] [data-testid="session-link"]`))
	waitFor("bob's two pending signals are listed, oldest first, from alice",
		`(() => { const r = [...document.querySelectorAll('[data-testid="detail-pending-row"]')];
		  return r.length === 2 && r[0].textContent.startsWith('1alice') && r[1].textContent.startsWith('2alice'); })()`)

	// Disconnect alice: ask, cancel, ask again, confirm.
	step("open alice's detail", evalVoid(`location.hash = '#session/t1/p1/alice'`))
	waitFor("alice is attached and can be disconnected",
		q(`[data-testid="detail-explanation"]`)+`?.dataset.routeState === 'attached' && `+q(`[data-testid="action-disconnect"]`)+`?.disabled === false`)
	step("ask to disconnect, then cancel", clickOn(`[data-testid="action-disconnect"]`))
	waitFor("a confirmation is asked", q(`[data-testid="confirm"]`)+`?.textContent.includes('Disconnect its WebSocket?')`)
	step("cancel", clickOn(`[data-testid="confirm-no"]`))
	waitFor("the confirmation is gone", q(`[data-testid="confirm"]`)+` === null && `+q(`[data-testid="action-disconnect"]`)+` !== null`)
	if n := disconnects(t, h, "operator"); n != 0 {
		t.Fatalf("a cancelled disconnect closed the WebSocket (%v)", n)
	}
	step("disconnect for real", clickOn(`[data-testid="action-disconnect"]`))
	step("confirm", chromedp.WaitVisible(chromedp.CSS(`[data-testid="confirm-yes"]`)), clickOn(`[data-testid="confirm-yes"]`))
	waitFor("the page says it disconnected", q(`[data-testid="action-note"]`)+`?.textContent === 'Disconnected: its client reconnects.'`)
	eventually(t, "the hub to close alice's WebSocket as an operator disconnect", func() bool { return disconnects(t, h, "operator") == 1 })

	// Deregister bob.
	step("open bob's detail again", evalVoid(`location.hash = '#session/t1/p1/bob'`))
	step("ask to deregister", chromedp.WaitVisible(chromedp.CSS(`[data-testid="action-deregister"]`)),
		clickOn(`[data-testid="action-deregister"]`))
	waitFor("the confirmation names bob", q(`[data-testid="confirm"]`)+`?.textContent.includes('Deregister session bob?')`)
	step("confirm", clickOn(`[data-testid="confirm-yes"]`))
	waitFor("bob reads not registered",
		q(`[data-testid="action-note"]`)+`?.textContent === 'Deregistered.' && `+
			q(`[data-testid="detail-explanation"]`)+`?.dataset.routeState === 'not_registered'`)
	var rs map[string]any
	getJSON(t, h.URL+"/v1/ops/route_state/t1/p1/bob", h.AdminToken, &rs)
	if rs["route_state"] != "not_registered" {
		t.Fatalf("bob after the dashboard deregistered it: %v", rs["route_state"])
	}
}

// disconnects reads marconi_ws_disconnects_total{reason}.
func disconnects(t *testing.T, h *hubtest.Hub, reason string) float64 {
	t.Helper()
	v, _ := metrictest.Lookup(t, h.Registry, "marconi_ws_disconnects_total", "reason", reason)
	return v
}

// TestDashboardFoldsSelfHealWhenOff: on an instance with self-heal off (lan
// mode's default) that never counted an outcome, the self-heal card folds
// to one line, as the adaptive card does with its gate off.
func TestDashboardFoldsSelfHealWhenOff(t *testing.T) {
	needChromium(t)
	off := selfheal.DefaultConfig()
	off.Enabled = false
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{Mode: "lan", SelfHeal: off}})
	register(t, h, "solo", "claude_code")
	ctx := browser(t)
	step, waitFor := driver(t, ctx)
	step("open the page and sign in", chromedp.Navigate(h.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), h.AdminToken), clickOn(`#signin-submit`))
	waitFor("the self-heal card folds to one line",
		`document.querySelector('#ov-heal-card').hidden &&
		 document.querySelector('[data-testid="selfheal-folded"]')?.textContent.includes('MARCONI_SELFHEAL') &&
		 document.querySelector('[data-testid="count-route_without_queue"]')?.textContent === '1'`)
}

// TestDashboardShowsBusKeyBehindInBrowser: in a fleet whose instances seal
// with two bus key versions (a rotation not yet picked up everywhere), the
// instances table marks the older one "behind", and only that one, in the
// overview and in the fabric view.
func TestDashboardShowsBusKeyBehindInBrowser(t *testing.T) {
	needChromium(t)
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	clock := hubtest.NewClock(time.Now().UTC().Truncate(time.Second))
	h := hubtest.Start(t, hubtest.Options{Store: store, Now: clock.Now})
	// Two healthy peers: hub-rotated reads version 2, hub-lagging still
	// seals with 1. This instance (the in-memory store) has no bus key.
	for _, in := range []sessionstore.Instance{
		{ID: "hub-rotated", URL: "http://127.0.0.1:1", StartedAt: clock.Now().Add(-time.Hour), LastHeartbeatAt: clock.Now(), BusKeyVersion: 2},
		{ID: "hub-lagging", URL: "http://127.0.0.1:2", StartedAt: clock.Now().Add(-time.Hour), LastHeartbeatAt: clock.Now(), BusKeyVersion: 1},
	} {
		if err := store.HeartbeatInstance(t.Context(), in); err != nil {
			t.Fatal(err)
		}
	}
	tick(t, h)

	ctx := browser(t)
	step, waitFor := driver(t, ctx)
	step("open the page and sign in", chromedp.Navigate(h.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), h.AdminToken), clickOn(`#signin-submit`))
	// busKeys is the text of each instance's "Bus key" cell under table,
	// by instance id.
	busKeys := func(table string) string {
		return `Object.fromEntries([...document.querySelectorAll('` + table + ` tr[data-testid="instance-row"]')].map((r) =>
		  [r.dataset.instanceId, r.querySelector('[data-testid="instance-bus-key"]').textContent]))`
	}
	const want = `{"hub-lagging":"v1, behind","hub-rotated":"v2","test-1":"unknown"}`
	// keys sorted, so that the comparison does not depend on the rows' order
	sorted := func(table string) string {
		return `JSON.stringify(Object.fromEntries(Object.entries(` + busKeys(table) + `).sort()))`
	}
	waitFor("the overview marks hub-lagging behind, and no other instance", sorted(`#ov-instances`)+` === '`+want+`'`)
	waitFor("behind is a warning badge",
		`document.querySelector('#ov-instances tr[data-instance-id="hub-lagging"] [data-testid="instance-bus-key"] .badge.badge-warn') !== null`)
	step("go to the fabric view", clickOn(`#nav-fabric`))
	waitFor("the fabric view marks hub-lagging behind, and no other instance", sorted(`#fabric-body`)+` === '`+want+`'`)
}
