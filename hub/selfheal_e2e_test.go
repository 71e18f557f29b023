package hub_test

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/signals/selfheal"
)

// The SPEC-168 scenarios end to end: a real hub over HTTP and WebSocket, on a
// settable clock so that freshness and bucket refill are decided without
// sleeping. Each test names the SPEC scenario or acceptance criterion it pins.

var spec168Epoch = time.Date(2026, 6, 4, 9, 0, 0, 0, time.UTC)

// startHealHub starts a hub on a settable clock.
func startHealHub(t *testing.T, cfg hub.Config) (*hubtest.Hub, *hubtest.Clock) {
	t.Helper()
	clk := hubtest.NewClock(spec168Epoch)
	return hubtest.Start(t, hubtest.Options{Config: cfg, Now: clk.Now}), clk
}

// heal is the expected self-heal part of a send response; "" means null and a
// false *Stale means the key must be absent from the JSON.
type heal struct {
	outcome, recipient, sender  string
	recipientStale, senderStale bool
}

// noHeal is the self-heal part of a send that evaluated no side.
var noHeal = heal{}

func jsonNullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// checkHeal asserts the self-heal fields of a send response exactly as the
// wire carries them: null where null, and the *_route_stale keys absent
// unless set.
func checkHeal(t *testing.T, what string, resp map[string]any, want heal) {
	t.Helper()
	if v, ok := resp["selfheal_outcome"]; !ok || v != jsonNullable(want.outcome) {
		t.Errorf("%s: selfheal_outcome = %v (present %v), want %v", what, v, ok, jsonNullable(want.outcome))
	}
	sides, ok := resp["selfheal"].(map[string]any)
	if !ok {
		t.Errorf("%s: selfheal is %v, want an object", what, resp["selfheal"])
	} else {
		for side, w := range map[string]string{"recipient": want.recipient, "sender": want.sender} {
			if v, ok := sides[side]; !ok || v != jsonNullable(w) {
				t.Errorf("%s: selfheal.%s = %v (present %v), want %v", what, side, v, ok, jsonNullable(w))
			}
		}
	}
	for key, set := range map[string]bool{"recipient_route_stale": want.recipientStale, "sender_route_stale": want.senderStale} {
		v, ok := resp[key]
		switch {
		case set && v != true:
			t.Errorf("%s: %s = %v (present %v), want true", what, key, v, ok)
		case !set && ok:
			t.Errorf("%s: %s is present (%v); it must be absent", what, key, v)
		}
	}
}

// checkDelivery asserts the send classification, which self-heal never changes.
func checkDelivery(t *testing.T, what string, resp map[string]any, delivery, routeState string) {
	t.Helper()
	if resp["delivery"] != delivery || resp["recipient_route_state"] != routeState {
		t.Errorf("%s: delivery %v, recipient_route_state %v; want %s, %s", what, resp["delivery"], resp["recipient_route_state"], delivery, routeState)
	}
}

// healCounts reads marconi_route_self_healed_total for every outcome.
func healCounts(t *testing.T, h *hubtest.Hub) map[string]float64 {
	t.Helper()
	m := make(map[string]float64)
	for _, o := range marconi.Outcomes {
		m[string(o)] = metric(t, h, selfheal.MetricName, "outcome", string(o))
	}
	return m
}

// checkHealDelta asserts that the counters moved by exactly want since
// before (outcomes not in want must not move).
func checkHealDelta(t *testing.T, what string, h *hubtest.Hub, before map[string]float64, want map[string]float64) {
	t.Helper()
	got := make(map[string]float64)
	for o, v := range healCounts(t, h) {
		if d := v - before[o]; d != 0 {
			got[o] = d
		}
	}
	if want == nil {
		want = map[string]float64{}
	}
	if !maps.Equal(got, want) {
		t.Errorf("%s: %s deltas = %v, want %v", what, selfheal.MetricName, got, want)
	}
}

