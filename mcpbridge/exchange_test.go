package mcpbridge_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
)

// Two MCP servers, two sessions: signals both ways, each returned once and in
// order, the inbox subscription notified, whoami and the inbox resource.
func TestTwoAgentsExchangeSignals(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	alice := startAgent(t, "alice", h.URL, h.APIKey)
	bob := startAgent(t, "bob", h.URL, h.APIKey)

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := bob.session.Subscribe(ctx, &mcp.SubscribeParams{URI: "marconi://inbox"}); err != nil {
		t.Fatalf("subscribe: %v", err)
	}

	tools, err := alice.session.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
		if tool.Description == "" || tool.InputSchema == nil || tool.OutputSchema == nil {
			t.Errorf("tool %s lacks a description or a schema", tool.Name)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"read_signals", "send_signal", "whoami"}) {
		t.Fatalf("tools %v", names)
	}

	var me whoami
	alice.ok("whoami", nil, &me)
	if me.SessionID != "alice" || me.TenantID != "t1" || me.ProjectID != "p1" || me.Surface != "claude_code" ||
		me.RouteState != "attached" || me.Pending != 0 || me.Hub != h.URL {
		t.Fatalf("whoami: %+v", me)
	}

	var r sendResult
	alice.ok("send_signal", map[string]any{"to": "bob", "text": "one"}, &r)
	if r.Delivery != "pushed_to_ws" || r.Seq != 1 || r.SignalID == "" || r.Duplicate {
		t.Fatalf("first send: %+v", r)
	}
	alice.ok("send_signal", map[string]any{"to": "bob", "payload": map[string]any{"text": "two", "n": 2}, "kind": "review_request"}, &r)
	alice.send("bob", "three", nil)

	select {
	case <-bob.updated:
	case <-ctx.Done():
		t.Fatal("no notifications/resources/updated for marconi://inbox")
	}
	eventually(t, "bob's inbox resource lists three signals", func() bool {
		res, err := bob.session.ReadResource(ctx, &mcp.ReadResourceParams{URI: "marconi://inbox"})
		if err != nil {
			t.Fatal(err)
		}
		var inbox struct{ Signals []signal }
		if err := json.Unmarshal([]byte(res.Contents[0].Text), &inbox); err != nil {
			t.Fatal(err)
		}
		return len(inbox.Signals) == 3
	})

	var got []signal
	bob.readUntil(3, &got)
	if tx := texts(t, got); !slices.Equal(tx, []string{"one", "two", "three"}) {
		t.Fatalf("bob read %v", tx)
	}
	for i, s := range got {
		if s.From != "alice" || s.Seq != int64(i+1) {
			t.Errorf("signal %d: %+v", i, s)
		}
	}
	if got[1].Kind != "review_request" || !strings.Contains(string(got[1].Payload), `"n":2`) || got[0].Kind != "signal" {
		t.Errorf("kinds or payload: %+v", got)
	}
	var again readResult
	bob.ok("read_signals", nil, &again)
	if len(again.Signals) != 0 || again.More {
		t.Fatalf("signals returned twice: %+v", again)
	}
	// Acknowledged on the hub once returned: nothing of bob's is pending.
	eventually(t, "bob's signals acknowledged on the hub", func() bool {
		var p struct{ Total int }
		opsGet(t, h.URL, h.AdminToken, "/v1/ops/sessions/t1/p1/bob/signals", &p)
		return p.Total == 0
	})

	// And back: alice waits for the answers.
	var back []signal
	bob.send("alice", "reply 1", &back)
	bob.send("alice", "reply 2", &back)
	if len(back) != 0 {
		t.Fatalf("bob's sends brought back %v", back)
	}
	alice.readUntil(2, &back)
	if tx := texts(t, back); !slices.Equal(tx, []string{"reply 1", "reply 2"}) {
		t.Fatalf("alice read %v", tx)
	}

	// max bounds a read; more says the rest is waiting.
	for _, s := range []string{"a", "b", "c"} {
		alice.send("bob", s, nil)
	}
	eventually(t, "bob holds three more", func() bool {
		var me whoami
		bob.ok("whoami", nil, &me)
		return me.Pending == 3
	})
	var first readResult
	bob.ok("read_signals", map[string]any{"max": 2}, &first)
	if tx := texts(t, first.Signals); !slices.Equal(tx, []string{"a", "b"}) || !first.More {
		t.Fatalf("max 2: %v more=%v", tx, first.More)
	}
	var rest readResult
	bob.ok("read_signals", map[string]any{"max": 2}, &rest)
	if tx := texts(t, rest.Signals); !slices.Equal(tx, []string{"c"}) || rest.More {
		t.Fatalf("the rest: %v more=%v", tx, rest.More)
	}
}

