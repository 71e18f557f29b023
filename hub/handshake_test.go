package hub_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
)

// Issue 12.4: a request to /v1/ws that is no WebSocket handshake must change
// nothing. A sticky session past its grace window, under the drop policy,
// loses its pending signals at the next attach (an affinity reset); a plain
// GET with its token must not be that attach.
func TestPlainGETOnWSDropsNothing(t *testing.T) {
	t.Parallel()
	c := newFabCluster(t, false, hub.Config{Fabric: fabric.Config{DisconnectPolicy: fabric.PolicyDrop}})
	a := c.start("hub-a", nil)
	sticky, _ := fabRegister(t, a, "sticky", map[string]any{"runtime_mode": "sticky"})
	sender, _ := fabRegister(t, a, "sender", nil)
	ws, _ := mustAttach(t, a, sticky)
	detach(t, a, ws, sticky)
	sendAs(t, a, sender, "sticky", "for the old runtime")
	c.clock.Advance(61 * time.Second)
	c.tick("hub-a")

	for _, tc := range []struct {
		name   string
		hdr    map[string]string
		status int
		code   string
	}{
		{"plain GET", nil, http.StatusUpgradeRequired, "upgrade_required"},
		{"upgrade to something else", map[string]string{"Connection": "Upgrade", "Upgrade": "h2c"}, http.StatusUpgradeRequired, "upgrade_required"},
		{"no key", map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13"}, http.StatusBadRequest, "invalid_field"},
		{"bad key", map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dG9vIHNob3J0"}, http.StatusBadRequest, "invalid_field"},
		{"bad version", map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "8", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}, http.StatusBadRequest, "invalid_field"},
	} {
		req, err := http.NewRequest("GET", a.URL+"/v1/ws", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+sticky.Token)
		for k, v := range tc.hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body map[string]any
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		_ = json.Unmarshal(raw, &body)
		if resp.StatusCode != tc.status || errCode(body) != tc.code {
			t.Errorf("%s: %d %q, want %d %s", tc.name, resp.StatusCode, raw, tc.status, tc.code)
		}
	}

	if got := metric(t, a, "marconi_signals_dropped_total", "reason", "affinity_reset"); got != 0 {
		t.Fatalf("marconi_signals_dropped_total{affinity_reset} = %v after refused handshakes, want 0", got)
	}
	if tt := totals(summary(t, a)); tt["total_reassignments"] != 0.0 || tt["total_fallbacks"] != 0.0 {
		t.Fatalf("totals %v after refused handshakes, want no takeover", tt)
	}
	if n := pendingOf(t, a, "sticky"); n != 1 {
		t.Fatalf("sticky has %d pending signals after refused handshakes, want 1", n)
	}
	// The real attach after them is the one that resets affinity and drops.
	_, w := mustAttach(t, a, sticky)
	if w["affinity_reset"] != true || w["dropped"] != 1.0 {
		t.Fatalf("welcome %v, want the affinity reset to drop 1", w)
	}
}

// The connection caps refuse at the handshake with 429 quota_exceeded and
// Retry-After, before authentication; a closed connection frees its slot.
func TestConnectionCapsRefuseAtHandshake(t *testing.T) {
	t.Parallel()
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{MaxConnectionsPerAddress: 2}})
	a := register(t, h, "a", "claude_code")
	b := register(t, h, "b", "claude_code")
	c := register(t, h, "c", "claude_code")
	ca, _ := attachWS(t, h, a)
	attachWS(t, h, b)

	upgrade := []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}
	st, body := call(t, "GET", h.URL+"/v1/ws", c.Token, nil, upgrade...)
	if st != http.StatusTooManyRequests || errCode(body) != "quota_exceeded" || !strings.Contains(body["error"].(map[string]any)["message"].(string), "connections_per_address") {
		t.Fatalf("third connection from one address: %d %v, want 429 quota_exceeded naming connections_per_address", st, body)
	}
	if q, _ := routeState(t, h, "c")["queue"].(map[string]any); q["attached"] != false {
		t.Fatalf("refused session c has a queue: %v", q)
	}
	_ = ca.Close(websocket.StatusNormalClosure, "make room")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waitFor(t, "a slot to free up", func() bool {
		cc, resp, err := websocket.Dial(ctx, h.WSURL(), &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + c.Token}}})
		if err != nil {
			if resp == nil || resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("dial c: %v %v", resp, err)
			}
			return false
		}
		cc.CloseNow()
		return true
	})
}
