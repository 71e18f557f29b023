package hub_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"pgregory.net/rapid"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore/memstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// The property test drives a real hub over HTTP and WebSocket with random
// register / resume / send / drain / attach / ack / detach / deregister
// steps across two tenants with two projects each, and checks every answer
// and every frame against a model: no signal reaches a session of another
// tenant or project, none answered 200 is lost (it is delivered and drains
// until acknowledged, unless its recipient deregistered), per-recipient
// seq is gap-free and every connection and drain sees it in order.
//
// By default it runs a few checks (propertyChecks); -rapid.checks or
// RAPID_CHECKS runs more, e.g. go test -run TestPropertyDelivery -rapid.checks 1000 ./hub/.

// propertyChecks is how many random sequences the normal suite runs.
const propertyChecks = 30

// setRapidChecks makes the default run short, with longer sequences than
// rapid's default, unless -rapid.checks (RAPID_CHECKS) or -rapid.steps
// (RAPID_STEPS) ask otherwise.
func setRapidChecks(t *testing.T, checks int) {
	for name, n := range map[string]int{"checks": checks, "steps": 60} {
		if rapidExplicit()[name] {
			continue
		}
		old := flag.Lookup("rapid." + name).Value.String()
		if err := flag.Set("rapid."+name, strconv.Itoa(n)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = flag.Set("rapid."+name, old) })
	}
}

// rapidExplicit says which of rapid's flags the command line or the
// environment set, as they were before any test set them.
var rapidExplicit = sync.OnceValue(func() map[string]bool {
	set := map[string]bool{}
	for _, name := range []string{"checks", "steps"} {
		set[name] = os.Getenv("RAPID_"+strings.ToUpper(name)) != ""
	}
	flag.Visit(func(f *flag.Flag) {
		if name, ok := strings.CutPrefix(f.Name, "rapid."); ok {
			set[name] = true
		}
	})
	return set
})

func TestPropertyDelivery(t *testing.T) {
	checks := propertyChecks
	if testing.Short() {
		checks = 5 // a taste, in well under a second; the full run is the normal suite's
	}
	setRapidChecks(t, checks)
	rapid.Check(t, func(rt *rapid.T) {
		runModel(rt, "", []string{"test-1"}, false, func(cfg hub.Config) (*hubtest.Hub, func()) {
			h := hubtest.Start(t, hubtest.Options{Store: memstore.New(), Config: cfg})
			return h, h.Close
		})
	})
}

// TestPGPropertyDelivery runs the model against two instances on one
// Postgres, each with its own pool and wake-up bus, as two processes would
// be: every call goes to either, a signal sent through one reaches a
// WebSocket attached to the other, and an instance may restart.
func TestPGPropertyDelivery(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (tens of seconds on Postgres): skipped by -short")
	}
	schema := pgtest.Schema(t)
	setRapidChecks(t, 4)
	check := 0
	rapid.Check(t, func(rt *rapid.T) {
		check++ // one schema for every check: each has tenants of its own
		runModel(rt, fmt.Sprintf("c%d-", check), []string{"a", "b"}, true, func(cfg hub.Config) (*hubtest.Hub, func()) {
			st, err := pgstore.Open(context.Background(), schema, pgstore.WithMaxConns(4))
			if err != nil {
				t.Fatalf("open pgstore: %v", err)
			}
			// A connection replaced or deregistered through the other
			// instance closes at this one's next sweep (docs/api.md).
			cfg.PendingSweep = 100 * time.Millisecond
			h := hubtest.Start(t, hubtest.Options{Store: st, Bus: pgstore.NewBus(st, nil), Config: cfg})
			stop := sync.OnceFunc(func() { h.Close(); _ = st.Close() })
			t.Cleanup(stop) // before the schema is dropped
			// It listens for wake-ups before anyone sends to it.
			waitFor(t, "the wake-up listener of "+cfg.InstanceID, func() bool { return metric(t, h, "marconi_wake_listener_connects_total") >= 1 })
			return h, stop
		})
	})
}