// registerWith registers a session under a given API key.
func registerWith(t *testing.T, h *hubtest.Hub, apiKey, id, surface string) agent {
	t.Helper()
	st, resp := call(t, "POST", h.URL+"/v1/sessions", apiKey, map[string]any{"session_id": id, "surface": surface})
	if st != http.StatusCreated {
		t.Fatalf("register %s: %d %v", id, st, resp)
	}
	return agent{ID: resp["session_id"].(string), Token: resp["token"].(string)}
}

// routeStateOf reads one session's route_state in any tenant and project.
func routeStateOf(t *testing.T, h *hubtest.Hub, tenant, project, session string) map[string]any {
	t.Helper()
	st, rs := call(t, "GET", h.URL+"/v1/ops/route_state/"+tenant+"/"+project+"/"+session, h.AdminToken, nil)
	if st != http.StatusOK {
		t.Fatalf("route_state %s/%s/%s: %d %v", tenant, project, session, st, rs)
	}
	return rs
}

func routeSelfheal(t *testing.T, rs map[string]any) map[string]any {
	t.Helper()
	sh, ok := rs["selfheal"].(map[string]any)
	if !ok {
		t.Fatalf("route_state selfheal is %v, want an object", rs["selfheal"])
	}
	return sh
}

// attachWS attaches a's WebSocket (t1/p1) with dial; see attachWSIn.
func attachWS(t *testing.T, h *hubtest.Hub, a agent) (*websocket.Conn, map[string]any) {
	t.Helper()
	return attachWSIn(t, h, "t1", "p1", a)
}

// attachWSIn attaches a's WebSocket with dial and, at cleanup, closes it and
// waits until the hub has detached it, before the hub shuts down. Without
// that wait dial's client close races the hub's shutdown kick. Letting the
// hub close first instead costs the 5 s close handshake timeout per
// connection, since nobody reads the client side.
func attachWSIn(t *testing.T, h *hubtest.Hub, tenant, project string, a agent) (*websocket.Conn, map[string]any) {
	t.Helper()
	c, w := dial(t, h, a)
	t.Cleanup(func() {
		_ = c.Close(websocket.StatusNormalClosure, "test over") // may be closed already
		waitFor(t, a.ID+"'s queue to detach", func() bool {
			q, _ := routeStateOf(t, h, tenant, project, a.ID)["queue"].(map[string]any)
			return q["attached"] == false
		})
	})
	return c, w
}

// readSignalSeq reads frames until the signal with seq arrives.
func readSignalSeq(t *testing.T, c *websocket.Conn, seq float64) map[string]any {
	t.Helper()
	for range 10 {
		f := readFrame(t, c)
		if f["type"] == "signal" && f["seq"] == seq {
			return f
		}
	}
	t.Fatalf("signal seq %v never arrived", seq)
	return nil
}

// TestSPEC168_Scenario1_HappyPath: Donna (attached) sends to Lafonda
// (registered, fresh, no queue) and is told that Lafonda's route is stale;
// Lafonda's own next send tells her that her route is stale; once she
// reattaches, sends are pushed and self-heal is silent.
func TestSPEC168_Scenario1_HappyPath(t *testing.T) {
	h, clk := startHealHub(t, hub.Config{})
	donna := register(t, h, "donna", "claude_code")
	lafonda := register(t, h, "lafonda", "claude_code")
	attachWS(t, h, donna)
	clk.Advance(30 * time.Second)

	before := healCounts(t, h)
	r := send(t, h, donna, "lafonda", "ping 1")
	checkDelivery(t, "donna→lafonda (no queue)", r, "queued_offline", "route_without_queue")
	checkHeal(t, "donna→lafonda (no queue)", r, heal{outcome: "attempted", recipient: "attempted", recipientStale: true})
	checkHealDelta(t, "donna→lafonda (no queue)", h, before, map[string]float64{"attempted": 1})

	// Lafonda, alive but without a queue, sends: her own response tells her.
	before = healCounts(t, h)
	r = send(t, h, lafonda, "donna", "pong")
	checkDelivery(t, "lafonda→donna", r, "pushed_to_ws", "attached")
	checkHeal(t, "lafonda→donna", r, heal{outcome: "attempted", sender: "attempted", senderStale: true})
	checkHealDelta(t, "lafonda→donna", h, before, map[string]float64{"attempted": 1})
	if p, _ := r["pending"].([]any); len(p) != 1 || p[0].(map[string]any)["from_session"] != "donna" {
		t.Errorf("lafonda's piggyback pending = %v, want donna's one signal", r["pending"])
	}

	// Her client reconnects (AC-4): the queue is back.
	lafondaWS, welcome := attachWS(t, h, lafonda)
	if welcome["replayed"] != float64(1) {
		t.Errorf("welcome replayed = %v, want 1", welcome["replayed"])
	}
	before = healCounts(t, h)
	r = send(t, h, donna, "lafonda", "ping 2")
	checkDelivery(t, "donna→lafonda (reattached)", r, "pushed_to_ws", "attached")
	checkHeal(t, "donna→lafonda (reattached)", r, noHeal)
	checkHealDelta(t, "donna→lafonda (reattached)", h, before, nil)
	f := readSignalSeq(t, lafondaWS, r["seq"].(float64))
	if f["from_session"] != "donna" || f["payload"] != "ping 2" {
		t.Errorf("pushed frame = %v", f)
	}
	if rs := routeState(t, h, "lafonda"); rs["route_state"] != "attached" {
		t.Errorf("lafonda route_state = %v, want attached", rs["route_state"])
	}
}

