package hub_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// statusOfCode is the contract's table (API.md) from error code to status,
// written out here so that a change of the hub's own table shows.
var statusOfCode = map[string]int{
	"invalid_json": 400, "invalid_field": 400, "invalid_surface": 400, "invalid_runtime_mode": 400,
	"reserved_runtime_mode": 400, "unauthorized": 401, "forbidden": 403, "recipient_not_registered": 404,
	"not_found": 404, "wrong_instance": 409, "not_adaptive_placement": 409, "session_expired": 410,
	"request_timeout": 408, "payload_too_large": 413, "upgrade_required": 426, "too_many_requests": 429, "quota_exceeded": 429,
	"registry_unavailable": 503, "draining": 503,
	"bad_request": 400, "headers_too_large": 431, "not_implemented": 501, "http_version_not_supported": 505,
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// validID is the contract's rule for session ids, tenants and projects.
func validID(id string) bool { return id != "." && id != ".." && idPattern.MatchString(id) }

// fuzzRoutes are the endpoints FuzzHTTP drives, each with the credential it
// is meant for.
var fuzzRoutes = []struct {
	method, path string
	cred         string // "api", "session", "admin"
}{
	{"POST", "/v1/sessions", "api"},
	{"POST", "/v1/signals", "session"},
	{"GET", "/v1/signals", "session"},
	{"POST", "/v1/signals/ack", "session"},
	{"POST", "/v1/heartbeat", "session"},
	{"POST", "/v1/placement-mismatch", "session"},
	{"GET", "/v1/ops/route_state", "admin"},
	{"GET", "/v1/ops/route_state/", "admin"}, // the fuzzed text is the rest of the path
	{"POST", "/v1/ops/api_keys", "admin"},
	{"GET", "/v1/ws", "session"}, // no handshake: refused before anything happens
	{"POST", "/v1/ops/api_keys/revoke", "admin"},
}

// httpFuzzer is one in-process hub with two sessions of tenant t1, project
// p1 (alice sends, bob receives) that FuzzHTTP hits with hostile requests.
type httpFuzzer struct {
	h          *hubtest.Hub
	alice, bob agent
}

func (z *httpFuzzer) do(method, target string, hdr http.Header, body []byte) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, "/", bytes.NewReader(body))
	u, err := url.Parse(target)
	if err != nil {
		panic(err) // callers only pass targets that parse
	}
	req.URL = u
	req.RequestURI = target
	for k, v := range hdr {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	z.h.Server.Handler().ServeHTTP(rec, req)
	return rec
}

func bearerHeader(cred string) http.Header {
	return http.Header{"Authorization": {"Bearer " + cred}, "Content-Type": {"application/json"}}
}

// FuzzHTTP sends hostile bodies, query strings, path parameters and
// headers to every endpoint of a real hub and checks what a client would
// rely on: never a 5xx, every error in the one error shape with a code whose
// status is the contract's, and every accepted input was valid and
// round-trips (a registration answers the id and surface it was given, a
// signal drains back byte for byte and its idempotency key replays it, an
// ops listing honours its filters). Seeds: testdata/fuzz/FuzzHTTP, one file
// per probe (the route is an index into fuzzRoutes: append, never reorder).
func FuzzHTTP(f *testing.F) {
	fuzzers := []*httpFuzzer{newHTTPFuzzer(f, memstore.New())}
	if os.Getenv(pgtest.EnvDatabaseURL) != "" {
		// Postgres refuses strings that the memory store keeps (NUL, say):
		// every input goes to both.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st, err := pgstore.Open(ctx, pgtest.Schema(f))
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { st.Close() })
		fuzzers = append(fuzzers, newHTTPFuzzer(f, st))
	}
	f.Add(uint8(1), "", "", []byte(`{"to_session":"bob","payload":{"a":1}}`))
	f.Add(uint8(0), "", "", []byte(`{"session_id":"bob","surface":"codex","takeover":true}`))
	f.Add(uint8(0), "", "", []byte(`{"session_id":"..","surface":"codex"}`))
	f.Fuzz(func(t *testing.T, route uint8, target, auth string, body []byte) {
		for _, z := range fuzzers {
			z.check(t, int(route)%len(fuzzRoutes), target, auth, body)
		}
	})
}