var (
	modelScopes = []hub.TenantProject{{TenantID: "t1", ProjectID: "p1"}, {TenantID: "t1", ProjectID: "p2"}, {TenantID: "t2", ProjectID: "p1"}, {TenantID: "t2", ProjectID: "p2"}}
	modelIDs    = []string{"a", "b", "c"} // the same ids in every scope
)

type modelSignal struct {
	ID      string
	Seq     int64
	From    string
	Payload string
}

type modelSession struct {
	scope   int
	id      string
	live    bool
	token   string
	stale   []string // tokens that no longer work
	pending []modelSignal
	lastSeq int64 // seq of the last signal sent to this incarnation; 0 before the first
	inc     int   // incarnation: idempotency keys are unique to one
	keys    map[string]modelSignal
	answers map[string]string // the delivery each key's first send answered: a duplicate repeats it, acknowledged or not
	burned  map[string]bool   // keys whose signal's recipient deregistered: the contract says nothing of them
	conn    *modelConn
}

// modelConn is one attached WebSocket; its reader checks every frame as it
// comes and keeps the signals it saw.
type modelConn struct {
	hub     int // index of its instance
	ws      *websocket.Conn
	done    chan struct{}
	mu      sync.Mutex
	seen    map[string]bool
	lastSeq int64
	bad     []string // violations seen by the reader
	closeBy websocket.StatusCode
	readErr error
}

type model struct {
	cfg      hub.Config
	ids      []string       // instance ids
	hubs     []*hubtest.Hub // instances on one store
	stops    []func()       // each stops its instance
	started  []time.Time    // when each instance was last asked to start, for failure messages
	start    func(hub.Config) (*hubtest.Hub, func())
	durable  bool         // the store outlives an instance
	h        *hubtest.Hub // the instance of the current call
	keys     []string     // API key per scope
	tenants  []hub.TenantProject
	sessions map[[2]any]*modelSession // (scope, id)
	n        int                      // payload counter: each payload is unique
	inc      int                      // incarnations registered
}

// runModel runs one random sequence against instances of the given ids
// that start starts, with prefix before every tenant id. When the store is
// durable (it outlives an instance), instances restart too.
func runModel(rt *rapid.T, prefix string, ids []string, durable bool, start func(hub.Config) (*hubtest.Hub, func())) {
	m := &model{ids: ids, start: start, durable: durable, sessions: map[[2]any]*modelSession{}}
	// The model sends and attaches as fast as it can; the rate quotas have
	// tests of their own.
	cfg := hub.Config{APIKeys: map[string]hub.TenantProject{}, AdminToken: hub.NewAdminToken(), SendRatePerSecond: 1e6, QuotaAttachesPerSecond: 1e6}
	for i, sc := range modelScopes {
		key := hub.NewAPIKey()
		tp := hub.TenantProject{TenantID: prefix + sc.TenantID, ProjectID: sc.ProjectID}
		cfg.APIKeys[key] = tp
		m.keys, m.tenants = append(m.keys, key), append(m.tenants, tp)
		for _, id := range modelIDs {
			m.sessions[[2]any{i, id}] = &modelSession{scope: i, id: id}
		}
	}
	m.cfg = cfg
	for _, id := range ids {
		m.cfg.InstanceID = id
		m.started = append(m.started, time.Now())
		h, stop := start(m.cfg)
		m.hubs, m.stops = append(m.hubs, h), append(m.stops, stop)
	}
	defer m.close()
	actions := map[string]func(*rapid.T){
		"register":   m.register,
		"resume":     m.resume,
		"send":       m.send,
		"send more":  m.send, // sends are most of the traffic
		"send again": m.send,
		"drain":      m.drain,
		"ack":        m.ack,
		"ackWS":      m.ackWS,
		"attach":     m.attach,
		"detach":     m.detach,
		"deregister": m.deregister,
		"staleToken": m.staleToken,
		"restart":    m.restart,
	}
	for name, act := range actions {
		actions[name] = func(rt *rapid.T) { // through either instance
			m.h = m.hubs[rapid.IntRange(0, len(m.hubs)-1).Draw(rt, "instance")]
			act(rt)
		}
	}
	actions[""] = m.check
	rt.Repeat(actions)
}

