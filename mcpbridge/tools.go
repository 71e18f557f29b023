package mcpbridge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/marconihub/marconi/bootstrap-client"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Bounds of the tools' inputs (docs/api.md, The MCP bridge).
const (
	defaultReadMax = 50
	maxReadMax     = 500
	maxWaitSeconds = 60
	// receivedMax bounds the signals a send_signal answer returns.
	receivedMax = 50
	// drainSettle bounds how long a read on a codex surface waits for the
	// signals its drain fetched to pass the client's dispatcher.
	drainSettle = 2 * time.Second
)

// Error codes of the bridge's own tool errors; the hub's codes pass through.
const (
	codeInvalidField   = "invalid_field"
	codeInvalidJSON    = "invalid_json"
	codeUnknownTool    = "unknown_tool"
	codeHubUnreachable = "hub_unreachable"
	codeReplaced       = "replaced"
)

func (b *Bridge) newServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "marconi", Title: "Marconi signaling hub", Version: b.cfg.Version},
		&mcp.ServerOptions{
			Instructions: "Marconi connects you to other agents. send_signal sends one a message by its session id; " +
				"read_signals returns the messages sent to you (each once); whoami shows your own session id.",
			Logger:             slog.New(minLevel{b.cfg.Logger.Handler(), slog.LevelWarn}), // the SDK's info is noise
			SubscribeHandler:   b.subscribe,
			UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
		})
	s.AddTool(&mcp.Tool{Name: "send_signal", Title: "Send a signal to another agent", Description: sendDescription,
		InputSchema: sendInputSchema, OutputSchema: sendOutputSchema}, b.sendSignal)
	s.AddTool(&mcp.Tool{Name: "read_signals", Title: "Read the signals sent to you", Description: readDescription,
		InputSchema: readInputSchema, OutputSchema: readOutputSchema}, b.readSignals)
	s.AddTool(&mcp.Tool{Name: "whoami", Title: "Show your session on the hub", Description: whoamiDescription,
		InputSchema: whoamiInputSchema, OutputSchema: whoamiOutputSchema,
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, b.whoami)
	s.AddResource(&mcp.Resource{URI: InboxURI, Name: "inbox", Title: "Signals not yet read",
		Description: inboxDescription, MIMEType: "application/json"}, b.readInbox)
	s.AddReceivingMiddleware(b.stoppedAsToolError, unknownToolAsToolError)
	return s
}

// stoppedAsToolError answers every tool call with why the client stopped,
// once it has stopped for good, instead of an answer from a session this
// server no longer holds.
func (b *Bridge) stoppedAsToolError(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if st := b.stopped.Load(); st != nil && method == "tools/call" {
			return toolError(st.code, st.message), nil
		}
		return next(ctx, method, req)
	}
}

// unknownToolAsToolError answers a call of a tool the bridge does not have
// as a tool error, which a model reads and corrects, rather than a protocol
// error.
func unknownToolAsToolError(next mcp.MethodHandler) mcp.MethodHandler {
	known := map[string]bool{"send_signal": true, "read_signals": true, "whoami": true}
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if r, ok := req.(*mcp.CallToolRequest); ok && method == "tools/call" && !known[r.Params.Name] {
			return toolError(codeUnknownTool, fmt.Sprintf("no tool %q: the tools are send_signal, read_signals and whoami", r.Params.Name)), nil
		}
		return next(ctx, method, req)
	}
}

// toolError is a tool answer with isError set, its text the hub's error shape.
func toolError(code, message string) *mcp.CallToolResult {
	var w struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	w.Error.Code, w.Error.Message = code, message
	text, _ := json.Marshal(w)
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: string(text)}}}
}

// hubError turns an error of the client into a tool error: the hub's code
// and message when it answered one.
func hubError(err error) *mcp.CallToolResult {
	var he *bootstrap.Error
	if errors.As(err, &he) {
		return toolError(string(he.Code), he.Message)
	}
	return toolError(codeHubUnreachable, err.Error())
}

// answer is a tool's structured result with a sentence as its text.
func answer(sentence string, out any, token uint64) (*mcp.CallToolResult, error) {
	raw, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encode answer: %w", err)
	}
	res := &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: sentence + "\n" + string(raw)}},
		StructuredContent: json.RawMessage(raw),
	}
	if token != 0 {
		res.Meta = mcp.Meta{readMetaKey: token}
	}
	return res, nil
}

// decodeArgs decodes a tool's arguments strictly: an unknown field is an
// error naming it. Absent arguments decode as {}.
func decodeArgs(raw json.RawMessage, v any) *mcp.CallToolResult {
	if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		raw = json.RawMessage("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return toolError(codeInvalidField, "arguments: "+err.Error())
	}
	return nil
}

// signalOut is a signal as the tools return it.
type signalOut struct {
	ID        string          `json:"id"`
	Seq       int64           `json:"seq"`
	From      string          `json:"from"`
	Kind      string          `json:"kind"`
	Payload   json.RawMessage `json:"payload"`
	CreatedAt time.Time       `json:"created_at"`
}