// TestSPEC168_Scenario2_GenuinelyOffline: past the 300 s freshness window the
// recipient is treated as offline: stale_recency, no hint. A proof of life
// exactly 300 s old still passes, and route state and the gate agree.
func TestSPEC168_Scenario2_GenuinelyOffline(t *testing.T) {
	h, clk := startHealHub(t, hub.Config{})
	donna := register(t, h, "donna", "claude_code")
	register(t, h, "ghost", "claude_code")
	attachWS(t, h, donna)

	clk.Advance(300 * time.Second)
	before := healCounts(t, h)
	r := send(t, h, donna, "ghost", "at the limit")
	checkDelivery(t, "at 300 s", r, "queued_offline", "route_without_queue")
	checkHeal(t, "at 300 s", r, heal{outcome: "attempted", recipient: "attempted", recipientStale: true})

	clk.Advance(time.Second)
	r = send(t, h, donna, "ghost", "too late")
	checkDelivery(t, "at 301 s", r, "not_available_offline", "stale")
	checkHeal(t, "at 301 s", r, heal{outcome: "stale_recency", recipient: "stale_recency"})
	checkHealDelta(t, "300 s then 301 s", h, before, map[string]float64{"attempted": 1, "stale_recency": 1})

	// Being sent to is no proof of life: still stale ten minutes on.
	clk.Advance(10 * time.Minute)
	before = healCounts(t, h)
	r = send(t, h, donna, "ghost", "much later")
	checkDelivery(t, "at 901 s", r, "not_available_offline", "stale")
	checkHeal(t, "at 901 s", r, heal{outcome: "stale_recency", recipient: "stale_recency"})
	checkHealDelta(t, "at 901 s", h, before, map[string]float64{"stale_recency": 1})
}