func (m *model) close() {
	for _, s := range m.sessions {
		if s.conn != nil {
			s.conn.ws.CloseNow()
			<-s.conn.done
		}
	}
	for _, stop := range m.stops {
		stop()
	}
}

// restart stops the current instance and starts it again on the same
// store, as a new process with the same id would: its connections close
// with 1012, and nothing else changes.
func (m *model) restart(rt *rapid.T) {
	if !m.durable {
		rt.Skip("the memory store forgets everything with the process")
	}
	i := slices.Index(m.hubs, m.h)
	var gone []*modelSession
	for _, s := range m.sessions {
		if s.conn != nil && s.conn.hub == i {
			gone = append(gone, s)
		}
	}
	m.stops[i]()
	for _, s := range gone {
		m.closed(rt, s.conn, "restarting")
		s.conn = nil
	}
	cfg := m.cfg
	cfg.InstanceID = m.ids[i]
	m.started[i] = time.Now()
	m.hubs[i], m.stops[i] = m.start(cfg)
	m.h = m.hubs[i]
	for _, s := range gone {
		m.eventually(rt, "every instance sees the queue gone with the process", func() bool {
			return strings.HasPrefix(m.routeState(rt, s), "route_without_queue@")
		})
	}
}

// pick draws a live session, registering one when none is live.
func (m *model) pick(rt *rapid.T) *modelSession {
	if s := m.draw(rt, func(s *modelSession) bool { return s.live }); s != nil {
		return s
	}
	m.register(rt)
	return m.pick(rt)
}

// pickAttached draws an attached session, attaching one when none is.
func (m *model) pickAttached(rt *rapid.T) *modelSession {
	if s := m.draw(rt, func(s *modelSession) bool { return s.conn != nil }); s != nil {
		return s
	}
	return m.attachOne(rt)
}

// draw draws one of the sessions that match, or returns nil.
func (m *model) draw(rt *rapid.T, match func(*modelSession) bool) *modelSession {
	var c []*modelSession
	for _, s := range m.sessions {
		if match(s) {
			c = append(c, s)
		}
	}
	if len(c) == 0 {
		return nil
	}
	slices.SortFunc(c, func(a, b *modelSession) int { return a.name() - b.name() })
	names := make([]int, len(c))
	for i, s := range c {
		names[i] = s.name()
	}
	i := slices.Index(names, rapid.SampledFrom(names).Draw(rt, "session (scope*10+id)"))
	return c[i]
}

// name is how logs name a session: its scope's index times ten plus its id's.
func (s *modelSession) name() int { return s.scope*10 + slices.Index(modelIDs, s.id) }

// do sends one request and decodes its JSON answer.
func (m *model) do(rt *rapid.T, method, path, cred string, body any, hdr ...string) (int, map[string]any) {
	st, out, _ := m.doRaw(rt, method, path, cred, body, hdr...)
	return st, out
}

func (m *model) doRaw(rt *rapid.T, method, path, cred string, body any, hdr ...string) (int, map[string]any, []byte) {
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, m.h.URL+path, r)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+cred)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		rt.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(raw) > 0 {
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		if err := d.Decode(&out); err != nil {
			rt.Fatalf("%s %s: answer is not JSON: %q", method, path, raw)
		}
	}
	return resp.StatusCode, out, raw
}

func expect(rt *rapid.T, what string, st int, body map[string]any, want int, code string) {
	rt.Helper()
	if st != want || (code != "" && errCode(body) != code) {
		rt.Fatalf("%s: %d %v, want %d %s", what, st, body, want, code)
	}
}

