package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/internal/pgtest"
)

const (
	opsAdmin = "madm_ops_cli_test_local_only"
	opsKey   = "mak_ops_cli_test_local_only=t/p"
)

// opsHub is an in-memory lan hub for the operator's commands, and what
// every command printed, to hold them to never printing the admin token.
type opsHub struct {
	t      *testing.T
	m      *Main
	output strings.Builder
}

func startOpsHub(t *testing.T) *opsHub {
	m, _ := startMain(t, map[string]string{"MARCONI_MODE": "lan", "MARCONI_ADMIN_TOKEN": opsAdmin, "MARCONI_API_KEYS": opsKey, "MARCONI_SELFHEAL": "on"})
	h := &opsHub{t: t, m: m}
	t.Cleanup(func() {
		if strings.Contains(h.output.String(), opsAdmin) {
			t.Errorf("a command printed the admin token")
		}
	})
	return h
}

// run runs a command with the admin token (and kv), keeping its output.
func (h *opsHub) run(kv map[string]string, stdin string, terminal bool, args ...string) (int, string, string) {
	h.t.Helper()
	env := map[string]string{"MARCONI_ADMIN_TOKEN": opsAdmin}
	for k, v := range kv {
		env[k] = v
	}
	code, out, errOut := runCLI(h.t, env, stdin, terminal, args...)
	h.output.WriteString(out + errOut)
	return code, out, errOut
}

// want runs a command and fails unless it exits code with every one of
// wants on stdout (code 0) or stderr (else).
func (h *opsHub) want(code int, wants []string, args ...string) string {
	h.t.Helper()
	got, out, errOut := h.run(nil, "", false, args...)
	text := out
	if code != 0 {
		text = errOut
	}
	ok := got == code
	for _, w := range wants {
		ok = ok && strings.Contains(text, w)
	}
	if !ok {
		h.t.Errorf("marconi %s: exit %d, stdout %q, stderr %q; want exit %d with %q", strings.Join(args, " "), got, out, errOut, code, wants)
	}
	return out
}

// opsAgent dials one agent on hubURL with apiKey.
func opsAgent(t *testing.T, hubURL, apiKey, id string) *bootstrap.Client {
	t.Helper()
	return dialAgentAt(t, hubURL, apiKey, id, "", false, newFailoverLedger()).c
}