// TestSPEC168_Scenario3_RateLimit: five quick sends to a route-stale
// recipient give exactly 3 attempted then 2 rate_limited (no hint on those);
// the bucket refills linearly, one token per RefillPeriod/MaxAttempts.
func TestSPEC168_Scenario3_RateLimit(t *testing.T) {
	h, clk := startHealHub(t, hub.Config{})
	donna := register(t, h, "donna", "claude_code")
	register(t, h, "lafonda", "claude_code")
	attachWS(t, h, donna)

	// Five sends one second apart (well within 30 s): with 3 tokens per 60 s
	// only 0.2 of a token comes back meanwhile.
	attempted := heal{outcome: "attempted", recipient: "attempted", recipientStale: true}
	limited := heal{outcome: "rate_limited", recipient: "rate_limited"}
	before := healCounts(t, h)
	for i, want := range []heal{attempted, attempted, attempted, limited, limited} {
		if i > 0 {
			clk.Advance(time.Second)
		}
		r := send(t, h, donna, "lafonda", i)
		what := fmt.Sprintf("send %d", i+1)
		checkDelivery(t, what, r, "queued_offline", "route_without_queue")
		checkHeal(t, what, r, want)
	}
	checkHealDelta(t, "five sends", h, before, map[string]float64{"attempted": 3, "rate_limited": 2})

	// A third of the refill period brings back exactly one token (linear,
	// not a step at the end of the period).
	clk.Advance(20 * time.Second)
	before = healCounts(t, h)
	checkHeal(t, "after 20 s", send(t, h, donna, "lafonda", "a"), attempted)
	checkHeal(t, "after 20 s, again", send(t, h, donna, "lafonda", "b"), limited)
	checkHealDelta(t, "after 20 s", h, before, map[string]float64{"attempted": 1, "rate_limited": 1})

	// A whole period refills to capacity, and not beyond it.
	clk.Advance(60 * time.Second)
	before = healCounts(t, h)
	for i, want := range []heal{attempted, attempted, attempted, limited} {
		checkHeal(t, fmt.Sprintf("after the period, send %d", i+1), send(t, h, donna, "lafonda", i), want)
	}
	checkHealDelta(t, "after the period", h, before, map[string]float64{"attempted": 3, "rate_limited": 1})
}

// TestSPEC168_Scenario4_SenderSideAsymmetry: a live-WS sender without a queue
// (never attached, or its socket closed) is told sender_route_stale; its gate
// is the 600 s sender threshold; a codex sender has no sender side.
func TestSPEC168_Scenario4_SenderSideAsymmetry(t *testing.T) {
	h, clk := startHealHub(t, hub.Config{})
	lafonda := register(t, h, "lafonda", "claude_code")
	attachWS(t, h, lafonda) // the recipient is attached: only the sender side is evaluated
	donna := register(t, h, "donna", "claude_code")
	cody := register(t, h, "cody", "codex")
	dora := register(t, h, "dora", "console_ops")

	senderAttempted := heal{outcome: "attempted", sender: "attempted", senderStale: true}

	// Never attached, idle 400 s: beyond the 300 s route freshness, within the
	// 600 s sender threshold.
	clk.Advance(400 * time.Second)
	if rs := routeState(t, h, "donna"); rs["route_state"] != "stale" {
		t.Errorf("donna after 400 s idle: route_state %v, want stale", rs["route_state"])
	}
	before := healCounts(t, h)
	r := send(t, h, donna, "lafonda", "idle 400 s")
	checkDelivery(t, "idle 400 s", r, "pushed_to_ws", "attached")
	checkHeal(t, "idle 400 s", r, senderAttempted)
	checkHealDelta(t, "idle 400 s", h, before, map[string]float64{"attempted": 1})

	// Idle 700 s since that send: genuinely gone as a sender.
	clk.Advance(700 * time.Second)
	before = healCounts(t, h)
	r = send(t, h, donna, "lafonda", "idle 700 s")
	checkDelivery(t, "idle 700 s", r, "pushed_to_ws", "attached")
	checkHeal(t, "idle 700 s", r, heal{outcome: "stale_recency", sender: "stale_recency"})
	checkHealDelta(t, "idle 700 s", h, before, map[string]float64{"stale_recency": 1})

	// A codex sender is never evaluated, even with no queue.
	before = healCounts(t, h)
	r = send(t, h, cody, "lafonda", "from codex")
	checkDelivery(t, "codex sender", r, "pushed_to_ws", "attached")
	checkHeal(t, "codex sender", r, noHeal)
	checkHealDelta(t, "codex sender", h, before, nil)

	// Attached, then its socket closes: the next send tells it.
	doraWS, _ := attachWS(t, h, dora)
	r = send(t, h, dora, "lafonda", "while attached")
	checkHeal(t, "attached sender", r, noHeal)
	if err := doraWS.Close(websocket.StatusNormalClosure, "bye"); err != nil {
		t.Fatalf("close dora's socket: %v", err)
	}
	waitFor(t, "dora's queue to detach", func() bool {
		q, _ := routeState(t, h, "dora")["queue"].(map[string]any)
		return q["attached"] == false
	})
	before = healCounts(t, h)
	r = send(t, h, dora, "lafonda", "after the socket closed")
	checkDelivery(t, "closed sender", r, "pushed_to_ws", "attached")
	checkHeal(t, "closed sender", r, senderAttempted)
	checkHealDelta(t, "closed sender", h, before, map[string]float64{"attempted": 1})

	// Both sides broken in one send: each side counted once, both hints set.
	register(t, h, "bob", "headless_cc")
	before = healCounts(t, h)
	r = send(t, h, dora, "bob", "both sides")
	checkDelivery(t, "both sides", r, "queued_offline", "route_without_queue")
	checkHeal(t, "both sides", r, heal{outcome: "attempted", recipient: "attempted", sender: "attempted", recipientStale: true, senderStale: true})
	checkHealDelta(t, "both sides", h, before, map[string]float64{"attempted": 2})
}