func (m *model) register(rt *rapid.T) {
	scope := rapid.IntRange(0, len(modelScopes)-1).Draw(rt, "scope")
	s := m.sessions[[2]any{scope, rapid.SampledFrom(modelIDs).Draw(rt, "id")}]
	st, body := m.do(rt, "POST", "/v1/sessions", m.keys[scope], map[string]any{"session_id": s.id, "surface": "claude_code"})
	if s.live {
		expect(rt, "register a live id without its token", st, body, 403, "forbidden")
		return
	}
	expect(rt, "register "+s.id, st, body, 201, "")
	if body["tenant_id"] != m.tenants[scope].TenantID || body["project_id"] != m.tenants[scope].ProjectID || body["session_id"] != s.id {
		rt.Fatalf("registered %v with the key of %v", body, m.tenants[scope])
	}
	m.inc++
	*s = modelSession{scope: scope, id: s.id, live: true, token: body["token"].(string), stale: s.stale,
		inc: m.inc, keys: map[string]modelSignal{}, answers: map[string]string{}, burned: map[string]bool{}}
}

// resume resumes a live session with its token, or takes it over with its
// project's key: a new token, the old one stale, and the WebSocket opened
// with the old one closed with 4409 wherever it is.
func (m *model) resume(rt *rapid.T) {
	s := m.draw(rt, func(s *modelSession) bool { return s.live })
	if s == nil {
		rt.Skip("no live session")
	}
	body, hdr, what := map[string]any{"session_id": s.id, "surface": "claude_code"}, []string{"X-Marconi-Session-Token", s.token}, "resume"
	if rapid.Bool().Draw(rt, "takeover") {
		body["takeover"], hdr, what = true, nil, "takeover"
	}
	st, got := m.do(rt, "POST", "/v1/sessions", m.keys[s.scope], body, hdr...)
	expect(rt, what+" "+s.id, st, got, 200, "")
	if got["taken_over"] != (what == "takeover") {
		rt.Fatalf("%s of %s answered taken_over %v", what, s.id, got["taken_over"])
	}
	s.stale = append(s.stale, s.token)
	s.token = got["token"].(string)
	if s.conn != nil {
		m.closed(rt, s.conn, "replaced")
		s.conn = nil
		m.eventually(rt, "every instance sees the detach", func() bool { return m.routeState(rt, s) == "route_without_queue@<nil>" })
	}
}

func (m *model) send(rt *rapid.T) {
	from := m.pick(rt)
	to := m.sessions[[2]any{from.scope, rapid.SampledFrom(modelIDs).Draw(rt, "to")}]
	key := ""
	if rapid.Bool().Draw(rt, "with idempotency key") {
		key = fmt.Sprintf("k%d-%d", from.inc, rapid.IntRange(0, 3).Draw(rt, "key"))
		if from.burned[key] {
			rt.Skip("a key whose signal's recipient deregistered")
		}
		if first, ok := from.keys[key]; ok { // a retry: the same recipient
			to = m.sessions[[2]any{from.scope, recipientOf(first)}]
		}
	}
	m.n++
	payload := fmt.Sprintf(`{"n":%d,"scope":%d,"to":%q}`, m.n, from.scope, to.id)
	sentAt := time.Now()
	st, body := m.do(rt, "POST", "/v1/signals", from.token, map[string]any{
		"to_session": to.id, "payload": json.RawMessage(payload), "idempotency_key": key,
	})
	if first, ok := from.keys[key]; ok && key != "" {
		expect(rt, "send again with a key", st, body, 200, "")
		if body["duplicate"] != true || body["signal_id"] != first.ID || bodySeq(rt, body) != first.Seq || body["delivery"] != from.answers[key] {
			rt.Fatalf("the same idempotency key again: %v, want the answer of %+v", body, first)
		}
		return
	}
	if !to.live {
		// Whether the id lives in another tenant or project or nowhere.
		expect(rt, "send to "+to.id+", not registered in this scope", st, body, 404, "recipient_not_registered")
		return
	}
	expect(rt, "send", st, body, 200, "")
	seq := bodySeq(rt, body)
	if body["duplicate"] != false || (to.lastSeq != 0 && seq != to.lastSeq+1) || seq < 1 {
		rt.Fatalf("send to %s: seq %d (duplicate %v) after %d", to.id, seq, body["duplicate"], to.lastSeq)
	}
	wantDelivery := "queued_offline"
	if to.conn != nil {
		wantDelivery = "pushed_to_ws"
	}
	if body["delivery"] != wantDelivery {
		// Say what the hub and the connection showed, so that a failure
		// seen once under load can be read without reproducing it: the
		// answer's route state (docs/api.md: recipient_route_state), how
		// long the instance had run (a process just started once judged
		// its peers from a view it had not read yet), and what that
		// instance and every instance say of the route now.
		conn := "no connection"
		if c := to.conn; c != nil {
			c.mu.Lock()
			conn = fmt.Sprintf("connection on instance %d, closed by %d (%v)", c.hub, c.closeBy, c.readErr)
			c.mu.Unlock()
		}
		i := slices.Index(m.hubs, m.h)
		now := m.routeStateOn(rt, m.h, to)
		rt.Fatalf("send to %s through instance %d (started %v before the send): delivery %v (recipient_route_state %v), want %s; %s; "+
			"instance %d now: %v, queue %v (%v); route state on every instance: %q",
			to.id, i, sentAt.Sub(m.started[i]).Round(time.Millisecond), body["delivery"], body["recipient_route_state"], wantDelivery, conn,
			i, now["route_state"], now["queue"], now["explanation"], m.routeState(rt, to))
	}
	to.lastSeq = seq
	sig := modelSignal{ID: body["signal_id"].(string), Seq: seq, From: from.id, Payload: payload}
	to.pending = append(to.pending, sig)
	if key != "" {
		from.keys[key] = sig
		from.answers[key] = wantDelivery
	}
}

