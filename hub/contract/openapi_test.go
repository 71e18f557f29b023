package contract_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	liberrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	"github.com/pb33f/libopenapi/datamodel/high/base"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// openAPIPath is the document the hub is held to.
const openAPIPath = "../../docs/openapi.yaml"

// contract validates every request a test sends and every answer the hub
// gives against docs/openapi.yaml, and records which operations, statuses
// and error codes the test reached. It is safe for concurrent use.
type contract struct {
	t      *testing.T
	v      validator.Validator
	model  *v3.Document
	frames schema_validation.SchemaValidator
	http   *http.Client

	mu      sync.Mutex
	reached map[string]bool // "METHOD /path/template STATUS"
	codes   map[string]bool // error codes seen
}

func newContract(t *testing.T) *contract {
	t.Helper()
	spec, err := os.ReadFile(openAPIPath)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := libopenapi.NewDocument(spec)
	if err != nil {
		t.Fatalf("%s: %v", openAPIPath, err)
	}
	model, errs := doc.BuildV3Model()
	if errs != nil {
		t.Fatalf("%s: %v", openAPIPath, errs)
	}
	// Strict: a property the document does not declare is an error, except
	// inside a signal's payload, which is the sender's own JSON.
	v, verrs := validator.NewValidator(doc, config.WithStrictMode(), config.WithFormatAssertions(),
		config.WithStrictIgnorePaths("$.body.payload.**", "$.body.pending[*].payload.**", "$.body.signals[*].payload.**"))
	if len(verrs) > 0 {
		t.Fatalf("%s: %v", openAPIPath, verrs)
	}
	if ok, derrs := v.ValidateDocument(); !ok {
		t.Fatalf("%s is not a valid OpenAPI 3.1 document:\n%s", openAPIPath, describe(derrs))
	}
	c := &contract{
		t: t, v: v, model: &model.Model, frames: schema_validation.NewSchemaValidator(config.WithFormatAssertions()),
		reached: map[string]bool{}, codes: map[string]bool{},
	}
	c.http = &http.Client{Transport: &validating{c: c, base: http.DefaultTransport}}
	return c
}