func signalsOut(sigs []bootstrap.Signal) []signalOut {
	out := make([]signalOut, 0, len(sigs))
	for _, s := range sigs {
		p := s.Payload
		if len(p) == 0 {
			p = json.RawMessage("null")
		}
		out = append(out, signalOut{ID: s.ID, Seq: s.Seq, From: s.FromSession, Kind: s.Kind, Payload: p, CreatedAt: s.CreatedAt})
	}
	return out
}

type sendArgs struct {
	To             *string         `json:"to"`
	Text           *string         `json:"text"`
	Payload        json.RawMessage `json:"payload"`
	Kind           string          `json:"kind"`
	IdempotencyKey string          `json:"idempotency_key"`
}

type sendOut struct {
	SignalID            string      `json:"signal_id"`
	Seq                 int64       `json:"seq"`
	Delivery            string      `json:"delivery"`
	RecipientRouteState string      `json:"recipient_route_state"`
	RecipientRouteStale bool        `json:"recipient_route_stale"`
	SenderRouteStale    bool        `json:"sender_route_stale"`
	SelfhealOutcome     *string     `json:"selfheal_outcome"`
	Duplicate           bool        `json:"duplicate"`
	Received            []signalOut `json:"received"`
}

// payload checks send_signal's text or payload and returns what to send.
func (a sendArgs) payload() (any, *mcp.CallToolResult) {
	p := bytes.TrimSpace(a.Payload)
	hasPayload := len(p) > 0 && !bytes.Equal(p, []byte("null"))
	switch {
	case a.Text != nil && hasPayload:
		return nil, toolError(codeInvalidField, "give text or payload, not both")
	case a.Text != nil:
		return map[string]string{"text": *a.Text}, nil
	case !hasPayload:
		return nil, toolError(codeInvalidField, "text or payload is required: the message to send")
	case p[0] != '{':
		return nil, toolError(codeInvalidField, "payload must be a JSON object; for plain text use text")
	}
	return json.RawMessage(p), nil
}

func (b *Bridge) sendSignal(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var a sendArgs
	if bad := decodeArgs(req.Params.Arguments, &a); bad != nil {
		return bad, nil
	}
	if a.To == nil || *a.To == "" {
		return toolError(codeInvalidField, "to is required: the recipient's session id"), nil
	}
	payload, bad := a.payload()
	if bad != nil {
		return bad, nil
	}
	var opts []bootstrap.SendOption
	if a.IdempotencyKey != "" {
		opts = append(opts, bootstrap.WithIdempotencyKey(a.IdempotencyKey))
	}
	res, err := b.client.Send(ctx, *a.To, a.Kind, payload, opts...)
	if err != nil {
		return hubError(err), nil
	}
	b.logSelfHeal(*a.To, res)
	if b.cfg.piggybackOnly() {
		_ = b.drainSettled(ctx) // best effort: what it misses waits for the next read
	}
	var (
		sigs  []bootstrap.Signal
		token uint64
	)
	if ctx.Err() == nil { // cancelled: no answer will carry signals taken now
		sigs, token, _ = b.inbox.take(receivedMax)
	}
	out := sendOut{
		SignalID: res.SignalID, Seq: res.Seq, Delivery: string(res.Delivery), RecipientRouteState: string(res.RecipientRouteState),
		RecipientRouteStale: res.RecipientRouteStale, SenderRouteStale: res.SenderRouteStale,
		Duplicate: res.Duplicate, Received: signalsOut(sigs),
	}
	if res.SelfhealOutcome != "" {
		o := string(res.SelfhealOutcome)
		out.SelfhealOutcome = &o
	}
	sentence := fmt.Sprintf("Sent to %s (seq %d): %s.", *a.To, res.Seq, res.Delivery)
	if len(sigs) > 0 {
		sentence += fmt.Sprintf(" %d signal(s) for you came back with it.", len(sigs))
	}
	return answer(sentence, out, token)
}

// logSelfHeal tells the host what SPEC-168 observed on a send.
func (b *Bridge) logSelfHeal(to string, res bootstrap.SendResult) {
	if res.SenderRouteStale {
		b.log.Warn("marconi: the hub had no live route for this session (sender_route_stale); reconnected",
			"to_session", to, "selfheal_outcome", res.SelfhealOutcome)
	}
}

type readArgs struct {
	Max         *int     `json:"max"`
	WaitSeconds *float64 `json:"wait_seconds"`
}

type readOut struct {
	Signals []signalOut `json:"signals"`
	More    bool        `json:"more"`
}