func bodySeq(rt *rapid.T, body map[string]any) int64 {
	n, err := body["seq"].(json.Number).Int64()
	if err != nil {
		rt.Fatalf("seq in %v: %v", body, err)
	}
	return n
}

// drain reads every unacknowledged signal: exactly the model's, in order.
func (m *model) drain(rt *rapid.T) {
	s := m.pick(rt)
	if got, want := m.drained(rt, s), s.pending; !slices.Equal(got, want) {
		rt.Fatalf("drain %d/%s: %+v, want %+v", s.scope, s.id, got, want)
	}
}

func (m *model) drained(rt *rapid.T, s *modelSession) []modelSignal {
	st, body, raw := m.doRaw(rt, "GET", "/v1/signals?after_seq=0&limit=500", s.token, nil)
	expect(rt, "drain", st, body, 200, "")
	var d struct{ Signals []json.RawMessage }
	if err := json.Unmarshal(raw, &d); err != nil {
		rt.Fatal(err)
	}
	var got []modelSignal
	for _, f := range d.Signals {
		sig, err := checkSignal(s, f)
		if err != nil {
			rt.Fatal(err)
		}
		got = append(got, sig)
	}
	return got
}

// checkSignal checks that a delivered signal is addressed to s and comes
// from s's own tenant and project, and returns it as the model writes it.
func checkSignal(s *modelSession, raw []byte) (modelSignal, error) {
	var f struct {
		Type    string          `json:"type"`
		ID      string          `json:"id"`
		Seq     int64           `json:"seq"`
		From    string          `json:"from_session"`
		To      string          `json:"to_session"`
		Payload json.RawMessage `json:"payload"`
	}
	var p struct {
		Scope int    `json:"scope"`
		To    string `json:"to"`
	}
	if json.Unmarshal(raw, &f) != nil || json.Unmarshal(f.Payload, &p) != nil || f.To != s.id || p.Scope != s.scope || p.To != s.id {
		return modelSignal{}, fmt.Errorf("%d/%s got a signal addressed elsewhere: %s", s.scope, s.id, raw)
	}
	return modelSignal{ID: f.ID, Seq: f.Seq, From: f.From, Payload: string(f.Payload)}, nil
}