// TestOpsCommandsAnswerTheOperator runs every operator's command against a
// hub with alice attached and bob registered without a WebSocket, holding
// one signal from alice: what each prints, and each kind of refusal.
func TestOpsCommandsAnswerTheOperator(t *testing.T) {
	h := startOpsHub(t)
	hub := h.m.URL()
	key, _, _ := strings.Cut(opsKey, "=")
	alice := opsAgent(t, hub, key, "alice")
	if a := post(t, hub+"/v1/sessions", key, `{"session_id":"bob","surface":"claude_code"}`); a.status != http.StatusCreated {
		t.Fatalf("register bob: %+v", a)
	}
	for _, kind := range []string{"review.request", "review.nudge"} {
		if _, err := alice.Send(context.Background(), "bob", kind, map[string]string{"pr": "7"}); err != nil {
			t.Fatal(err)
		}
	}

	h.want(0, []string{"t/p/alice", "attached", "A WebSocket queue is attached", "holder", "(healthy), attached at", "pending", "0 signal(s)", "self-heal", "on; tokens left"},
		"route", hub, "t/p/alice")
	h.want(0, []string{"t/p/bob", "route_without_queue", "holder", "none: no instance holds a WebSocket", "proof of life", "registered_at", "2 signal(s)"},
		"route", hub+"/", "t/p/bob")
	h.want(0, []string{"t/p/carol", "not_registered", "never registered"}, "route", hub, "t/p/carol")
	// MARCONI_HUB_URL stands in for HUB_URL.
	if code, out, errOut := h.run(map[string]string{"MARCONI_HUB_URL": hub}, "", false, "route", "t/p/alice", "--json"); code != 0 {
		t.Errorf("route --json with MARCONI_HUB_URL: exit %d %q", code, errOut)
	} else {
		var r struct {
			RouteState  string `json:"route_state"`
			Explanation string `json:"explanation"`
			Queue       struct {
				InstanceID string `json:"instance_id"`
			} `json:"queue"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil || r.RouteState != "attached" || r.Explanation == "" || r.Queue.InstanceID == "" {
			t.Errorf("route --json: %v %q", err, out)
		}
	}

	out := h.want(0, []string{"SESSION", "STATE", "PROOF OF LIFE", "PENDING"}, "sessions", hub)
	if !regexp.MustCompile(`(?m)^t/p/alice +attached +\S+ +\d+s ago +0$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^t/p/bob +route_without_queue +- +\d+s ago +2$`).MatchString(out) {
		t.Errorf("sessions: %q", out)
	}
	if out := h.want(0, []string{"t/p/bob"}, "sessions", hub, "--state", "route_without_queue", "--tenant", "t"); strings.Contains(out, "alice") {
		t.Errorf("sessions --state route_without_queue lists alice: %q", out)
	}
	h.want(0, []string{"no live session matches"}, "sessions", hub, "--project", "other")
	if code, out, errOut := h.run(nil, "", false, "sessions", hub, "--limit", "1", "--json"); code != 0 ||
		!json.Valid([]byte(out)) || strings.Count(out, `"session_id"`) != 1 {
		t.Errorf("sessions --limit 1 --json: exit %d %q %q", code, out, errOut)
	}
	if _, _, errOut := h.run(nil, "", false, "sessions", hub, "--limit", "1"); !strings.Contains(errOut, "the first 1 shown; there may be more") {
		t.Errorf("sessions --limit 1 does not say there may be more: %q", errOut)
	}

	out = h.want(0, []string{"t/p/bob: 2 unacknowledged signal(s), oldest first", "ID", "SEQ", "FROM", "KIND", "AGE"}, "signals", hub, "t/p/bob")
	if !regexp.MustCompile(`(?m)^\S+ +1 +alice +review\.request +\d+s ago\n\S+ +2 +alice +review\.nudge +\d+s ago$`).MatchString(out) {
		t.Errorf("signals: %q", out)
	}
	if out := h.want(0, []string{"t/p/bob: 2 unacknowledged signal(s), the oldest 1 (--limit)"}, "signals", hub, "t/p/bob", "--limit", "1"); strings.Contains(out, "nudge") {
		t.Errorf("signals --limit 1: %q", out)
	}
	h.want(0, []string{"t/p/alice has no unacknowledged signal"}, "signals", hub, "t/p/alice")

	h.want(0, []string{"INSTANCE", "BUS KEY", h.m.Config.Hub.InstanceID, "http://", "sessions: 2 live"}, "fabric", hub)
	if _, out, _ := h.run(nil, "", false, "fabric", hub, "--json"); !strings.Contains(out, `"instances"`) {
		t.Errorf("fabric --json: %q", out)
	}

	h.want(0, []string{"disconnected t/p/alice on instance", "close 1012"}, "disconnect", hub, "t/p/alice")
	pollUntil(t, "alice to reconnect", func() bool { return alice.Stats().Reconnects >= 1 })
	h.want(0, []string{"no instance holds a WebSocket of t/p/bob", "nothing to disconnect"}, "disconnect", hub, "t/p/bob")

	// deregister asks on a terminal, and needs --yes without one.
	h.want(2, []string{"not on a terminal, so nothing was changed; pass --yes"}, "deregister", hub, "t/p/bob")
	if code, out, errOut := h.run(nil, "no\n", true, "deregister", hub, "t/p/bob"); code != 1 || !strings.Contains(errOut, "not confirmed") ||
		!strings.Contains(out, "t/p/bob is route_without_queue with 2 unacknowledged signal(s)") {
		t.Errorf("deregister answered no: exit %d %q %q", code, out, errOut)
	}
	h.want(0, []string{"2 signal(s)"}, "route", hub, "t/p/bob")
	if code, out, errOut := h.run(nil, "yes\n", true, "deregister", hub, "t/p/bob"); code != 0 || !strings.Contains(out, "deregistered t/p/bob") {
		t.Errorf("deregister answered yes: exit %d %q %q", code, out, errOut)
	}
	h.want(0, []string{"not_registered"}, "route", hub, "t/p/bob")
	h.want(1, []string{"not_found (404 Not Found)"}, "deregister", hub, "t/p/bob", "--yes")
	h.want(1, []string{"not_found (404 Not Found): no live session t/p/bob"}, "signals", hub, "t/p/bob")
	h.want(1, []string{"not_found (404 Not Found)"}, "disconnect", hub, "t/p/bob")

	// The hub's refusals exit 1 with its code; usage errors exit 2.
	for _, tc := range []struct {
		env    map[string]string
		args   []string
		code   int
		stderr string
	}{
		{map[string]string{"MARCONI_ADMIN_TOKEN": key}, []string{"route", hub, "t/p/alice"}, 1, "unauthorized (401 Unauthorized)"},
		{map[string]string{"MARCONI_ADMIN_TOKEN": key}, []string{"sessions", hub}, 1, "unauthorized (401 Unauthorized)"},
		{map[string]string{"MARCONI_ADMIN_TOKEN": key}, []string{"fabric", hub}, 1, "unauthorized (401 Unauthorized)"},
		{map[string]string{"MARCONI_ADMIN_TOKEN": key}, []string{"apikey", "create", hub, "t", "p"}, 1, "unauthorized (401 Unauthorized)"},
		{map[string]string{"MARCONI_ADMIN_TOKEN": ""}, []string{"route", hub, "t/p/alice"}, 2, "MARCONI_ADMIN_TOKEN is not set"},
		{nil, []string{"sessions", hub, "--limit", "1001"}, 1, "invalid_field (400 Bad Request): limit must be between 1 and 1000"},
		{nil, []string{"signals", hub, "t/p/alice", "--limit", "201"}, 1, "invalid_field (400 Bad Request)"},
		{nil, []string{"route", "t/p/alice"}, 2, "no hub: name it as HUB_URL or set MARCONI_HUB_URL"},
		{map[string]string{"MARCONI_HUB_URL": hub + "," + hub}, []string{"fabric"}, 2, "MARCONI_HUB_URL names several hubs"},
		{nil, []string{"route", "t/p/alice", hub}, 2, `HUB_URL "t/p/alice": want an http:// or https:// URL`},
		{nil, []string{"route", hub, "t/alice"}, 2, `"t/alice" is not TENANT/PROJECT/SESSION`},
		{map[string]string{"MARCONI_HUB_URL": hub}, []string{"route", hub}, 2, "marconi route: usage: marconi route [HUB_URL] T/P/S"},
		{nil, []string{"route", hub, "t/p/alice", "--jsn"}, 2, "(did you mean --json?)"},
		{nil, []string{"sessions", hub, "--state", "atached"}, 2, `(did you mean "attached"?)`},
		{nil, []string{"sessions", hub, "--tenant", "a b"}, 2, `--tenant "a b": want`},
		{nil, []string{"signals", hub, "t/p/alice", "--limit", "0"}, 2, "--limit 0: want at least 1"},
		{nil, []string{"disconnect", hub, "t/p/alice", "--folow"}, 2, "(did you mean --follow?)"},
		{nil, []string{"apikey", "creat", hub, "t", "p"}, 2, `unknown apikey command "creat" (did you mean "create"?)`},
		{nil, []string{"apikey"}, 2, "usage: marconi apikey create"},
		{nil, []string{"apikey", "create", hub, "t"}, 2, "usage: marconi apikey create"},
		{nil, []string{"fabric", "http://" + closedPortAddr}, 1, "cannot reach the hub"},
		{nil, []string{"rout", hub}, 2, `(did you mean "route"?)`},
	} {
		code, out, errOut := h.run(tc.env, "", false, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.stderr) || out != "" || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d and one line naming %q", tc.args, code, out, errOut, tc.code, tc.stderr)
		}
	}
}