func (a readArgs) check() (max int, wait time.Duration, bad *mcp.CallToolResult) {
	max = defaultReadMax
	if a.Max != nil {
		if *a.Max < 1 || *a.Max > maxReadMax {
			return 0, 0, toolError(codeInvalidField, fmt.Sprintf("max %d: want 1 to %d", *a.Max, maxReadMax))
		}
		max = *a.Max
	}
	if a.WaitSeconds != nil {
		if *a.WaitSeconds < 0 || *a.WaitSeconds > maxWaitSeconds {
			return 0, 0, toolError(codeInvalidField, fmt.Sprintf("wait_seconds %g: want 0 to %d", *a.WaitSeconds, maxWaitSeconds))
		}
		wait = time.Duration(*a.WaitSeconds * float64(time.Second))
	}
	return max, wait, nil
}

func (b *Bridge) readSignals(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var a readArgs
	if bad := decodeArgs(req.Params.Arguments, &a); bad != nil {
		return bad, nil
	}
	max, wait, bad := a.check()
	if bad != nil {
		return bad, nil
	}
	if err := b.awaitSignal(ctx, wait); err != nil {
		return hubError(err), nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err() // cancelled: no answer will carry signals taken now
	}
	if st := b.stopped.Load(); st != nil { // while it waited
		return toolError(st.code, st.message), nil
	}
	sigs, token, more := b.inbox.take(max)
	sentence := "No signals."
	if len(sigs) > 0 {
		sentence = fmt.Sprintf("%d signal(s), oldest first.", len(sigs))
	}
	if more {
		sentence += " More are waiting: call read_signals again."
	}
	return answer(sentence, readOut{Signals: signalsOut(sigs), More: more}, token)
}

// awaitSignal returns once a signal is unread, or wait has passed, or ctx
// ended (nil: the read answers with what there is). A codex surface, which
// nothing pushes to, drains the hub first and again every DrainInterval.
func (b *Bridge) awaitSignal(ctx context.Context, wait time.Duration) error {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	var poll <-chan time.Time
	if b.cfg.piggybackOnly() {
		if err := b.drainSettled(ctx); err != nil {
			return err
		}
		t := time.NewTicker(b.cfg.DrainInterval)
		defer t.Stop()
		poll = t.C
	}
	for {
		changed, unread := b.inbox.wait()
		if unread || wait <= 0 {
			return nil
		}
		select {
		case <-changed:
		case <-poll:
			if err := b.drainSettled(ctx); err != nil {
				return err
			}
		case <-deadline.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// drainSettled fetches the signals the hub holds (codex) and waits, briefly,
// until the client's dispatcher has put them in the inbox.
func (b *Bridge) drainSettled(ctx context.Context) error {
	upTo, err := b.client.Drain(ctx)
	if err != nil || upTo == 0 {
		return err
	}
	settle := time.NewTimer(drainSettle)
	defer settle.Stop()
	for {
		changed, _ := b.inbox.wait()
		if b.inbox.lastSeq() >= upTo {
			return nil
		}
		select {
		case <-changed:
		case <-settle.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

type whoamiOut struct {
	SessionID   string `json:"session_id"`
	TenantID    string `json:"tenant_id"`
	ProjectID   string `json:"project_id"`
	Surface     string `json:"surface"`
	RuntimeMode string `json:"runtime_mode"`
	RouteState  string `json:"route_state"`
	Pending     int    `json:"pending"`
	Hub         string `json:"hub"`
}

func (b *Bridge) whoami(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var none struct{}
	if bad := decodeArgs(req.Params.Arguments, &none); bad != nil {
		return bad, nil
	}
	state, err := b.client.Heartbeat(ctx)
	if err != nil {
		return hubError(err), nil
	}
	reg := b.client.Registration()
	out := whoamiOut{SessionID: reg.SessionID, TenantID: reg.TenantID, ProjectID: reg.ProjectID, Surface: reg.Surface,
		RuntimeMode: reg.RuntimeMode, RouteState: state, Pending: len(b.inbox.unread()), Hub: b.client.HubURL()}
	return answer(fmt.Sprintf("You are %s (%s), route %s, %d signal(s) waiting.", out.SessionID, out.Surface, state, out.Pending), out, 0)
}

// readInbox lists the signals not yet read. Once the client has stopped for
// good, it answers why instead: what the inbox still holds is the hub's to
// deliver again to the session's holder, not this agent's to read.
func (b *Bridge) readInbox(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	if st := b.stopped.Load(); st != nil {
		return nil, fmt.Errorf("%s: %s", st.code, st.message)
	}
	raw, err := json.Marshal(struct {
		Signals []signalOut `json:"signals"`
	}{signalsOut(b.inbox.unread())})
	if err != nil {
		return nil, err
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: InboxURI, MIMEType: "application/json", Text: string(raw)}}}, nil
}

func (b *Bridge) subscribe(_ context.Context, req *mcp.SubscribeRequest) error {
	if req.Params.URI != InboxURI {
		return fmt.Errorf("no resource %q to subscribe to: the bridge has %s", req.Params.URI, InboxURI)
	}
	return nil
}
