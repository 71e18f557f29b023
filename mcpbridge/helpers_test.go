//lint:file-ignore SA1019 the tests read the bridge's MCP log messages, which API.md requires (see logs.go).

package mcpbridge_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/marconihub/marconi/internal/testwait"
)

// waitFor is how long a test waits for something it polls for.
const waitFor = 30 * time.Second

// agent is one `marconi mcp` process driven by the Go SDK's MCP client over
// stdio, with what the server told it: inbox notifications and log messages.
type agent struct {
	t       *testing.T
	name    string
	session *mcp.ClientSession
	cmd     *exec.Cmd
	stderr  *syncBuffer

	updated chan struct{} // one per notifications/resources/updated (cap large)
	mu      sync.Mutex
	logs    []string // the data of every log message, as JSON
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startAgent runs `marconi mcp` with the given flags against hubURL and
// connects to it; the process is stopped when the test ends.
func startAgent(t *testing.T, name, hubURL, apiKey string, flags ...string) *agent {
	t.Helper()
	args := append([]string{"mcp", "--hub", hubURL, "--api-key", apiKey, "--session", name}, flags...)
	if !slices.ContainsFunc(flags, func(f string) bool { return strings.HasPrefix(f, "--state-dir") }) {
		args = append(args, "--state-dir", t.TempDir())
	}
	cmd := exec.Command(marconiBin, args...)
	cmd.Env = cleanEnv()
	a := &agent{t: t, name: name, cmd: cmd, stderr: &syncBuffer{}, updated: make(chan struct{}, 1000)}
	cmd.Stderr = a.stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "marconi-test", Version: "0"}, &mcp.ClientOptions{
		ResourceUpdatedHandler: func(context.Context, *mcp.ResourceUpdatedNotificationRequest) {
			select {
			case a.updated <- struct{}{}:
			default:
			}
		},
		LoggingMessageHandler: func(_ context.Context, r *mcp.LoggingMessageRequest) {
			data, _ := json.Marshal(r.Params.Data)
			a.mu.Lock()
			a.logs = append(a.logs, string(data))
			a.mu.Unlock()
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("start %s: %v\nstderr:\n%s", name, err, a.stderr.String())
	}
	a.session = cs
	if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
		t.Fatalf("%s: set logging level: %v", name, err)
	}
	t.Cleanup(a.stop)
	return a
}

// cleanEnv is the test's environment without MARCONI_* variables, so that
// only the flags configure the bridge.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MARCONI_") {
			env = append(env, kv)
		}
	}
	return env
}

// stop closes the host's side (stdin), as a host that exits does, and waits
// for the process.
func (a *agent) stop() {
	if a.session != nil {
		_ = a.session.Close()
		a.session = nil
	}
}

// kill ends the process with SIGKILL, as a host killed with its server.
func (a *agent) kill() {
	a.t.Helper()
	_ = a.cmd.Process.Kill()
	a.stop()
}

// call calls a tool and returns its result; a protocol error fails the test.
func (a *agent) call(tool string, args any) *mcp.CallToolResult {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitFor+5*time.Second)
	defer cancel()
	res, err := a.session.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		a.t.Fatalf("%s: call %s: %v\nstderr:\n%s", a.name, tool, err, a.stderr.String())
	}
	return res
}

// ok calls a tool that must succeed and decodes its structured content.
func (a *agent) ok(tool string, args any, out any) {
	a.t.Helper()
	res := a.call(tool, args)
	if res.IsError {
		a.t.Fatalf("%s: %s(%v) failed: %s", a.name, tool, args, text(res))
	}
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		a.t.Fatal(err)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		a.t.Fatalf("%s: %s: decode %s: %v", a.name, tool, raw, err)
	}
}

// toolErr calls a tool that must fail as a tool error and returns the
// error's code and message.
func (a *agent) toolErr(tool string, args any) (code, message string) {
	a.t.Helper()
	res := a.call(tool, args)
	if !res.IsError {
		a.t.Fatalf("%s: %s(%v) succeeded, want a tool error: %s", a.name, tool, args, text(res))
	}
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(text(res)), &e); err != nil {
		a.t.Fatalf("%s: tool error is not the error shape: %q", a.name, text(res))
	}
	return e.Error.Code, e.Error.Message
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

