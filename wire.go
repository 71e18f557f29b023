package marconi

import (
	"regexp"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// WebSocket close codes of the contract (docs/api.md, "WebSocket"). They
// are coder/websocket's type, so both ends pass them to Close and compare
// them with CloseStatus as they are.
const (
	// CloseUnauthorized: the session token stopped working.
	CloseUnauthorized websocket.StatusCode = 4401
	// CloseReplaced: a newer connection of the same session took over; the
	// client does not redial.
	CloseReplaced websocket.StatusCode = 4409
	// CloseSessionExpired: the session was deregistered or expired; the
	// client registers again.
	CloseSessionExpired websocket.StatusCode = 4410
	// CloseSlowConsumer: the connection's queue was full; its signals stay
	// stored.
	CloseSlowConsumer websocket.StatusCode = 4429
	// CloseRestarting: the hub is stopping or an operator disconnected the
	// session; the client redials.
	CloseRestarting websocket.StatusCode = websocket.StatusServiceRestart
	// ClosePolicy: frames (control frames included) came faster than the
	// frame quota allows.
	ClosePolicy websocket.StatusCode = websocket.StatusPolicyViolation
	// CloseMessageTooBig: a frame exceeded the hub's read limit.
	CloseMessageTooBig websocket.StatusCode = websocket.StatusMessageTooBig
	// CloseInvalidPayload: a text frame that is not valid UTF-8.
	CloseInvalidPayload websocket.StatusCode = websocket.StatusInvalidFramePayloadData
)

// CloseCodes lists the close codes of the contract.
var CloseCodes = []websocket.StatusCode{
	CloseUnauthorized, CloseReplaced, CloseSessionExpired, CloseSlowConsumer,
	CloseRestarting, ClosePolicy, CloseMessageTooBig, CloseInvalidPayload,
}

// FrameType is the "type" field of a WebSocket frame.
type FrameType string

// Frame types: the hub sends welcome, signal, history and error; the client
// sends ack and ping.
const (
	FrameWelcome FrameType = "welcome"
	FrameSignal  FrameType = "signal"
	// FrameHistory tells the client the store's new history token before
	// the hub writes the unacknowledged signals again after the store's
	// history changed (docs/api.md).
	FrameHistory FrameType = "history"
	FrameError   FrameType = "error"
	FrameAck     FrameType = "ack"
	FramePing    FrameType = "ping"
)

// FrameTypes lists every FrameType.
var FrameTypes = []FrameType{FrameWelcome, FrameSignal, FrameHistory, FrameError, FrameAck, FramePing}

// HTTP header names of the contract.
const (
	// HeaderSessionToken carries a session token (or Authorization: Bearer).
	HeaderSessionToken = "X-Marconi-Session-Token"
	// HeaderAPIKey carries a project API key (or Authorization: Bearer).
	HeaderAPIKey = "X-API-Key"
	// HeaderIdempotencyKey makes a registration safe to retry.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderRetryAfter says, in whole seconds, when a refused call may help.
	HeaderRetryAfter = "Retry-After"
	// HeaderProject names the project of a registered session,
	// "<tenant_id>/<project_id>" (ProjectRoute), on the clients' requests
	// for it, so that a load balancer can keep one project's traffic on one
	// instance (docs/operations.md, "Behind a load balancer"). The hub
	// ignores it: it is never trusted for anything.
	HeaderProject = "X-Marconi-Project"
)

// ProjectRoute is HeaderProject's value for a session of tenant and project,
// or "" when either is not an id of the contract ([A-Za-z0-9._-], 1 to 128
// bytes): the value then carries nothing but two ids, never a separator, a
// space or a line break.
func ProjectRoute(tenant, project string) string {
	if !routeID(tenant) || !routeID(project) {
		return ""
	}
	return tenant + "/" + project
}

// routeID reports whether s is an id of the contract: 1 to 128 bytes of
// [A-Za-z0-9._-].
func routeID(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '.' || b == '_' || b == '-') {
			return false
		}
	}
	return true
}