func describe(errs []*liberrors.ValidationError) string {
	var b strings.Builder
	for _, e := range errs {
		fmt.Fprintf(&b, "  - %s: %s", e.Message, e.Reason)
		for _, s := range e.SchemaValidationErrors {
			fmt.Fprintf(&b, "\n      %s: %s", s.FieldPath, s.Reason)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// expectKey carries, in a request's context, that the test sends a request
// the document must reject (bad input on purpose).
type expectKey struct{}

// validating is the client transport that checks each exchange.
type validating struct {
	c    *contract
	base http.RoundTripper
}

func (tr *validating) RoundTrip(req *http.Request) (*http.Response, error) {
	c := tr.c
	var body []byte
	if req.Body != nil {
		var err error
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		req.Body.Close()
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	check := func() *http.Request {
		r := req.Clone(context.Background())
		r.Body = io.NopCloser(bytes.NewReader(body))
		return r
	}
	what := req.Method + " " + req.URL.RequestURI()
	ok, errs := c.v.ValidateHttpRequestSync(check())
	switch invalid, _ := req.Context().Value(expectKey{}).(bool); {
	case invalid && ok:
		c.t.Errorf("%s: the document accepts this request, which the test sends as bad input (%q)", what, body)
	case !invalid && !ok:
		c.t.Errorf("%s: request does not match %s:\n%s", what, openAPIPath, describe(errs))
	}

	resp, err := tr.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	var raw []byte
	vresp := *resp
	if resp.StatusCode == http.StatusSwitchingProtocols {
		vresp.Body = http.NoBody // the upgraded stream is the client's
	} else {
		raw, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		resp.Body = io.NopCloser(bytes.NewReader(raw))
		vresp.Body = io.NopCloser(bytes.NewReader(raw))
	}
	if ok, errs := c.v.ValidateHttpResponse(check(), &vresp); !ok {
		c.t.Errorf("%s: answer %d does not match %s:\n%s  body: %s", what, resp.StatusCode, openAPIPath, describe(errs), raw)
	}
	c.record(req, resp.StatusCode, raw)
	return resp, nil
}

var pathParam = regexp.MustCompile(`\{[^}]+\}`)

// template is the document's path that path matches, or path itself.
func (c *contract) template(path string) string {
	for tmpl := range c.model.Paths.PathItems.KeysFromOldest() {
		re := "^" + strings.ReplaceAll(regexp.QuoteMeta(pathParam.ReplaceAllString(tmpl, "PARAM")), "PARAM", "[^/]+") + "$"
		if strings.Contains(tmpl, "{") && regexp.MustCompile(re).MatchString(path) {
			return tmpl
		}
	}
	return path
}

func (c *contract) record(req *http.Request, status int, raw []byte) {
	path := c.template(req.URL.Path)
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(raw, &e)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reached[fmt.Sprintf("%s %s %d", req.Method, path, status)] = true
	if e.Error.Code != "" {
		c.codes[e.Error.Code] = true
	}
}

// do sends one request and returns the status, the decoded JSON answer
// (nil when empty) and the headers. A request made with bad set is bad
// input: the document must reject it too.
func (c *contract) do(bad bool, method, url, cred string, body any, hdr ...string) (int, map[string]any, http.Header) {
	c.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			c.t.Fatal(err)
		}
		r = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(context.WithValue(context.Background(), expectKey{}, bad), method, url, r)
	if err != nil {
		c.t.Fatal(err)
	}
	if r != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	var out map[string]any
	if len(raw) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &out); err != nil {
			c.t.Fatalf("%s %s: answer is not JSON: %q", method, url, raw)
		}
	}
	return resp.StatusCode, out, resp.Header
}

// want sends a well-formed request and fails unless the hub answers status
// (and, for an error, code).
func (c *contract) want(status int, code, method, url, cred string, body any, hdr ...string) map[string]any {
	c.t.Helper()
	return c.check(false, status, code, method, url, cred, body, hdr...)
}

// wantBad sends bad input on purpose: the document must reject the request,
// and the hub must answer status and code in the documented shape.
func (c *contract) wantBad(status int, code, method, url, cred string, body any, hdr ...string) map[string]any {
	c.t.Helper()
	return c.check(true, status, code, method, url, cred, body, hdr...)
}

func (c *contract) check(bad bool, status int, code, method, url, cred string, body any, hdr ...string) map[string]any {
	c.t.Helper()
	st, out, _ := c.do(bad, method, url, cred, body, hdr...)
	if st != status || errorCode(out) != code {
		c.t.Fatalf("%s %s: %d %v, want %d %q", method, url, st, out, status, code)
	}
	return out
}

func errorCode(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

// dial attaches a WebSocket through the validating transport.
func (c *contract) dial(ctx context.Context, h *hubtest.Hub, token string) (*websocket.Conn, *http.Response, error) {
	return websocket.Dial(ctx, h.WSURL(), &websocket.DialOptions{
		HTTPClient: c.http,
		HTTPHeader: http.Header{"Authorization": {"Bearer " + token}},
	})
}

// frame reads one WebSocket frame and validates it against the named schema.
func (c *contract) frame(ctx context.Context, ws *websocket.Conn, schema string) map[string]any {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, raw, err := ws.Read(ctx)
	if err != nil {
		c.t.Fatalf("read %s: %v", schema, err)
	}
	c.validateFrame(schema, raw)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		c.t.Fatal(err)
	}
	return out
}

// validateFrame checks a WebSocket frame against components.schemas[name].
func (c *contract) validateFrame(name string, raw []byte) {
	c.t.Helper()
	proxy, ok := c.model.Components.Schemas.Get(name)
	if !ok {
		c.t.Fatalf("%s has no schema %s", openAPIPath, name)
	}
	var s *base.Schema = proxy.Schema()
	if ok, errs := c.frames.ValidateSchemaBytes(s, raw); !ok {
		var b strings.Builder
		for _, e := range errs {
			fmt.Fprintf(&b, "  - %s: %s\n", e.Message, e.Reason)
			for _, f := range e.SchemaValidationErrors {
				fmt.Fprintf(&b, "      %s: %s\n", f.FieldPath, f.Reason)
			}
		}
		c.t.Errorf("frame %s does not match %s %s:\n%s", raw, openAPIPath, name, b.String())
	} else {
		c.mu.Lock()
		c.reached["frame "+name] = true
		c.mu.Unlock()
	}
}

// fakeBusKeys is a bus key (hub.BusKeys) that can be made unreachable.
type fakeBusKeys struct {
	mu      sync.Mutex
	version int64
	down    atomic.Bool
}

func (k *fakeBusKeys) BusKey(context.Context) (int64, time.Time, error) {
	if k.down.Load() {
		return 0, time.Time{}, sessionstore.ErrUnavailable
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.version, time.Now(), nil
}

func (k *fakeBusKeys) RotateBusKey(ctx context.Context) (int64, time.Time, error) {
	if k.down.Load() {
		return 0, time.Time{}, sessionstore.ErrUnavailable
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.version++
	return k.version, time.Now(), nil
}

func (k *fakeBusKeys) BusKeyInUse() int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.version
}

func (k *fakeBusKeys) LoadBusKey(context.Context, *slog.Logger) int64 { return k.BusKeyInUse() }

func (k *fakeBusKeys) BusKeyRefresh() time.Duration { return 30 * time.Second }

// downStore is a store that can be made unreachable, as a partitioned
// Postgres is. It keeps a history (sessionstore.Historian), as Postgres
// does, so that answers carry its token.
type downStore struct {
	sessionstore.Store
	down atomic.Bool
}

// contractHistory is downStore's history token.
const contractHistory = "h1"

func (s *downStore) HistoryToken() (uint64, string) { return 1, contractHistory }

func (s *downStore) Ping(ctx context.Context) error {
	if s.down.Load() {
		return sessionstore.ErrUnavailable
	}
	return s.Store.Ping(ctx)
}

func (s *downStore) SessionByToken(ctx context.Context, h []byte, now time.Time) (sessionstore.Session, error) {
	if s.down.Load() {
		return sessionstore.Session{}, sessionstore.ErrUnavailable
	}
	return s.Store.SessionByToken(ctx, h, now)
}

func (s *downStore) CreateSession(ctx context.Context, sess sessionstore.Session, now time.Time) (sessionstore.Session, error) {
	if s.down.Load() {
		return sessionstore.Session{}, sessionstore.ErrUnavailable
	}
	return s.Store.CreateSession(ctx, sess, now)
}

// TestOpenAPIContract drives real hubs through every endpoint of
// docs/openapi.yaml, the good answers and the documented errors, and
// validates every request and answer (and the WebSocket frames) against it.
// A field, status, code or header the hub sends that the document does not
// declare fails the test, as does one the document requires and the hub
// leaves out.
func TestOpenAPIContract(t *testing.T) {
	c := newContract(t)
	clock := hubtest.NewClock(time.Now().UTC().Truncate(time.Second))
	mem := memstore.New()
	store := &downStore{Store: mem}
	apiKey, admin := hub.NewAPIKey(), hub.NewAdminToken()
	start := func(id string, st sessionstore.Store, mut func(*hub.Config)) *hubtest.Hub {
		cfg := hub.Config{
			InstanceID: id,
			APIKeys:    map[string]hub.TenantProject{apiKey: {TenantID: "t1", ProjectID: "p1"}},
			AdminToken: admin,
			Fabric: fabric.Config{
				HeartbeatEvery: time.Hour, // ticked by the test only
				Placement:      fabric.PlacementConfig{Adaptive: true, AdaptiveClients: []string{"adaptive-build"}},
			},
		}
		if mut != nil {
			mut(&cfg)
		}
		h := hubtest.Start(t, hubtest.Options{Config: cfg, Store: st, Now: clock.Now})
		tick(t, h)
		return h
	}
	a := start("hub-a", store, nil)
	b := start("hub-b", store, nil)
	ctx := context.Background()

	register := func(h *hubtest.Hub, id, surface string, extra map[string]any) map[string]any {
		t.Helper()
		body := map[string]any{"surface": surface}
		if id != "" {
			body["session_id"] = id
		}
		for k, v := range extra {
			body[k] = v
		}
		return c.want(http.StatusCreated, "", "POST", h.URL+"/v1/sessions", apiKey, body)
	}
	token := func(s map[string]any) string { return s["token"].(string) }

	// Health, readiness, metrics, dashboard, with GET and HEAD.
	for _, p := range []string{"/healthz", "/readyz", "/metrics", "/"} {
		c.want(http.StatusOK, "", "GET", a.URL+p, "", nil)
		if p != "/" && p != "/metrics" {
			c.want(http.StatusOK, "", "HEAD", a.URL+p, "", nil)
		}
	}

	// Registration: every surface kind, explicit and adaptive modes, resume.
	alice := register(a, "alice", "claude_code", nil)
	bob := register(a, "bob", "headless_cc", map[string]any{"runtime_mode": "stateless", "client_id": "cli/1.0"})
	carol := register(a, "carol", "console_ops", map[string]any{"hints": map[string]any{"local_state": false}})
	codex := register(a, "dora", "codex", nil)
	adaptive := register(a, "eve", "headless_cx", map[string]any{"client_id": "adaptive-build", "hints": map[string]any{"local_state": true}})
	if adaptive["runtime_mode"] != "sticky" || adaptive["runtime_mode_source"] != "adaptive-classifier" {
		t.Fatalf("adaptive registration: %v", adaptive)
	}
	resumed := c.want(http.StatusOK, "", "POST", a.URL+"/v1/sessions", apiKey,
		map[string]any{"session_id": "bob", "surface": "headless_cc"}, "X-Marconi-Session-Token", token(bob))
	bob = resumed
	register(a, "", "claude_code", nil) // the hub names it
	// A registration whose answer was lost, retried with its Idempotency-Key.
	c.want(http.StatusCreated, "", "POST", a.URL+"/v1/sessions", apiKey,
		map[string]any{"session_id": "heidi", "surface": "claude_code"}, "Idempotency-Key", "registration-key-heidi-0001")
	c.want(http.StatusCreated, "", "POST", a.URL+"/v1/sessions", apiKey,
		map[string]any{"session_id": "heidi", "surface": "claude_code"}, "Idempotency-Key", "registration-key-heidi-0001")

	// Registration errors.
	c.want(http.StatusForbidden, "forbidden", "POST", a.URL+"/v1/sessions", apiKey, map[string]any{"session_id": "alice", "surface": "claude_code"})
	c.want(http.StatusForbidden, "forbidden", "POST", a.URL+"/v1/sessions", apiKey, map[string]any{"session_id": "heidi", "surface": "claude_code"}, "Idempotency-Key", "registration-key-other-0001")
	c.wantBad(http.StatusBadRequest, "invalid_field", "POST", a.URL+"/v1/sessions", apiKey,
		map[string]any{"session_id": "grace", "surface": "codex"}, "Idempotency-Key", strings.Repeat("k", 257))
	c.wantBad(http.StatusBadRequest, "invalid_json", "POST", a.URL+"/v1/sessions", apiKey, `{"surface": "claude_code"} trailing`)
	c.wantBad(http.StatusBadRequest, "invalid_surface", "POST", a.URL+"/v1/sessions", apiKey, map[string]any{"surface": "console_"})
	c.wantBad(http.StatusBadRequest, "invalid_field", "POST", a.URL+"/v1/sessions", apiKey, map[string]any{"surface": 7})
	c.wantBad(http.StatusBadRequest, "invalid_field", "POST", a.URL+"/v1/sessions", apiKey, map[string]any{"session_id": "no spaces", "surface": "codex"})
	c.wantBad(http.StatusBadRequest, "reserved_runtime_mode", "POST", a.URL+"/v1/sessions", apiKey, map[string]any{"surface": "codex", "runtime_mode": "pinned"})
	c.wantBad(http.StatusBadRequest, "invalid_runtime_mode", "POST", a.URL+"/v1/sessions", apiKey, map[string]any{"surface": "codex", "runtime_mode": "roaming"})
	c.wantBad(http.StatusUnauthorized, "unauthorized", "POST", a.URL+"/v1/sessions", "", map[string]any{"surface": "codex"})
	c.want(http.StatusUnauthorized, "unauthorized", "POST", a.URL+"/v1/sessions", hub.NewAPIKey(), map[string]any{"surface": "codex"})
	c.wantBad(http.StatusRequestEntityTooLarge, "payload_too_large", "POST", a.URL+"/v1/sessions", apiKey,
		map[string]any{"surface": "codex", "client_id": strings.Repeat("x", 20<<10)})

	// Heartbeat; a route without a queue.
	hb := c.want(http.StatusOK, "", "POST", a.URL+"/v1/heartbeat", token(alice), nil)
	if hb["route_state"] != "route_without_queue" {
		t.Fatalf("heartbeat: %v", hb)
	}
	c.wantBad(http.StatusUnauthorized, "unauthorized", "POST", a.URL+"/v1/heartbeat", "", nil)

	// The WebSocket: welcome, a pushed signal, ack, a bad frame.
	ws, resp, err := c.dial(ctx, a, token(bob))
	if err != nil {
		t.Fatalf("attach bob: %v (%v)", err, resp)
	}
	defer ws.CloseNow()
	c.frame(ctx, ws, "WelcomeFrame")
	pushed := c.want(http.StatusOK, "", "POST", a.URL+"/v1/signals", token(alice),
		map[string]any{"to_session": "bob", "kind": "greeting", "payload": map[string]any{"text": "hi"}, "idempotency_key": "k-1"})
	if pushed["delivery"] != "pushed_to_ws" {
		t.Fatalf("send to an attached session: %v", pushed)
	}
	sig := c.frame(ctx, ws, "SignalFrame")
	ack, _ := json.Marshal(map[string]any{"type": "ack", "up_to_seq": sig["seq"]})
	c.validateFrame("AckFrame", ack)
	if err := ws.Write(ctx, websocket.MessageText, ack); err != nil {
		t.Fatal(err)
	}
	ping := []byte(`{"type":"ping"}`)
	c.validateFrame("PingFrame", ping)
	if err := ws.Write(ctx, websocket.MessageText, ping); err != nil {
		t.Fatal(err)
	}
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"type":"ack"}`)); err != nil {
		t.Fatal(err)
	}
	if f := c.frame(ctx, ws, "ErrorFrame"); f["code"] != "invalid_field" {
		t.Fatalf("bad ack frame answered %v", f)
	}

	// Sends: a duplicate, every delivery kind, the self-heal outcomes.
	dup := c.want(http.StatusOK, "", "POST", a.URL+"/v1/signals", token(alice),
		map[string]any{"to_session": "bob", "kind": "greeting", "payload": map[string]any{"text": "hi"}, "idempotency_key": "k-1"})
	if dup["duplicate"] != true || dup["seq"] != pushed["seq"] {
		t.Fatalf("duplicate: %v, first %v", dup, pushed)
	}
	healed := c.want(http.StatusOK, "", "POST", a.URL+"/v1/signals", token(alice), map[string]any{"to_session": "carol"})
	if healed["delivery"] != "queued_offline" || healed["recipient_route_stale"] != true || healed["sender_route_stale"] != true {
		t.Fatalf("send between two sessions without a queue: %v", healed)
	}
	unsupported := c.want(http.StatusOK, "", "POST", a.URL+"/v1/signals", token(bob), map[string]any{"to_session": "dora", "payload": nil})
	if unsupported["selfheal_outcome"] != "unsupported_surface" {
		t.Fatalf("send to codex: %v", unsupported)
	}
	for range 3 {
		c.want(http.StatusOK, "", "POST", a.URL+"/v1/signals", token(bob), map[string]any{"to_session": "carol", "payload": []int{1, 2}})
	}
	limited := c.want(http.StatusOK, "", "POST", a.URL+"/v1/signals", token(bob), map[string]any{"to_session": "carol", "payload": "text"})
	if limited["selfheal_outcome"] != "rate_limited" {
		t.Fatalf("fourth hint in a row: %v", limited)
	}
	clock.Advance(10 * time.Minute) // everyone but bob (attached) goes stale
	stale := c.want(http.StatusOK, "", "POST", a.URL+"/v1/signals", token(codex), map[string]any{"to_session": "carol", "payload": 3.5})
	if stale["delivery"] != "not_available_offline" || stale["selfheal_outcome"] != "stale_recency" || len(stale["pending"].([]any)) == 0 {
		t.Fatalf("send to a stale session: %v", stale)
	}

	// Send errors.
	c.want(http.StatusNotFound, "recipient_not_registered", "POST", a.URL+"/v1/signals", token(alice), map[string]any{"to_session": "nobody"})
	c.wantBad(http.StatusBadRequest, "invalid_field", "POST", a.URL+"/v1/signals", token(alice), map[string]any{"to_session": "bob", "kind": "not a kind"})
	c.wantBad(http.StatusBadRequest, "invalid_field", "POST", a.URL+"/v1/signals", token(alice), map[string]any{"kind": "x"})
	c.wantBad(http.StatusBadRequest, "invalid_json", "POST", a.URL+"/v1/signals", token(alice), `[1]`)
	c.wantBad(http.StatusBadRequest, "invalid_field", "POST", a.URL+"/v1/signals", token(alice), map[string]any{"to_session": "bob", "idempotency_key": "a\nb"})
	c.want(http.StatusRequestEntityTooLarge, "payload_too_large", "POST", a.URL+"/v1/signals", token(alice),
		map[string]any{"to_session": "bob", "payload": strings.Repeat("x", 100<<10)})
	c.wantBad(http.StatusUnauthorized, "unauthorized", "POST", a.URL+"/v1/signals", "", map[string]any{"to_session": "bob"})
	c.want(http.StatusUnauthorized, "unauthorized", "POST", a.URL+"/v1/signals", apiKey, map[string]any{"to_session": "bob"})

	// Drain and ack.
	if page := c.want(http.StatusOK, "", "GET", a.URL+"/v1/signals?after_seq=0&limit=2", token(carol), nil); len(page["signals"].([]any)) != 2 {
		t.Fatalf("a page of 2: %v", page)
	}
	drained := c.want(http.StatusOK, "", "GET", a.URL+"/v1/signals", token(codex), nil)
	if drained["history"] != contractHistory {
		t.Fatalf("a drain names the store's history: %v", drained)
	}
	// A client whose seqs came under another history of the store (a
	// standby promoted since) drains from the acknowledged seq again, and
	// its ack is refused.
	if page := c.want(http.StatusOK, "", "GET", a.URL+"/v1/signals?after_seq=9&history=h0", token(codex), nil); page["history_changed"] != true {
		t.Fatalf("a drain under another history: %v", page)
	}
	c.want(http.StatusConflict, "history_changed", "POST", a.URL+"/v1/signals/ack", token(codex), map[string]any{"up_to_seq": 1, "history": "h0"})
	c.want(http.StatusOK, "", "POST", a.URL+"/v1/signals/ack", token(codex), map[string]any{"up_to_seq": drained["next_after_seq"], "history": contractHistory})
	c.wantBad(http.StatusBadRequest, "invalid_field", "GET", a.URL+"/v1/signals?history=no%20spaces", token(codex), nil)
	c.wantBad(http.StatusBadRequest, "invalid_field", "GET", a.URL+"/v1/signals?after_seq=-1", token(codex), nil)
	c.wantBad(http.StatusBadRequest, "invalid_field", "GET", a.URL+"/v1/signals?limit=0", token(codex), nil)
	c.wantBad(http.StatusBadRequest, "invalid_field", "POST", a.URL+"/v1/signals/ack", token(codex), map[string]any{})
	c.wantBad(http.StatusBadRequest, "invalid_field", "POST", a.URL+"/v1/signals/ack", token(codex), map[string]any{"up_to_seq": -4})

	// Placement mismatch: from the classifier's session and from another.
	c.want(http.StatusNoContent, "", "POST", a.URL+"/v1/placement-mismatch", token(adaptive), map[string]any{"reason": "kept a terminal"})
	c.wantBad(http.StatusBadRequest, "invalid_field", "POST", a.URL+"/v1/placement-mismatch", token(adaptive), map[string]any{"reason": "forged\nline"})
	c.want(http.StatusConflict, "not_adaptive_placement", "POST", a.URL+"/v1/placement-mismatch", token(codex), map[string]any{})

	// Sticky sessions across two instances: wrong_instance, then a takeover.
	sticky := register(a, "frank", "claude_code", map[string]any{"runtime_mode": "sticky"})
	if sticky["instance_id"] != "hub-a" {
		t.Fatalf("sticky registration on hub-a: %v", sticky)
	}
	tick(t, a, b)
	_, resp, err = c.dial(ctx, b, token(sticky))
	if err == nil || resp == nil || resp.StatusCode != http.StatusConflict {
		t.Fatalf("attach on the wrong instance: %v (%v)", err, resp)
	}
	clock.Advance(time.Minute) // hub-a's heartbeat is now older than dead-after
	tick(t, b)
	ws2, resp, err := c.dial(ctx, b, token(sticky))
	if err != nil {
		t.Fatalf("takeover: %v (%v)", err, resp)
	}
	defer ws2.CloseNow()
	if w := c.frame(ctx, ws2, "WelcomeFrame"); w["affinity_reset"] != true {
		t.Fatalf("takeover welcome: %v", w)
	}
	tick(t, a, b)

	// Operators.
	key := c.want(http.StatusCreated, "", "POST", a.URL+"/v1/ops/api_keys", admin, map[string]any{"tenant_id": "t2", "project_id": "p2"})
	register(a, "gina", "codex", nil)
	c.want(http.StatusCreated, "", "POST", a.URL+"/v1/sessions", key["api_key"].(string), map[string]any{"surface": "codex"})
	c.wantBad(http.StatusBadRequest, "invalid_field", "POST", a.URL+"/v1/ops/api_keys", admin, map[string]any{"tenant_id": "t 2", "project_id": "p2"})
	c.want(http.StatusUnauthorized, "unauthorized", "POST", a.URL+"/v1/ops/api_keys", apiKey, map[string]any{"tenant_id": "t2", "project_id": "p2"})
	revoked := c.want(http.StatusCreated, "", "POST", a.URL+"/v1/ops/api_keys", admin, map[string]any{"tenant_id": "t2", "project_id": "p2"})
	c.want(http.StatusOK, "", "POST", a.URL+"/v1/ops/api_keys/revoke", admin, map[string]any{"api_key": revoked["api_key"]})
	c.want(http.StatusNotFound, "not_found", "POST", a.URL+"/v1/ops/api_keys/revoke", admin, map[string]any{"api_key": revoked["api_key"]})
	c.want(http.StatusBadRequest, "invalid_field", "POST", a.URL+"/v1/ops/api_keys/revoke", admin, map[string]any{"api_key": apiKey})
	c.wantBad(http.StatusBadRequest, "invalid_field", "POST", a.URL+"/v1/ops/api_keys/revoke", admin, map[string]any{})
	for _, id := range []string{"alice", "bob", "frank", "nobody"} {
		c.want(http.StatusOK, "", "GET", a.URL+"/v1/ops/route_state/t1/p1/"+id, admin, nil)
	}
	c.want(http.StatusOK, "", "GET", a.URL+"/v1/ops/route_state?tenant_id=t1&project_id=p1&limit=1000", admin, nil)
	c.want(http.StatusOK, "", "GET", a.URL+"/v1/ops/route_state?state=stale", admin, nil)
	c.wantBad(http.StatusBadRequest, "invalid_field", "GET", a.URL+"/v1/ops/route_state?state=lost", admin, nil)
	c.wantBad(http.StatusBadRequest, "invalid_field", "GET", a.URL+"/v1/ops/route_state?tenant_id=t%001", admin, nil)
	c.wantBad(http.StatusNotFound, "not_found", "GET", a.URL+"/v1/ops/route_state/t1/p1/bad%20id", admin, nil)
	sum := c.want(http.StatusOK, "", "GET", b.URL+"/v1/ops/fabric/summary", admin, nil)
	if len(sum["fallback_events"].([]any)) == 0 {
		t.Fatalf("summary has no fallback event after a takeover: %v", sum)
	}
	c.wantBad(http.StatusUnauthorized, "unauthorized", "GET", a.URL+"/v1/ops/fabric/summary", "", nil)
	if p := c.want(http.StatusOK, "", "GET", a.URL+"/v1/ops/sessions/t1/p1/carol/signals?limit=2", admin, nil); len(p["signals"].([]any)) != 2 {
		t.Fatalf("ops pending of carol: %v", p)
	}
	c.wantBad(http.StatusBadRequest, "invalid_field", "GET", a.URL+"/v1/ops/sessions/t1/p1/carol/signals?limit=0", admin, nil)
	c.want(http.StatusNotFound, "not_found", "GET", a.URL+"/v1/ops/sessions/t1/p1/nobody/signals", admin, nil)
	c.want(http.StatusOK, "", "GET", a.URL+"/v1/ops/selfheal/history", admin, nil)
	c.want(http.StatusConflict, "wrong_instance", "POST", a.URL+"/v1/ops/sessions/t1/p1/frank/disconnect", admin, nil)
	if d := c.want(http.StatusOK, "", "POST", b.URL+"/v1/ops/sessions/t1/p1/frank/disconnect", admin, nil); d["disconnected"] != true {
		t.Fatalf("disconnect on the holding instance: %v", d)
	}
	c.want(http.StatusNoContent, "", "DELETE", a.URL+"/v1/ops/sessions/t1/p1/gina", admin, nil)
	c.want(http.StatusNotFound, "not_found", "DELETE", a.URL+"/v1/ops/sessions/t1/p1/gina", admin, nil)

	// The bus key, on an instance that has one (the memory store has none).
	c.want(http.StatusNotFound, "not_found", "POST", a.URL+"/v1/ops/bus_key/rotate", admin, nil)
	c.want(http.StatusUnauthorized, "unauthorized", "POST", a.URL+"/v1/ops/bus_key/rotate", apiKey, nil)
	keys := &fakeBusKeys{version: 1}
	keyed := hubtest.Start(t, hubtest.Options{Store: memstore.New(), BusKeys: keys, Config: hub.Config{InstanceID: "hub-keyed", AdminToken: admin}})
	if k := c.want(http.StatusOK, "", "POST", keyed.URL+"/v1/ops/bus_key/rotate", admin, nil); k["version"] != 2.0 || k["instance_version"] != 2.0 {
		t.Fatalf("bus key after a rotation: %v", k)
	}
	c.want(http.StatusOK, "", "GET", keyed.URL+"/v1/ops/bus_key", admin, nil)
	keys.down.Store(true)
	c.want(http.StatusServiceUnavailable, "registry_unavailable", "POST", keyed.URL+"/v1/ops/bus_key/rotate", admin, nil)

	// Rates, quotas and the body deadline, on an instance of its own.
	tight := start("hub-tight", memstore.New(), func(cfg *hub.Config) {
		cfg.SendRatePerSecond, cfg.QuotaRegistrationsPerSecond = 1, 1
		cfg.MaxConnectionsPerAddress = 1
		cfg.BodyReadTimeout = 200 * time.Millisecond
	})
	tA := c.want(http.StatusCreated, "", "POST", tight.URL+"/v1/sessions", apiKey, map[string]any{"session_id": "x", "surface": "claude_code"})
	tB := c.want(http.StatusCreated, "", "POST", tight.URL+"/v1/sessions", apiKey, map[string]any{"session_id": "y", "surface": "claude_code"})
	c.want(http.StatusTooManyRequests, "quota_exceeded", "POST", tight.URL+"/v1/sessions", apiKey, map[string]any{"surface": "codex"})
	for range 2 {
		c.want(http.StatusOK, "", "POST", tight.URL+"/v1/signals", token(tA), map[string]any{"to_session": "x"})
	}
	_, out, hdr := c.do(false, "POST", tight.URL+"/v1/signals", token(tA), map[string]any{"to_session": "x"})
	if errorCode(out) != "too_many_requests" || hdr.Get("Retry-After") == "" {
		t.Fatalf("third send within the burst of 2: %v %v", out, hdr)
	}
	wsA, resp, err := c.dial(ctx, tight, token(tA))
	if err != nil {
		t.Fatalf("attach x: %v (%v)", err, resp)
	}
	defer wsA.CloseNow()
	c.frame(ctx, wsA, "WelcomeFrame")
	if _, resp, err := c.dial(ctx, tight, token(tB)); err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second WebSocket from one address past a cap of 1: %v (%v)", err, resp)
	}
	c.slowBody(tight, token(tA))

	// Requests to /v1/ws that are no WebSocket handshake.
	c.wantBad(http.StatusUpgradeRequired, "upgrade_required", "GET", a.URL+"/v1/ws", token(codex), nil)
	c.wantBad(http.StatusBadRequest, "invalid_field", "GET", a.URL+"/v1/ws", token(codex), nil,
		"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "8", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")

	// Deregistration and what an expired token gets.
	c.want(http.StatusNoContent, "", "DELETE", a.URL+"/v1/session", token(alice), nil)
	c.want(http.StatusGone, "session_expired", "POST", a.URL+"/v1/heartbeat", token(alice), nil)
	c.want(http.StatusGone, "session_expired", "DELETE", a.URL+"/v1/session", token(alice), nil)
	c.want(http.StatusGone, "session_expired", "GET", a.URL+"/v1/signals", token(alice), nil)
	c.want(http.StatusGone, "session_expired", "POST", a.URL+"/v1/signals/ack", token(alice), map[string]any{"up_to_seq": 1})
	c.want(http.StatusGone, "session_expired", "POST", a.URL+"/v1/placement-mismatch", token(alice), map[string]any{})
	if _, resp, err := c.dial(ctx, a, token(alice)); err == nil || resp == nil || resp.StatusCode != http.StatusGone {
		t.Fatalf("attach with a dead token: %v (%v)", err, resp)
	}

	// The store unreachable: fail closed.
	store.down.Store(true)
	c.want(http.StatusServiceUnavailable, "registry_unavailable", "GET", a.URL+"/readyz", "", nil)
	c.want(http.StatusServiceUnavailable, "registry_unavailable", "GET", a.URL+"/readyz", admin, nil)
	c.want(http.StatusServiceUnavailable, "registry_unavailable", "POST", a.URL+"/v1/heartbeat", token(codex), nil)
	c.want(http.StatusServiceUnavailable, "registry_unavailable", "POST", a.URL+"/v1/sessions", apiKey, map[string]any{"surface": "codex"})
	store.down.Store(false)

	// Draining.
	a.Server.SetDraining()
	c.want(http.StatusServiceUnavailable, "draining", "GET", a.URL+"/readyz", "", nil)
	c.want(http.StatusServiceUnavailable, "draining", "POST", a.URL+"/v1/sessions", apiKey, map[string]any{"surface": "codex"})
	c.want(http.StatusServiceUnavailable, "draining", "POST", a.URL+"/v1/signals", token(codex), map[string]any{"to_session": "gina"})

	c.wantCovered()
}

// slowBody sends a send whose body arrives far slower than the hub's
// BodyReadTimeout, on a raw connection (the client transport would send it
// at once), and validates the hub's answer: 408 request_timeout.
func (c *contract) slowBody(h *hubtest.Hub, token string) {
	c.t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.URL, "http://"))
	if err != nil {
		c.t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	// The body comes one byte every 100 ms, in all far slower than the
	// hub's bound; the hub answers once it has drained what was announced.
	body := `{"to_session":"x"}  `
	fmt.Fprintf(conn, "POST /v1/signals HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		conn.RemoteAddr(), token, len(body), body[:2])
	req, err := http.NewRequest("POST", h.URL+"/v1/signals", strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	br := bufio.NewReader(conn)
	for i := 2; i < len(body); i++ {
		_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := br.Peek(1); err == nil {
			break // answered already
		}
		if _, err := conn.Write([]byte{body[i]}); err != nil {
			break
		}
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		c.t.Fatalf("a body slower than the bound: %v", err)
	}
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	if ok, errs := c.v.ValidateHttpResponse(req, resp); !ok {
		c.t.Errorf("slow body: answer %d does not match %s:\n%s  body: %s", resp.StatusCode, openAPIPath, describe(errs), raw)
	}
	if resp.StatusCode != http.StatusRequestTimeout {
		c.t.Fatalf("a body slower than the bound: %d %s, want 408", resp.StatusCode, raw)
	}
	c.record(req, resp.StatusCode, raw)
}

// tick heartbeats the given hubs into the store and refreshes their view.
func tick(t *testing.T, hubs ...*hubtest.Hub) {
	t.Helper()
	for _, h := range hubs {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := h.Server.Fabric().Tick(ctx)
		cancel()
		if err != nil {
			t.Fatalf("tick %s: %v", h.Server.InstanceID(), err)
		}
	}
}

// wantCovered fails unless the test reached every operation of the document
// with a success status, and every error code the hub can give today.
func (c *contract) wantCovered() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for path, item := range c.model.Paths.PathItems.FromOldest() {
		for method, op := range item.GetOperations().FromOldest() {
			ok := false
			for code := range op.Responses.Codes.KeysFromOldest() {
				if code < "400" && c.reached[strings.ToUpper(method)+" "+path+" "+code] {
					ok = true
				}
			}
			if !ok {
				c.t.Errorf("no successful %s %s was validated", strings.ToUpper(method), path)
			}
		}
	}
	for _, f := range []string{"WelcomeFrame", "SignalFrame", "ErrorFrame", "AckFrame", "PingFrame"} {
		if !c.reached["frame "+f] {
			c.t.Errorf("no %s was validated", f)
		}
	}
	enum, _ := c.model.Components.Schemas.Get("ErrorCode")
	var listed []string
	for _, v := range enum.Schema().Enum {
		code := v.Value
		listed = append(listed, code)
		switch marconi.Code(code) {
		case marconi.CodeInternal: // a bug, never an answer by design
		case marconi.CodeBadRequest, marconi.CodeHeadersTooLarge, marconi.CodeNotImplemented, marconi.CodeHTTPVersionNotSupported:
			// net/http's own refusals, before any route: no operation of the
			// spec answers them; hub/refusals_test.go holds them to the shape.
		default:
			if !c.codes[code] {
				c.t.Errorf("error code %s was never validated", code)
			}
		}
	}
	var codes []string
	for _, code := range marconi.Codes {
		codes = append(codes, string(code))
	}
	slices.Sort(listed)
	slices.Sort(codes)
	if !slices.Equal(listed, codes) {
		c.t.Errorf("ErrorCode's enum in docs/openapi.yaml = %v, want the codes of marconi.Codes: %v", listed, codes)
	}
}