// TestSPEC168_Scenario5_UnsupportedSurface: a codex recipient without a queue
// is unsupported_surface, with no hint, fresh or not (the surface gate comes
// first).
func TestSPEC168_Scenario5_UnsupportedSurface(t *testing.T) {
	h, clk := startHealHub(t, hub.Config{})
	donna := register(t, h, "donna", "claude_code")
	register(t, h, "cody", "codex")
	attachWS(t, h, donna)

	before := healCounts(t, h)
	r := send(t, h, donna, "cody", "fresh")
	checkDelivery(t, "fresh codex", r, "queued_offline", "route_without_queue")
	checkHeal(t, "fresh codex", r, heal{outcome: "unsupported_surface", recipient: "unsupported_surface"})

	clk.Advance(time.Hour - time.Minute)
	r = send(t, h, donna, "cody", "stale")
	checkDelivery(t, "stale codex", r, "not_available_offline", "stale")
	checkHeal(t, "stale codex", r, heal{outcome: "unsupported_surface", recipient: "unsupported_surface"})
	checkHealDelta(t, "codex recipient", h, before, map[string]float64{"unsupported_surface": 2})

	// No bucket is touched for it.
	if sh := routeSelfheal(t, routeState(t, h, "cody")); sh["eligible_surface"] != false || sh["recipient_tokens"] != float64(3) {
		t.Errorf("cody route_state selfheal = %v, want not eligible, 3 tokens", sh)
	}
}

// TestSPEC168_AC5_BucketsIsolatedByTenantProjectAndSide: exhausting t1/p1's
// "bob" leaves the "bob" of another tenant and of another project attempted,
// and leaves t1/p1 bob's own sender bucket full.
func TestSPEC168_AC5_BucketsIsolatedByTenantProjectAndSide(t *testing.T) {
	h, _ := startHealHub(t, hub.Config{})
	keys := map[string]string{"t1/p1": h.APIKey}
	for _, tp := range []string{"t2/p1", "t1/p2"} {
		tenant, project, _ := strings.Cut(tp, "/")
		st, resp := call(t, "POST", h.URL+"/v1/ops/api_keys", h.AdminToken, map[string]any{"tenant_id": tenant, "project_id": project})
		if st != http.StatusCreated {
			t.Fatalf("create api key %s: %d %v", tp, st, resp)
		}
		keys[tp] = resp["api_key"].(string)
	}
	alices, bobs := map[string]agent{}, map[string]agent{}
	for tp, key := range keys {
		alices[tp] = registerWith(t, h, key, "alice", "claude_code")
		tenant, project, _ := strings.Cut(tp, "/")
		attachWSIn(t, h, tenant, project, alices[tp])
		bobs[tp] = registerWith(t, h, key, "bob", "claude_code")
	}

	attempted := heal{outcome: "attempted", recipient: "attempted", recipientStale: true}
	for i := range 3 {
		checkHeal(t, fmt.Sprintf("t1/p1 send %d", i+1), send(t, h, alices["t1/p1"], "bob", i), attempted)
	}
	checkHeal(t, "t1/p1 send 4", send(t, h, alices["t1/p1"], "bob", 3), heal{outcome: "rate_limited", recipient: "rate_limited"})

	for _, tp := range []string{"t2/p1", "t1/p2"} {
		checkHeal(t, tp+" send 1", send(t, h, alices[tp], "bob", "hi"), attempted)
	}
	for tp, want := range map[string]float64{"t1/p1": 0, "t2/p1": 2, "t1/p2": 2} {
		tenant, project, _ := strings.Cut(tp, "/")
		sh := routeSelfheal(t, routeStateOf(t, h, tenant, project, "bob"))
		if sh["recipient_tokens"] != want || sh["sender_tokens"] != float64(3) {
			t.Errorf("%s bob: recipient_tokens %v sender_tokens %v, want %v and 3", tp, sh["recipient_tokens"], sh["sender_tokens"], want)
		}
	}

	// The same session's sender bucket is separate from its recipient bucket.
	r := send(t, h, bobs["t1/p1"], "alice", "reply")
	checkHeal(t, "t1/p1 bob replies", r, heal{outcome: "attempted", sender: "attempted", senderStale: true})
}