func (m *model) ack(rt *rapid.T) {
	s := m.pick(rt)
	upTo := rapid.Int64Range(0, s.lastSeq+1).Draw(rt, "up_to_seq")
	st, body := m.do(rt, "POST", "/v1/signals/ack", s.token, map[string]any{"up_to_seq": upTo})
	expect(rt, "ack", st, body, 200, "")
	n := s.ackUpTo(upTo)
	if got, err := body["acked"].(json.Number).Int64(); err != nil || got != int64(n) {
		rt.Fatalf("ack %d of %d/%s: acked %v, want %d", upTo, s.scope, s.id, body["acked"], n)
	}
}

func (s *modelSession) ackUpTo(upTo int64) int {
	n := len(s.pending)
	s.pending = slices.DeleteFunc(s.pending, func(g modelSignal) bool { return g.Seq <= upTo })
	return n - len(s.pending)
}

// ackWS acks over the WebSocket; the ack is applied asynchronously, so the
// drain is polled until it shows it.
func (m *model) ackWS(rt *rapid.T) {
	s := m.pickAttached(rt)
	// Not past the last seq: the drain cannot tell when an ack of nothing
	// has applied, and a late one would ack the next signal.
	upTo := rapid.Int64Range(0, s.lastSeq).Draw(rt, "up_to_seq")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.conn.ws.Write(ctx, websocket.MessageText, fmt.Appendf(nil, `{"type":"ack","up_to_seq":%d}`, upTo)); err != nil {
		rt.Fatalf("ack over the WebSocket: %v", err)
	}
	s.ackUpTo(upTo)
	m.eventually(rt, "the WebSocket ack applied", func() bool { return slices.Equal(m.drained(rt, s), s.pending) })
}

func (m *model) attach(rt *rapid.T) { m.attachOne(rt) }

// attachOne attaches a live session (replacing its connection if it has
// one) and returns it.
func (m *model) attachOne(rt *rapid.T) *modelSession {
	s := m.pick(rt)
	old := s.conn
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, m.h.WSURL(), &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + s.token}}})
	if err != nil {
		rt.Fatalf("attach %d/%s: %v", s.scope, s.id, err)
	}
	ws.SetReadLimit(1 << 20)
	_, data, err := ws.Read(ctx)
	var w map[string]any
	if err != nil || json.Unmarshal(data, &w) != nil || w["type"] != "welcome" || w["replayed"] != float64(len(s.pending)) {
		ws.CloseNow()
		rt.Fatalf("welcome of %d/%s: %s %v, want replayed %d", s.scope, s.id, data, err, len(s.pending))
	}
	c := &modelConn{ws: ws, done: make(chan struct{}), seen: map[string]bool{}, hub: slices.Index(m.hubs, m.h)}
	go c.read(s)
	s.conn = c
	if old != nil {
		m.closed(rt, old, "replaced") // the hub closes it, wherever it is
	}
	m.eventually(rt, "every instance sees the attach", func() bool { return strings.HasPrefix(m.routeState(rt, s), "attached@") })
	return s
}

func (c *modelConn) read(s *modelSession) {
	defer close(c.done)
	for {
		_, data, err := c.ws.Read(context.Background())
		if err != nil {
			c.mu.Lock()
			c.closeBy, c.readErr = websocket.CloseStatus(err), err
			c.mu.Unlock()
			return
		}
		var f struct{ Type string }
		c.mu.Lock()
		switch {
		case json.Unmarshal(data, &f) != nil || f.Type != "signal":
			c.bad = append(c.bad, fmt.Sprintf("unexpected frame %s", data))
		default:
			sig, err := checkSignal(s, data)
			switch {
			case err != nil:
				c.bad = append(c.bad, err.Error())
			case sig.Seq <= c.lastSeq:
				c.bad = append(c.bad, fmt.Sprintf("%d/%s: seq %d after %d on one connection", s.scope, s.id, sig.Seq, c.lastSeq))
			}
			c.lastSeq = sig.Seq
			c.seen[sig.ID] = true
		}
		c.mu.Unlock()
	}
}

func (m *model) detach(rt *rapid.T) {
	s := m.pickAttached(rt)
	s.conn.ws.Close(websocket.StatusNormalClosure, "bye")
	<-s.conn.done
	s.conn = nil
	// Until the store records the detach, another instance may still take
	// the queue for attached.
	m.eventually(rt, "every instance sees the detach", func() bool { return m.routeState(rt, s) == "route_without_queue@<nil>" })
}