// TestAPIKeyCreateAndRevoke: a key made by apikey create (on stdout alone)
// registers and sends; revoked by apikey revoke from stdin, it is refused.
func TestAPIKeyCreateAndRevoke(t *testing.T) {
	h := startOpsHub(t)
	hub := h.m.URL()
	code, out, errOut := h.run(nil, "", false, "apikey", "create", hub, "acme", "web")
	newKey := strings.TrimSuffix(out, "\n")
	if code != 0 || !strings.HasPrefix(newKey, "mak_") || strings.ContainsAny(newKey, " \n") ||
		!strings.Contains(errOut, "tenant acme, project web") || strings.Contains(errOut, newKey) {
		t.Fatalf("apikey create: exit %d, stdout %q, stderr %q; want the key alone on stdout", code, out, errOut)
	}
	carol := opsAgent(t, hub, newKey, "carol")
	if a := post(t, hub+"/v1/sessions", newKey, `{"session_id":"dave","surface":"claude_code"}`); a.status != http.StatusCreated {
		t.Fatalf("register with the new key: %+v", a)
	}
	if _, err := carol.Send(context.Background(), "dave", "note", "hi"); err != nil {
		t.Fatalf("send with the new key's session: %v", err)
	}

	if code, out, errOut := h.run(nil, "\n  "+newKey+"  \n", false, "apikey", "revoke", hub); code != 0 ||
		!strings.Contains(out, "revoked the API key of tenant acme, project web") || strings.Contains(out+errOut, newKey) {
		t.Fatalf("apikey revoke: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if a := post(t, hub+"/v1/sessions", newKey, `{"session_id":"erin","surface":"claude_code"}`); a.status != http.StatusUnauthorized {
		t.Errorf("register with the revoked key: %+v, want 401", a)
	}
	configured, _, _ := strings.Cut(opsKey, "=")
	for _, tc := range []struct {
		stdin  string
		code   int
		stderr string
	}{
		{newKey + "\n", 1, "not_found (404 Not Found): no such API key in the store"},
		{configured, 1, "invalid_field (400 Bad Request): this key is set in MARCONI_API_KEYS"},
		{"", 2, "no API key on stdin"},
		{"a-key-0123456789abcdef\nanother-0123456789abcdef\n", 2, "stdin holds 2 lines"},
	} {
		code, out, errOut := h.run(nil, tc.stdin, false, "apikey", "revoke", hub)
		if code != tc.code || !strings.Contains(errOut, tc.stderr) || out != "" || strings.Contains(errOut, configured) {
			t.Errorf("revoke %q: exit %d, stdout %q, stderr %q; want exit %d naming %q", tc.stdin, code, out, errOut, tc.code, tc.stderr)
		}
	}
	// On a terminal the key is read without echo, not from stdin's lines.
	_, other, _ := h.run(nil, "", false, "apikey", "create", hub, "acme", "api")
	other = strings.TrimSuffix(other, "\n")
	for _, tc := range []struct {
		secret []byte
		err    error
		code   int
		says   string
	}{
		{[]byte("  " + other + " "), nil, 0, "revoked the API key of tenant acme, project api"},
		{nil, io.EOF, 1, "read the API key from the terminal: EOF"},
	} {
		var stdout, stderr bytes.Buffer
		c := cli{
			getenv: env(map[string]string{"MARCONI_ADMIN_TOKEN": opsAdmin}),
			stdin:  strings.NewReader("not-this-key\n"), terminal: true,
			readSecret: func() ([]byte, error) { return tc.secret, tc.err },
			stdout:     &stdout, stderr: &stderr,
		}
		code := c.run(context.Background(), []string{"apikey", "revoke", hub})
		out := stdout.String() + stderr.String()
		if code != tc.code || !strings.Contains(stdout.String(), "API key to revoke (not shown as you type") ||
			!strings.Contains(out, tc.says) || strings.Contains(out, other) {
			t.Errorf("apikey revoke on a terminal, read %q %v: exit %d, output %q; want exit %d naming %q", tc.secret, tc.err, code, out, tc.code, tc.says)
		}
	}
	if a := post(t, hub+"/v1/sessions", other, `{"session_id":"frank","surface":"claude_code"}`); a.status != http.StatusUnauthorized {
		t.Errorf("register with the key revoked on a terminal: %+v, want 401", a)
	}
	// The key never goes on the command line: an argument is a usage error.
	if code, _, errOut := h.run(nil, "", false, "apikey", "revoke", hub, newKey); code != 2 || strings.Contains(errOut, newKey) {
		t.Errorf("revoke with the key as an argument: exit %d %q", code, errOut)
	}
}

// TestDisconnectNamesTheHoldingInstance: on two instances, disconnect
// through the one not holding the WebSocket names the holder and its URL
// and exits 1; --follow disconnects it there.
func TestDisconnectNamesTheHoldingInstance(t *testing.T) {
	hubs := startFailoverHubs(t, pgtest.Schema(t), "hub-a", "hub-b")
	a, b := hubs[0], hubs[1]
	alice := opsAgent(t, a.URL(), failoverKey, "alice")
	env := map[string]string{"MARCONI_ADMIN_TOKEN": failoverAdmin}
	pollUntil(t, "hub-b to see alice attached on hub-a", func() bool {
		_, out, _ := runCLI(t, env, "", false, "route", b.URL(), "t/p/alice")
		return strings.Contains(out, "hub-a (healthy)")
	})
	code, out, errOut := runCLI(t, env, "", false, "disconnect", b.URL(), "t/p/alice")
	if code != 1 || out != "" || !strings.Contains(errOut, "t/p/alice holds its WebSocket on instance hub-a at "+a.URL()) ||
		!strings.Contains(errOut, "run marconi disconnect "+a.URL()+" t/p/alice, or add --follow") {
		t.Errorf("disconnect on hub-b: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = runCLI(t, env, "", false, "disconnect", "--follow", b.URL(), "t/p/alice")
	if code != 0 || !strings.Contains(out, "disconnected t/p/alice on instance hub-a") || !strings.Contains(errOut, "instance hub-a at "+a.URL()+" holds it") {
		t.Fatalf("disconnect --follow: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	pollUntil(t, "alice to reconnect", func() bool { return alice.Stats().Reconnects >= 1 })
	if strings.Contains(out+errOut, failoverAdmin) {
		t.Errorf("the admin token printed")
	}
}

// TestRouteHolderSaysWhyNone: route's holder line for each queue the hub
// can report, the unhealthy and the restarted instance's included.
func TestRouteHolderSaysWhyNone(t *testing.T) {
	at := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	id := "hub-a"
	for _, tc := range []struct {
		instance          *string
		attached, healthy bool
		attachedAt        *time.Time
		want              string
	}{
		{nil, false, false, nil, "none: no instance holds a WebSocket of it"},
		{&id, false, false, nil, "none: its last queue was on hub-a, which is unhealthy"},
		{&id, true, false, &at, "none: its last queue was on hub-a, which is unhealthy"},
		{&id, false, true, nil, "none: its last queue was on hub-a (healthy), which has restarted since"},
		{&id, true, true, &at, "hub-a (healthy), attached at 2026-12-02T07:00:00Z"},
	} {
		var r routeAnswer
		r.Queue.InstanceID, r.Queue.Attached, r.Queue.InstanceHealthy, r.Queue.AttachedAt = tc.instance, tc.attached, tc.healthy, tc.attachedAt
		if got := r.holder(); got != tc.want {
			t.Errorf("%+v: %q, want %q", r.Queue, got, tc.want)
		}
	}
}

// TestFollowKeepsTheAdminTokenSafe: --follow sends the admin token only
// where a client would send its session token.
func TestFollowKeepsTheAdminTokenSafe(t *testing.T) {
	for _, tc := range []struct {
		hub, to, refusal string
	}{
		{"https://hub.example", "http://b.example:8080", "plain http"},
		{"https://hub.example", "https://b.example", ""},
		{"http://hub.example", "http://127.0.0.1:8081", "loopback"},
		{"http://127.0.0.1:8080", "http://127.0.0.1:8081", ""},
		{"http://hub.example", "", "no usable URL"},
		{"http://hub.example", "http://u:p@b.example", "no usable URL"},
	} {
		o, err := opsClient{hub: tc.hub, token: "x"}.followed(tc.to)
		if tc.refusal == "" && (err != nil || o.hub != tc.to) || tc.refusal != "" && (err == nil || !strings.Contains(err.Error(), tc.refusal)) {
			t.Errorf("%s → %q: %v, %q; want refusal %q", tc.hub, tc.to, err, o.hub, tc.refusal)
		}
	}
}