// spec168Script runs one fixed sequence of sends touching every gate and
// returns the responses, for comparing a hub with self-heal on and off.
func spec168Script(t *testing.T, h *hubtest.Hub, clk *hubtest.Clock) []map[string]any {
	t.Helper()
	donna := register(t, h, "donna", "claude_code")
	lafonda := register(t, h, "lafonda", "claude_code")
	cody := register(t, h, "cody", "codex")
	register(t, h, "ghost", "headless_cx")
	attachWS(t, h, donna)

	var out []map[string]any
	for i := range 4 { // attempted ×3, rate_limited
		out = append(out, send(t, h, donna, "lafonda", i))
	}
	out = append(out,
		send(t, h, lafonda, "donna", "sender side"), // sender attempted
		send(t, h, donna, "cody", "unsupported"),    // unsupported_surface
		send(t, h, cody, "lafonda", "codex sender"), // recipient rate_limited, no sender side
	)
	clk.Advance(301 * time.Second)
	out = append(out,
		send(t, h, donna, "ghost", "stale"),           // stale_recency
		send(t, h, lafonda, "ghost", "both sides"),    // recipient stale, sender attempted
		send(t, h, lafonda, "donna", "sender bucket"), // sender attempted
	)
	attachWS(t, h, lafonda)
	out = append(out, send(t, h, donna, "lafonda", "attached")) // nothing to heal
	return out
}

// TestSPEC168_AC9_FlagOffChangesNothingButHints: with self-heal off (a lan
// hub with Enabled false), no hint is set, both sides are null, nothing is
// counted, and every send is classified, sequenced and piggybacked exactly as
// on a hub with self-heal on.
func TestSPEC168_AC9_FlagOffChangesNothingButHints(t *testing.T) {
	off := selfheal.DefaultConfig()
	off.Enabled = false
	hOff, clkOff := startHealHub(t, hub.Config{Mode: "lan", SelfHeal: off})
	hOn, clkOn := startHealHub(t, hub.Config{})

	beforeOff := healCounts(t, hOff)
	gotOff := spec168Script(t, hOff, clkOff)
	gotOn := spec168Script(t, hOn, clkOn)

	for i, r := range gotOff {
		checkHeal(t, fmt.Sprintf("off, send %d", i+1), r, noHeal)
	}
	checkHealDelta(t, "off", hOff, beforeOff, nil)
	for o, v := range healCounts(t, hOff) {
		if v != 0 {
			t.Errorf("off: %s{outcome=%q} = %v, want 0", selfheal.MetricName, o, v)
		}
	}
	if sh := routeSelfheal(t, routeState(t, hOff, "lafonda")); sh["enabled"] != false {
		t.Errorf("off: route_state selfheal.enabled = %v", sh["enabled"])
	}

	// The comparison means something only if the script exercised the gates.
	seen := map[any]bool{}
	for _, r := range gotOn {
		seen[r["selfheal"].(map[string]any)["recipient"]] = true
		seen[r["selfheal"].(map[string]any)["sender"]] = true
	}
	for _, o := range []string{"attempted", "rate_limited", "stale_recency", "unsupported_surface"} {
		if !seen[o] {
			t.Errorf("on: the script never produced %s", o)
		}
	}

	if len(gotOff) != len(gotOn) {
		t.Fatalf("%d responses off, %d on", len(gotOff), len(gotOn))
	}
	for i := range gotOn {
		on, off := gotOn[i], gotOff[i]
		for _, k := range []string{"delivery", "recipient_route_state", "seq", "duplicate"} {
			if on[k] != off[k] {
				t.Errorf("send %d: %s on %v, off %v", i+1, k, on[k], off[k])
			}
		}
		pOn, _ := on["pending"].([]any)
		pOff, _ := off["pending"].([]any)
		if len(pOn) != len(pOff) {
			t.Errorf("send %d: %d pending on, %d off", i+1, len(pOn), len(pOff))
		}
	}
}