// newHTTPFuzzer starts a hub on store with alice and bob registered.
func newHTTPFuzzer(f *testing.F, store sessionstore.Store) *httpFuzzer {
	z := &httpFuzzer{h: hubtest.Start(f, hubtest.Options{Store: store, Config: hub.Config{MaxPayloadBytes: 2048, SendRatePerSecond: 1e9, QuotaRegistrationsPerSecond: 1e9}})}
	for name, a := range map[string]*agent{"alice": &z.alice, "bob": &z.bob} {
		rec := z.do("POST", "/v1/sessions", bearerHeader(z.h.APIKey), []byte(`{"session_id":"`+name+`","surface":"codex"}`))
		var r marconi.SessionAnswer
		if rec.Code != http.StatusCreated || json.Unmarshal(rec.Body.Bytes(), &r) != nil {
			f.Fatalf("register %s: %d %s", name, rec.Code, rec.Body)
		}
		*a = agent{ID: name, Token: r.Token}
	}
	return z
}

func (z *httpFuzzer) check(t *testing.T, route int, target, auth string, body []byte) {
	r := fuzzRoutes[route]
	path := r.path
	hdr := http.Header{"Content-Type": {"application/json"}}
	switch {
	case route == 0:
		if target != "" {
			hdr.Set("X-Marconi-Session-Token", target) // a hostile resume
		}
	case strings.HasSuffix(path, "/"):
		path += target
	case target != "":
		path += "?" + target
	}
	if _, err := url.Parse(path); err != nil || !httpguts.ValidHeaderFieldValue(auth) || !httpguts.ValidHeaderFieldValue(target) {
		t.Skip("not a request that reaches a server")
	}
	switch {
	case auth != "":
		hdr.Set("Authorization", auth) // a hostile credential
	case r.cred == "api":
		hdr.Set("Authorization", "Bearer "+z.h.APIKey)
	case r.cred == "admin":
		hdr.Set("Authorization", "Bearer "+z.h.AdminToken)
	default:
		hdr.Set("Authorization", "Bearer "+z.alice.Token)
	}
	rec := z.do(r.method, path, hdr, body)
	if rec.Code >= 400 {
		z.checkError(t, r.method+" "+path, rec)
		return
	}
	if auth != "" && !strings.HasPrefix(strings.ToLower(auth), "bearer ") {
		t.Fatalf("%s %s with Authorization %q: %d, want 401", r.method, path, auth, rec.Code)
	}
	var err error
	switch route {
	case 0:
		err = z.checkRegistered(rec, body)
	case 1:
		err = z.checkSent(rec, body)
	case 2:
		err = checkDrained(rec, serverQuery(path))
	case 6:
		err = checkListed(rec, serverQuery(path))
	case 7:
		err = checkRouteState(rec, target)
	case 8:
		err = checkKeyCreated(rec, body)
	case 9:
		err = errors.New("a request without a WebSocket handshake was not refused")
	}
	if err != nil {
		t.Fatalf("%s %s %q: %d %s: %v", r.method, path, body, rec.Code, rec.Body, err)
	}
}

// serverQuery is the query string of target as the server reads it: up to
// a '#', which starts the fragment a client never sends (url.ParseQuery of
// the raw text would read "project_id=#x" as a filter on "#x", where the
// server sees project_id empty, no filter).
func serverQuery(target string) string {
	u, err := url.Parse(target)
	if err != nil {
		return ""
	}
	return u.RawQuery
}

// checkError: one error shape, a documented code, the contract's status.
func (z *httpFuzzer) checkError(t *testing.T, what string, rec *httptest.ResponseRecorder) {
	t.Helper()
	var e struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error == nil || e.Error.Message == "" {
		t.Fatalf("%s: %d %q is not the error shape", what, rec.Code, rec.Body)
	}
	if want, ok := statusOfCode[e.Error.Code]; !ok || want != rec.Code {
		t.Fatalf("%s: %d with code %q: not a documented pair", what, rec.Code, e.Error.Code)
	}
}