// Surface is what kind of agent a session is (the surface field of a
// registration). Whether it keeps a persistent WebSocket decides the
// self-heal surface gate.
type Surface string

// Surfaces of the contract. A console is SurfaceConsolePrefix followed by a
// name of 1 to 64 characters [A-Za-z0-9._-].
const (
	SurfaceClaudeCode    Surface = "claude_code"
	SurfaceHeadlessCC    Surface = "headless_cc"
	SurfaceHeadlessCX    Surface = "headless_cx"
	SurfaceCodex         Surface = "codex"
	SurfaceConsolePrefix         = "console_"
)

// Surfaces lists the surfaces that are a single word (every console is
// SurfaceConsolePrefix and a name).
var Surfaces = []Surface{SurfaceClaudeCode, SurfaceHeadlessCC, SurfaceHeadlessCX, SurfaceCodex}

// SurfaceNames lists the contract's surfaces for messages, in the order of
// docs/api.md.
const SurfaceNames = string(SurfaceClaudeCode) + ", " + SurfaceConsolePrefix + "<name>, " +
	string(SurfaceHeadlessCC) + ", " + string(SurfaceHeadlessCX) + ", " + string(SurfaceCodex)

var consoleName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Valid reports whether s is one of the contract's surfaces.
func (s Surface) Valid() bool {
	switch s {
	case SurfaceClaudeCode, SurfaceHeadlessCC, SurfaceHeadlessCX, SurfaceCodex:
		return true
	}
	name, ok := strings.CutPrefix(string(s), SurfaceConsolePrefix)
	return ok && consoleName.MatchString(name)
}

// Live reports whether s keeps a persistent WebSocket and so can be healed by
// a reconnect: claude_code, headless_cc, headless_cx and console_<name> with
// a non-empty name. codex (piggyback only) and anything else are not live.
func (s Surface) Live() bool {
	switch s {
	case SurfaceClaudeCode, SurfaceHeadlessCC, SurfaceHeadlessCX:
		return true
	}
	name, ok := strings.CutPrefix(string(s), SurfaceConsolePrefix)
	return ok && name != ""
}

// RouteState is whether the hub can reach a session (docs/api.md "Route
// state"); it is the route_state field on the wire.
type RouteState string

// Route states of a session.
const (
	StateAttached          RouteState = "attached"
	StateRouteWithoutQueue RouteState = "route_without_queue"
	StateStale             RouteState = "stale"
	StateNotRegistered     RouteState = "not_registered"
)

// RouteStates lists every RouteState.
var RouteStates = []RouteState{StateAttached, StateRouteWithoutQueue, StateStale, StateNotRegistered}

// Delivery is how a send was classified; it is the delivery field of a
// send's answer.
type Delivery string

// Delivery classifications of a send.
const (
	DeliveryPushed              Delivery = "pushed_to_ws"
	DeliveryQueuedOffline       Delivery = "queued_offline"
	DeliveryNotAvailableOffline Delivery = "not_available_offline"
)

// Deliveries lists every Delivery.
var Deliveries = []Delivery{DeliveryPushed, DeliveryQueuedOffline, DeliveryNotAvailableOffline}

// Outcome is the result of one side's self-heal evaluation, exactly the
// SPEC-168 AC-8 enum (null is the empty string); it is the
// selfheal_outcome field of a send's answer.
type Outcome string