type signal struct {
	ID        string          `json:"id"`
	Seq       int64           `json:"seq"`
	From      string          `json:"from"`
	Kind      string          `json:"kind"`
	Payload   json.RawMessage `json:"payload"`
	CreatedAt time.Time       `json:"created_at"`
}

type sendResult struct {
	SignalID            string   `json:"signal_id"`
	Seq                 int64    `json:"seq"`
	Delivery            string   `json:"delivery"`
	RecipientRouteState string   `json:"recipient_route_state"`
	RecipientRouteStale bool     `json:"recipient_route_stale"`
	SenderRouteStale    bool     `json:"sender_route_stale"`
	SelfhealOutcome     *string  `json:"selfheal_outcome"`
	Duplicate           bool     `json:"duplicate"`
	Received            []signal `json:"received"`
}

type readResult struct {
	Signals []signal `json:"signals"`
	More    bool     `json:"more"`
}

type whoami struct {
	SessionID   string `json:"session_id"`
	TenantID    string `json:"tenant_id"`
	ProjectID   string `json:"project_id"`
	Surface     string `json:"surface"`
	RuntimeMode string `json:"runtime_mode"`
	RouteState  string `json:"route_state"`
	Pending     int    `json:"pending"`
	Hub         string `json:"hub"`
}

// send sends text to another agent and returns the answer; the signals it
// brought back are recorded in got.
func (a *agent) send(to, msg string, got *[]signal) sendResult {
	a.t.Helper()
	var r sendResult
	a.ok("send_signal", map[string]any{"to": to, "text": msg}, &r)
	if got != nil {
		*got = append(*got, r.Received...)
	}
	return r
}

// readUntil reads signals (waiting up to a few seconds per call) until n
// have been returned in all, counting those already in got, and fails past
// the deadline.
func (a *agent) readUntil(n int, got *[]signal) {
	a.t.Helper()
	deadline := time.Now().Add(waitFor)
	for len(*got) < n {
		if time.Now().After(deadline) {
			a.t.Fatalf("%s: %d signals read within %s, want %d: %v\nstderr:\n%s", a.name, len(*got), waitFor, n, *got, a.stderr.String())
		}
		var r readResult
		a.ok("read_signals", map[string]any{"wait_seconds": 5}, &r)
		*got = append(*got, r.Signals...)
	}
}

// texts is the text of each signal, in order.
func texts(t *testing.T, sigs []signal) []string {
	t.Helper()
	out := make([]string, len(sigs))
	for i, s := range sigs {
		var p struct{ Text string }
		if err := json.Unmarshal(s.Payload, &p); err != nil {
			t.Fatalf("payload %s: %v", s.Payload, err)
		}
		out[i] = p.Text
	}
	return out
}

// hasLog reports whether some log message the server sent contains s.
func (a *agent) hasLog(s string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, l := range a.logs {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.For(t, what, waitFor, cond)
}

// opsGet GETs an operator endpoint of the hub and decodes its answer.
func opsGet(t *testing.T, hubURL, adminToken, path string, out any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, hubURL+path, nil)
	req.Close = true // no idle connection left behind
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", path, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
}

// routeState is the hub's route state of a session of t1/p1, with when its
// queue was attached.
func routeState(t *testing.T, hubURL, adminToken, session string) (state, attachedAt string) {
	t.Helper()
	var r struct {
		RouteState string `json:"route_state"`
		Queue      struct {
			AttachedAt *string `json:"attached_at"`
		} `json:"queue"`
	}
	opsGet(t, hubURL, adminToken, fmt.Sprintf("/v1/ops/route_state/t1/p1/%s", session), &r)
	if r.Queue.AttachedAt != nil {
		attachedAt = *r.Queue.AttachedAt
	}
	return r.RouteState, attachedAt
}