// checkRegistered: the answer names the session and surface asked for, and
// both are valid; the session is deregistered so the fuzzer stays bounded.
func (z *httpFuzzer) checkRegistered(rec *httptest.ResponseRecorder, body []byte) error {
	var req struct {
		SessionID string `json:"session_id"`
		Surface   string `json:"surface"`
		Takeover  bool   `json:"takeover"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return fmt.Errorf("accepted a body that is not JSON: %v", err)
	}
	var resp struct {
		SessionID string `json:"session_id"`
		Token     string `json:"token"`
		Surface   string `json:"surface"`
		TenantID  string `json:"tenant_id"`
		TakenOver bool   `json:"taken_over"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
		return err
	}
	if !validID(resp.SessionID) || (req.SessionID != "" && req.SessionID != resp.SessionID) {
		return fmt.Errorf("session_id %q for a request of %q", resp.SessionID, req.SessionID)
	}
	if resp.TenantID != "t1" {
		return fmt.Errorf("registered in tenant %q with t1's key", resp.TenantID)
	}
	if rec.Code == http.StatusCreated && resp.Surface != req.Surface {
		return fmt.Errorf("surface %q for a request of %q", resp.Surface, req.Surface)
	}
	if resp.TakenOver != (rec.Code == http.StatusOK) || (resp.TakenOver && !req.Takeover) {
		return fmt.Errorf("%d with taken_over %v for a request with takeover %v", rec.Code, resp.TakenOver, req.Takeover)
	}
	// A takeover of the fixture's own sessions: the fixture keeps them
	// under their new tokens.
	for _, a := range []*agent{&z.alice, &z.bob} {
		if resp.TakenOver && a.ID == resp.SessionID {
			a.Token = resp.Token
			return nil
		}
	}
	if d := z.do("DELETE", "/v1/session", bearerHeader(resp.Token), nil); d.Code != http.StatusNoContent {
		return fmt.Errorf("deregister the fuzzed session: %d %s", d.Code, d.Body)
	}
	return nil
}

// checkSent: a signal answered 200 drains back to bob with its kind and
// payload byte for byte, and its idempotency key replays the first answer.
func (z *httpFuzzer) checkSent(rec *httptest.ResponseRecorder, body []byte) error {
	var req struct {
		ToSession      string          `json:"to_session"`
		Kind           string          `json:"kind"`
		Payload        json.RawMessage `json:"payload"`
		IdempotencyKey string          `json:"idempotency_key"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return fmt.Errorf("accepted a body that is not JSON: %v", err)
	}
	var resp struct {
		SignalID  string `json:"signal_id"`
		Seq       int64  `json:"seq"`
		Duplicate bool   `json:"duplicate"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
		return err
	}
	if req.ToSession != "bob" && req.ToSession != "alice" {
		return fmt.Errorf("sent to %q, who is not registered", req.ToSession)
	}
	to := z.bob
	if req.ToSession == "alice" {
		to = z.alice
	}
	if req.IdempotencyKey != "" {
		again := z.do("POST", "/v1/signals", bearerHeader(z.alice.Token), body)
		var dup struct {
			SignalID  string `json:"signal_id"`
			Seq       int64  `json:"seq"`
			Duplicate bool   `json:"duplicate"`
		}
		if again.Code != http.StatusOK || json.Unmarshal(again.Body.Bytes(), &dup) != nil ||
			!dup.Duplicate || dup.SignalID != resp.SignalID || dup.Seq != resp.Seq {
			return fmt.Errorf("the same idempotency key again: %d %s", again.Code, again.Body)
		}
	}
	if resp.Duplicate {
		return nil // an earlier input sent it, and acked it
	}
	d := z.do("GET", fmt.Sprintf("/v1/signals?after_seq=%d&limit=1", resp.Seq-1), bearerHeader(to.Token), nil)
	var drained struct {
		Signals []struct {
			ID      string          `json:"id"`
			Seq     int64           `json:"seq"`
			From    string          `json:"from_session"`
			Kind    string          `json:"kind"`
			Payload json.RawMessage `json:"payload"`
		} `json:"signals"`
	}
	if d.Code != http.StatusOK || json.Unmarshal(d.Body.Bytes(), &drained) != nil || len(drained.Signals) != 1 {
		return fmt.Errorf("drain the signal back: %d %s", d.Code, d.Body)
	}
	got := drained.Signals[0]
	wantKind, wantPayload := req.Kind, string(req.Payload)
	if wantKind == "" {
		wantKind = "signal"
	}
	if wantPayload == "" {
		wantPayload = "null"
	}
	if got.ID != resp.SignalID || got.Seq != resp.Seq || got.From != "alice" || got.Kind != wantKind || string(got.Payload) != wireForm(wantPayload) {
		return fmt.Errorf("drained %+v (payload %s), want kind %q payload %s", got, got.Payload, wantKind, wantPayload)
	}
	if a := z.do("POST", "/v1/signals/ack", bearerHeader(to.Token), fmt.Appendf(nil, `{"up_to_seq":%d}`, resp.Seq)); a.Code != http.StatusOK {
		return fmt.Errorf("ack: %d %s", a.Code, a.Body)
	}
	return nil
}