// Outcomes of one side's evaluation. They are also the only label values of
// marconi_route_self_healed_total.
const (
	// OutcomeAttempted: the side has no queue but recent proof of life; the
	// hint (*_route_stale: true) is set and a token was spent.
	OutcomeAttempted Outcome = "attempted"
	// OutcomeSucceeded is reserved for a future server-observed reconnect.
	OutcomeSucceeded Outcome = "succeeded"
	// OutcomeNoListener is reserved for a future confirmation that no live
	// WebSocket handler exists.
	OutcomeNoListener Outcome = "no_listener"
	// OutcomeRateLimited: the side's token bucket is empty; no hint is set.
	OutcomeRateLimited Outcome = "rate_limited"
	// OutcomeStaleRecency: the side's freshest proof of life is too old; it is
	// treated as genuinely offline and no hint is set.
	OutcomeStaleRecency Outcome = "stale_recency"
	// OutcomeUnsupportedSurface: the recipient's surface has no persistent
	// WebSocket (codex, piggyback only); no hint is set.
	OutcomeUnsupportedSurface Outcome = "unsupported_surface"
	// OutcomeFailed is reserved for a future transient error in detection.
	OutcomeFailed Outcome = "failed"
)

// Outcomes lists every Outcome in its documented order.
var Outcomes = []Outcome{
	OutcomeAttempted, OutcomeSucceeded, OutcomeNoListener, OutcomeRateLimited,
	OutcomeStaleRecency, OutcomeUnsupportedSurface, OutcomeFailed,
}

// RuntimeMode is a session's runtime mode (the runtime_mode field).
type RuntimeMode string

// Runtime modes that are implemented. soft_sticky, pinned and hybrid are
// named by the recovery matrix and refused as reserved.
const (
	RuntimeStateless RuntimeMode = "stateless"
	RuntimeSticky    RuntimeMode = "sticky"
)

// RuntimeModes lists the implemented runtime modes.
var RuntimeModes = []RuntimeMode{RuntimeStateless, RuntimeSticky}

// ModeSource is what chose a session's runtime mode (the
// runtime_mode_source field).
type ModeSource string

// Sources of a session's runtime mode.
const (
	SourceExplicit ModeSource = "explicit"
	SourceAdaptive ModeSource = "adaptive-classifier"
	SourceDefault  ModeSource = "default"
)

// ModeSources lists every ModeSource.
var ModeSources = []ModeSource{SourceExplicit, SourceAdaptive, SourceDefault}

// DeploymentMode is how a hub is deployed (MARCONI_MODE): it sets the
// defaults that differ between a laptop and a shared network.
type DeploymentMode string

// Deployment modes.
const (
	// Development is the default: self-heal on, generated credentials, the
	// memory store allowed without a public URL.
	Development DeploymentMode = "development"
	// LAN is a hub on a private network.
	LAN DeploymentMode = "lan"
	// Cloud is a hub reachable from the internet.
	Cloud DeploymentMode = "cloud"
)

// DeploymentModes lists every DeploymentMode.
var DeploymentModes = []DeploymentMode{Development, LAN, Cloud}

// SessionAnswer is the hub's answer to POST /v1/sessions, a registration or
// a resume (docs/api.md): the session, its new token and where the hub
// placed it. The hub writes it and the Go client reads it.
type SessionAnswer struct {
	SessionID         string      `json:"session_id"`
	Token             string      `json:"token"`
	TenantID          string      `json:"tenant_id"`
	ProjectID         string      `json:"project_id"`
	Surface           Surface     `json:"surface"`
	RuntimeMode       RuntimeMode `json:"runtime_mode"`
	RuntimeModeSource ModeSource  `json:"runtime_mode_source"`
	// InstanceID is the instance that answered, or a sticky session's
	// assigned one; InstanceURL is that one's URL, or null when the hub
	// does not know it (and for a stateless session).
	InstanceID               string    `json:"instance_id"`
	InstanceURL              *string   `json:"instance_url"`
	RegisteredAt             time.Time `json:"registered_at"`
	ExpiresAt                time.Time `json:"expires_at"`
	HeartbeatIntervalSeconds int       `json:"heartbeat_interval_seconds"`
	// TakenOver says the registration took the live session over by its
	// project's API key; false in every other answer.
	TakenOver bool `json:"taken_over"`
}
