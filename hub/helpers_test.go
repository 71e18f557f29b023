package hub_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/metrictest"
)

// call does one HTTP request and decodes the JSON answer into a map.
func call(t *testing.T, method, url, cred string, body any, hdr ...string) (int, map[string]any) {
	t.Helper()
	return hubtest.Call(t, method, url, cred, body, hdr...)
}

// errCode returns the error code of an error answer.
func errCode(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

type agent = hubtest.Agent

// register registers a session and fails the test unless it gets 201.
func register(t *testing.T, h *hubtest.Hub, id, surface string, extra ...map[string]any) agent {
	t.Helper()
	body := map[string]any{"session_id": id, "surface": surface}
	for _, e := range extra {
		for k, v := range e {
			body[k] = v
		}
	}
	st, resp := call(t, "POST", h.URL+"/v1/sessions", h.APIKey, body)
	if st != http.StatusCreated {
		t.Fatalf("register %s: %d %v", id, st, resp)
	}
	return agent{ID: resp["session_id"].(string), Token: resp["token"].(string)}
}

func send(t *testing.T, h *hubtest.Hub, from agent, to string, payload any) map[string]any {
	t.Helper()
	st, resp := call(t, "POST", h.URL+"/v1/signals", from.Token, map[string]any{"to_session": to, "payload": payload})
	if st != http.StatusOK {
		t.Fatalf("send %s→%s: %d %v", from.ID, to, st, resp)
	}
	return resp
}

// dial attaches a's WebSocket and reads the welcome frame.
func dial(t *testing.T, h *hubtest.Hub, a agent) (*websocket.Conn, map[string]any) {
	t.Helper()
	return h.Dial(t, a.Token)
}

func readFrame(t *testing.T, c *websocket.Conn) map[string]any {
	t.Helper()
	return hubtest.ReadFrame(t, c)
}

func writeFrame(t *testing.T, c *websocket.Conn, v any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, _ := json.Marshal(v)
	if err := c.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatalf("write frame: %v", err)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	hubtest.WaitFor(t, what, cond)
}

// routeState reads one session's route_state through the ops API.
func routeState(t *testing.T, h *hubtest.Hub, session string) map[string]any {
	t.Helper()
	st, rs := call(t, "GET", h.URL+"/v1/ops/route_state/t1/p1/"+session, h.AdminToken, nil)
	if st != http.StatusOK {
		t.Fatalf("route_state %s: %d %v", session, st, rs)
	}
	return rs
}

func metric(t *testing.T, h *hubtest.Hub, name string, labels ...string) float64 {
	t.Helper()
	v, ok := lookupMetric(t, h, name, labels...)
	if !ok {
		t.Fatalf("metric %s%v not found", name, labels)
	}
	return v
}

// lookupMetric returns the value of the first counter or gauge series named
// name with the given label pairs, and whether there is one.
func lookupMetric(t *testing.T, h *hubtest.Hub, name string, labels ...string) (float64, bool) {
	t.Helper()
	return metrictest.Lookup(t, h.Registry, name, labels...)
}

var _ = testutil.ToFloat64

func closeStatus(err error) int { return int(websocket.CloseStatus(err)) }