// wireForm is how the hub's JSON encoder writes a payload it keeps byte for
// byte: insignificant whitespace removed, <, > and & escaped; key order,
// duplicate keys, number spelling and string escapes stay as sent.
func wireForm(payload string) string {
	var compact, escaped bytes.Buffer
	if err := json.Compact(&compact, []byte(payload)); err != nil {
		return "not JSON: " + err.Error()
	}
	json.HTMLEscape(&escaped, compact.Bytes())
	return escaped.String()
}

// checkDrained: signals after after_seq, in order, at most limit.
func checkDrained(rec *httptest.ResponseRecorder, query string) error {
	q, _ := url.ParseQuery(query)
	var resp struct {
		Signals []struct {
			Seq int64 `json:"seq"`
		} `json:"signals"`
		Next int64 `json:"next_after_seq"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
		return err
	}
	var after, limit int64 = 0, 500
	if v := q.Get("after_seq"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("accepted after_seq %q", v)
		}
		after = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return fmt.Errorf("accepted limit %q", v)
		}
		limit = min(n, limit)
	}
	last := after
	for _, s := range resp.Signals {
		if s.Seq <= last {
			return fmt.Errorf("seq %d after %d", s.Seq, last)
		}
		last = s.Seq
	}
	if int64(len(resp.Signals)) > limit || resp.Next != last {
		return fmt.Errorf("%d signals for limit %d, next_after_seq %d", len(resp.Signals), limit, resp.Next)
	}
	return nil
}

type routeStateView struct {
	TenantID   string `json:"tenant_id"`
	ProjectID  string `json:"project_id"`
	SessionID  string `json:"session_id"`
	RouteState string `json:"route_state"`
}

// checkListed: a listing honours its tenant, project, state and limit.
func checkListed(rec *httptest.ResponseRecorder, query string) error {
	q, _ := url.ParseQuery(query)
	var resp struct {
		Sessions []routeStateView `json:"sessions"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
		return err
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return fmt.Errorf("accepted limit %q", v)
		}
		limit = n
	}
	if len(resp.Sessions) > limit {
		return fmt.Errorf("%d sessions for limit %d", len(resp.Sessions), limit)
	}
	for _, s := range resp.Sessions {
		if (q.Get("tenant_id") != "" && s.TenantID != q.Get("tenant_id")) ||
			(q.Get("project_id") != "" && s.ProjectID != q.Get("project_id")) ||
			(q.Get("state") != "" && s.RouteState != q.Get("state")) {
			return fmt.Errorf("%+v outside the filter", s)
		}
	}
	return nil
}

// checkRouteState: the view is of the session the path names, whose parts
// are valid ids.
func checkRouteState(rec *httptest.ResponseRecorder, rest string) error {
	var v routeStateView
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		return err
	}
	u, _ := url.Parse("/" + rest)
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(parts) != 3 || parts[0] != v.TenantID || parts[1] != v.ProjectID || parts[2] != v.SessionID {
		return fmt.Errorf("view of %s/%s/%s for path %q", v.TenantID, v.ProjectID, v.SessionID, rest)
	}
	for _, p := range parts {
		if !validID(p) {
			return fmt.Errorf("accepted the id %q", p)
		}
	}
	return nil
}

// checkKeyCreated: a key is made only for valid ids, the ones asked for.
func checkKeyCreated(rec *httptest.ResponseRecorder, body []byte) error {
	var req, resp struct {
		TenantID  string `json:"tenant_id"`
		ProjectID string `json:"project_id"`
		APIKey    string `json:"api_key"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return fmt.Errorf("accepted a body that is not JSON: %v", err)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
		return err
	}
	if !validID(req.TenantID) || !validID(req.ProjectID) ||
		resp.TenantID != req.TenantID || resp.ProjectID != req.ProjectID || !utf8.ValidString(resp.APIKey) || resp.APIKey == "" {
		return fmt.Errorf("key for %q/%q", resp.TenantID, resp.ProjectID)
	}
	return nil
}
