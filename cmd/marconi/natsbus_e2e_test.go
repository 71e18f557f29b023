package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"

	"github.com/marconihub/marconi/internal/natstest"
	"github.com/marconihub/marconi/internal/pgtest"
)

// TestTwoInstancesWakeThroughNATS runs two hub processes in-process on one
// database with MARCONI_BUS_URL set: a send on hub-a reaches a WebSocket on
// hub-b with the pending sweep an hour away, so by the NATS bus, and each
// still sees the other's process connected (the liveness lock the Postgres
// listener holds beside NATS).
func TestTwoInstancesWakeThroughNATS(t *testing.T) {
	db := pgtest.Schema(t)
	bus := natstest.URL(t)
	const key, admin = "e2e-key-0123456789abcdef", "e2e-admin-0123456789abcdef"
	common := func(id string) map[string]string {
		return map[string]string{
			"MARCONI_DATABASE_URL": db, "MARCONI_BUS_URL": bus, "MARCONI_MODE": "lan",
			"MARCONI_API_KEYS": key + "=t/p", "MARCONI_ADMIN_TOKEN": admin,
			"MARCONI_INSTANCE_ID": id, "MARCONI_PUBLIC_URL": "http://" + id + ".example",
			"MARCONI_PENDING_SWEEP_SECONDS": "3600",
		}
	}
	a, _ := startMain(t, common("hub-a"))
	b, _ := startMain(t, common("hub-b"))

	process := func(base, id string) any {
		_, s := fabricCall(t, "GET", base+"/v1/ops/fabric/summary", admin, nil)
		ins, _ := s["instances"].([]any)
		for _, in := range ins {
			if m := in.(map[string]any); m["instance_id"] == id {
				return m["process"]
			}
		}
		return nil
	}
	pollUntil(t, "hub-b to see hub-a's process connected", func() bool { return process(b.URL(), "hub-a") == "connected" })

	token := map[string]string{}
	for _, id := range []string{"alice", "bob-e2e"} {
		st, r := fabricCall(t, "POST", a.URL()+"/v1/sessions", key, map[string]any{"session_id": id, "surface": "claude_code", "runtime_mode": "stateless"})
		if st != http.StatusCreated {
			t.Fatalf("register %s: %d %v", id, st, r)
		}
		token[id] = r["token"].(string)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(b.URL(), "http")+"/v1/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token["bob-e2e"]}}})
	if err != nil {
		t.Fatalf("attach bob on hub-b: %v", err)
	}
	defer c.CloseNow()
	read := func() map[string]any {
		_, data, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		var f map[string]any
		if err := json.Unmarshal(data, &f); err != nil {
			t.Fatalf("frame %q: %v", data, err)
		}
		return f
	}
	if w := read(); w["type"] != "welcome" || w["instance_id"] != "hub-b" {
		t.Fatalf("welcome %v, want one from hub-b", w)
	}
	// Listen in on the wake-ups on NATS, to see they travel there.
	nc, err := nats.Connect(bus)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("marconi.wake.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		if st, r := fabricCall(t, "POST", a.URL()+"/v1/signals", token["alice"], map[string]any{"to_session": "bob-e2e", "payload": i}); st != http.StatusOK {
			t.Fatalf("send %d on hub-a: %d %v", i, st, r)
		}
	}
	for i := 1; i <= 3; i++ {
		if f := read(); f["type"] != "signal" || f["seq"] != float64(i) || f["payload"] != float64(i) {
			t.Fatalf("frame %v, want signal %d", f, i)
		}
	}
	for {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no wake-up for bob-e2e seen on NATS: %v", err)
		}
		if strings.Contains(string(m.Data), `"session":"bob-e2e"`) {
			break
		}
	}
	_ = c.Close(websocket.StatusNormalClosure, "bye")
}