// TestSPEC168_RouteStateShowsSelfhealAndTokens: the operator view shows the
// flag, the surface's eligibility, and the recipient bucket going 3 → 2 after
// one attempted send and refilling linearly.
func TestSPEC168_RouteStateShowsSelfhealAndTokens(t *testing.T) {
	h, clk := startHealHub(t, hub.Config{})
	donna := register(t, h, "donna", "claude_code")
	register(t, h, "lafonda", "claude_code")
	register(t, h, "cody", "codex")
	attachWS(t, h, donna)

	rs := routeState(t, h, "lafonda")
	sh := routeSelfheal(t, rs)
	if rs["route_state"] != "route_without_queue" || sh["enabled"] != true || sh["eligible_surface"] != true ||
		sh["recipient_tokens"] != float64(3) || sh["sender_tokens"] != float64(3) {
		t.Fatalf("lafonda before: route_state %v selfheal %v", rs["route_state"], sh)
	}
	if sh := routeSelfheal(t, routeState(t, h, "cody")); sh["eligible_surface"] != false {
		t.Errorf("cody eligible_surface = %v, want false", sh["eligible_surface"])
	}

	checkHeal(t, "one send", send(t, h, donna, "lafonda", "x"), heal{outcome: "attempted", recipient: "attempted", recipientStale: true})
	sh = routeSelfheal(t, routeState(t, h, "lafonda"))
	if sh["recipient_tokens"] != float64(2) || sh["sender_tokens"] != float64(3) {
		t.Errorf("lafonda after one attempted send: %v, want recipient_tokens 2, sender_tokens 3", sh)
	}
	clk.Advance(10 * time.Second)
	if sh := routeSelfheal(t, routeState(t, h, "lafonda")); sh["recipient_tokens"] != 2.5 {
		t.Errorf("lafonda 10 s later: recipient_tokens %v, want 2.5", sh["recipient_tokens"])
	}
}

// TestSPEC168_AC11_MetricExportedFromStart: /metrics carries exactly the seven
// outcome series, at 0, before any send, whether self-heal is on or off.
func TestSPEC168_AC11_MetricExportedFromStart(t *testing.T) {
	off := selfheal.DefaultConfig()
	off.Enabled = false
	for name, cfg := range map[string]hub.Config{"on": {}, "off": {Mode: "lan", SelfHeal: off}} {
		t.Run(name, func(t *testing.T) {
			h, _ := startHealHub(t, cfg)
			resp, err := http.Get(h.URL + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for _, line := range strings.Split(string(raw), "\n") {
				if strings.HasPrefix(line, selfheal.MetricName+"{") {
					got[line] = true
				}
			}
			want := map[string]bool{}
			for _, o := range marconi.Outcomes {
				want[fmt.Sprintf("%s{outcome=%q} 0", selfheal.MetricName, o)] = true
			}
			if !maps.Equal(got, want) {
				t.Errorf("/metrics series of %s:\n got %v\nwant %v", selfheal.MetricName, got, want)
			}
		})
	}
}