// routeState is s's route state and the instance its queue is recorded on,
// as every instance sees them, or "" while they disagree.
func (m *model) routeState(rt *rapid.T, s *modelSession) string {
	state := ""
	for i, h := range m.hubs {
		body := m.routeStateOn(rt, h, s)
		q, _ := body["queue"].(map[string]any)
		if got := fmt.Sprintf("%v@%v", body["route_state"], q["instance_id"]); i == 0 {
			state = got
		} else if got != state {
			return ""
		}
	}
	return state
}

// routeStateOn is the operator's view of s's route (GET
// /v1/ops/route_state) as instance h answers it.
func (m *model) routeStateOn(rt *rapid.T, h *hubtest.Hub, s *modelSession) map[string]any {
	tp := m.tenants[s.scope]
	cur := m.h
	defer func() { m.h = cur }()
	m.h = h
	st, body := m.do(rt, "GET", "/v1/ops/route_state/"+tp.TenantID+"/"+tp.ProjectID+"/"+s.id, h.AdminToken, nil)
	expect(rt, "route_state", st, body, 200, "")
	return body
}

// closed waits until the hub has closed c, and checks it closed with the
// code of why.
func (m *model) closed(rt *rapid.T, c *modelConn, why string) {
	want := map[string]websocket.StatusCode{"replaced": 4409, "deregistered": 4410, "restarting": 1012}[why]
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		rt.Fatalf("the %s connection is still open", why)
	}
	if c.closeBy != want || len(c.bad) > 0 {
		rt.Fatalf("the %s connection closed with %d (%v), want %d; saw %v", why, c.closeBy, c.readErr, want, c.bad)
	}
}

func (m *model) deregister(rt *rapid.T) {
	s := m.pick(rt)
	st, body := m.do(rt, "DELETE", "/v1/session", s.token, nil)
	expect(rt, "deregister", st, body, 204, "")
	if s.conn != nil {
		m.closed(rt, s.conn, "deregistered")
	}
	*s = modelSession{scope: s.scope, id: s.id, stale: append(s.stale, s.token)}
	for _, o := range m.sessions {
		for k, sig := range o.keys { // its signals are gone: what their keys do next is open
			if o.scope == s.scope && recipientOf(sig) == s.id {
				delete(o.keys, k)
				o.burned[k] = true
			}
		}
	}
}

func recipientOf(sig modelSignal) string {
	var p struct{ To string }
	_ = json.Unmarshal([]byte(sig.Payload), &p)
	return p.To
}

// staleToken: a token replaced by a resume or a takeover, or of a deregistered session
// answers 410 and reaches nothing.
func (m *model) staleToken(rt *rapid.T) {
	var c []string
	for _, s := range m.sessions {
		c = append(c, s.stale...)
	}
	if len(c) == 0 {
		rt.Skip("no stale token yet")
	}
	slices.Sort(c)
	st, body := m.do(rt, "POST", "/v1/heartbeat", rapid.SampledFrom(c).Draw(rt, "token"), nil)
	expect(rt, "heartbeat with a stale token", st, body, 410, "session_expired")
}

// check runs after every step: each attached connection has received every
// signal its session has pending, and nothing it must not.
func (m *model) check(rt *rapid.T) {
	for _, s := range m.sessions {
		c := s.conn
		if c == nil {
			continue
		}
		m.eventually(rt, fmt.Sprintf("%d/%s receives its pending signals", s.scope, s.id), func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			for _, p := range s.pending {
				if !c.seen[p.ID] {
					return false
				}
			}
			return true
		})
		c.mu.Lock()
		bad, closed := c.bad, c.readErr
		c.mu.Unlock()
		if len(bad) > 0 || closed != nil {
			rt.Fatalf("%d/%s: %v (closed: %v)", s.scope, s.id, bad, closed)
		}
	}
}

func (m *model) eventually(rt *rapid.T, what string, cond func() bool) {
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			rt.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