// A read that waits returns as soon as a signal arrives.
func TestReadSignalsWaits(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	alice := startAgent(t, "alice", h.URL, h.APIKey)
	bob := startAgent(t, "bob", h.URL, h.APIKey)
	done := make(chan readResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor+10*time.Second)
		defer cancel()
		res, err := bob.session.CallTool(ctx, &mcp.CallToolParams{Name: "read_signals", Arguments: map[string]any{"wait_seconds": 60}})
		var r readResult
		if err == nil && !res.IsError {
			raw, _ := json.Marshal(res.StructuredContent)
			_ = json.Unmarshal(raw, &r)
		}
		done <- r
	}()
	alice.send("bob", "wake up", nil)
	r := <-done
	if tx := texts(t, r.Signals); !slices.Equal(tx, []string{"wake up"}) {
		t.Fatalf("the waiting read returned %v", tx)
	}
}

// Bad input is a tool error with a stable code, and the server lives on.
func TestBadInputIsToolError(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{MaxPayloadBytes: 1024}})
	alice := startAgent(t, "alice", h.URL, h.APIKey)
	startAgent(t, "bob", h.URL, h.APIKey)
	cases := []struct {
		name, tool string
		args       any
		code, says string
	}{
		{"unknown tool", "prism_signal", map[string]any{"to": "bob"}, "unknown_tool", "send_signal"},
		{"missing to", "send_signal", map[string]any{"text": "hi"}, "invalid_field", "to is required"},
		{"no message", "send_signal", map[string]any{"to": "bob"}, "invalid_field", "text or payload"},
		{"text and payload", "send_signal", map[string]any{"to": "bob", "text": "x", "payload": map[string]any{}}, "invalid_field", "not both"},
		{"payload not an object", "send_signal", map[string]any{"to": "bob", "payload": []int{1}}, "invalid_field", "object"},
		{"unknown field", "send_signal", map[string]any{"to": "bob", "text": "x", "urgent": true}, "invalid_field", "urgent"},
		{"payload too large", "send_signal", map[string]any{"to": "bob", "text": strings.Repeat("x", 2000)}, "payload_too_large", ""},
		{"unknown recipient", "send_signal", map[string]any{"to": "nobody", "text": "x"}, "recipient_not_registered", ""},
		{"bad recipient", "send_signal", map[string]any{"to": "..", "text": "x"}, "", ""},
		{"max too big", "read_signals", map[string]any{"max": 501}, "invalid_field", "max"},
		{"wait too long", "read_signals", map[string]any{"wait_seconds": 61}, "invalid_field", "wait_seconds"},
		{"whoami with arguments", "whoami", map[string]any{"x": 1}, "invalid_field", "x"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			alice.t = t
			code, msg := alice.toolErr(c.tool, c.args)
			if c.code != "" && code != c.code {
				t.Errorf("code %q (%s), want %q", code, msg, c.code)
			}
			if code == "" || msg == "" {
				t.Errorf("empty code or message: %q %q", code, msg)
			}
			if !strings.Contains(msg, c.says) {
				t.Errorf("message %q does not say %q", msg, c.says)
			}
		})
	}
	alice.t = t
	// Nothing of it reached bob; the server still works.
	var r sendResult
	alice.ok("send_signal", map[string]any{"to": "bob", "text": "still here"}, &r)
	if r.Seq != 1 {
		t.Fatalf("bob's first stored signal has seq %d: a bad send stored something", r.Seq)
	}
}
