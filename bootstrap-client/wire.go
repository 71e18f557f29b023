package bootstrap

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/marconihub/marconi"
)

// Error is an error answered by the hub: the HTTP status and the stable code
// and message of its {"error": {...}} body (see docs/api.md for the codes).
// Use errors.As to get it from an error returned by this package.
type Error struct {
	Status  int
	Code    marconi.Code
	Message string
	// RetryAfter is the answer's Retry-After header (429, 503), zero when
	// it had none or one the client could not read.
	RetryAfter time.Duration

	// instanceURL is set on 409 wrong_instance: where the session's queue lives.
	instanceURL string
}

// Error formats the hub's answer.
func (e *Error) Error() string {
	return fmt.Sprintf("marconi hub: %d %s: %s", e.Status, e.Code, e.Message)
}

// ErrReplaced is what Config.OnFatal receives when a newer connection of the
// session replaced the client's (close 4409): another process resumed the
// session or took it over. The client does not fight it.
var ErrReplaced = errors.New("bootstrap: session taken by a newer connection (4409); not reconnecting")

// parseRetryAfter reads a Retry-After header: delay-seconds or an HTTP date.
// Zero when it is missing, unreadable, or not in the future.
func parseRetryAfter(h string, now time.Time) time.Duration {
	if h == "" {
		return 0
	}
	if n, err := strconv.ParseInt(strings.TrimSpace(h), 10, 64); err == nil {
		if n <= 0 || n > maxRetryAfterSeconds {
			return 0
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(h); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// maxRetryAfterSeconds is the largest Retry-After the client reads as a
// number of seconds (a day); anything larger is taken as unreadable.
const maxRetryAfterSeconds = 86400

// codeUnexpected is the code of an *Error built from an answer that did not
// carry the hub's error body (a proxy's page, an empty body). It is the
// client's own: the hub never sends it.
const codeUnexpected marconi.Code = "unexpected_response"

// decodeError turns a non-2xx answer into an *Error. It never fails: a body
// that is not the hub's error object still yields the status.
func decodeError(status int, body []byte) *Error {
	var w struct {
		Error struct {
			Code        marconi.Code `json:"code"`
			Message     string       `json:"message"`
			InstanceURL *string      `json:"instance_url"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &w); err != nil || w.Error.Code == "" {
		msg := strings.TrimSpace(string(body))
		if len(msg) > 200 {
			msg = msg[:200]
		}
		if msg == "" {
			msg = http.StatusText(status)
		}
		return &Error{Status: status, Code: codeUnexpected, Message: msg}
	}
	e := &Error{Status: status, Code: w.Error.Code, Message: w.Error.Message}
	if w.Error.InstanceURL != nil {
		e.instanceURL = *w.Error.InstanceURL
	}
	return e
}

// Signal is one signal addressed to this session, as the hub delivers it.
type Signal struct {
	ID          string          `json:"id"`
	FromSession string          `json:"from_session"`
	ToSession   string          `json:"to_session"`
	Kind        string          `json:"kind"`
	Seq         int64           `json:"seq"`
	Payload     json.RawMessage `json:"payload"`
	CreatedAt   time.Time       `json:"created_at"`
}

// SendResult is the hub's answer to a send. The self-heal fields are what the
// hub observed (SPEC-168); the client has already acted on SenderRouteStale
// when Send returns. SelfhealOutcome is "" when the hub sent null.
type SendResult struct {
	SignalID                                         string
	Delivery                                         marconi.Delivery
	RecipientRouteState                              marconi.RouteState
	SelfhealOutcome                                  marconi.Outcome
	Seq                                              int64
	RecipientRouteStale, SenderRouteStale, Duplicate bool
}

// Stats counts what the client did to keep its route. Reconnects counts every
// successful reattachment after the first, whatever the cause;
// SelfHealReconnects counts the reconnects started by a send answered with
// sender_route_stale; Reregistrations counts the times the session had to be
// registered again because the hub no longer knew it; DroppedAtReset sums the
// welcomes' "dropped": the pending signals a hub with the disconnect policy
// drop discarded when it took this sticky session over (affinity reset), which
// OnSignal will never see; PingTimeouts counts the connections closed because
// the hub left a ping unanswered (Config.PingTimeout): a path that died
// silently, each followed by a reconnect; Takeovers counts the registrations
// the hub answered "taken_over" (Config.Takeover); RateLimited counts the 429
// answers the client waited out and retried (Config.RateLimitWait), attaches
// included.
type Stats struct {
	Reconnects, SelfHealReconnects, Reregistrations, DroppedAtReset, PingTimeouts, Takeovers, RateLimited int
	// HolderSends counts sends answered by the instance holding the
	// recipient's queue, sent there on the hub's hint; HolderFallbacks, those
	// sent through the hub URL instead because that instance could not be
	// reached (Config.HolderRetryAfter).
	HolderSends, HolderFallbacks int
	// Acks counts the acknowledgements that reached the hub, the client's
	// own and DeferAck's Client.Ack's: ack frames written, and
	// POST /v1/signals/ack answered while the WebSocket was down. Paced by
	// Config.AckInterval, each covers every signal handled before it.
	Acks int
}

// sendRequest is the body of POST /v1/signals.
type sendRequest struct {
	ToSession      string          `json:"to_session"`
	Kind           string          `json:"kind,omitempty"`
	Payload        json.RawMessage `json:"payload"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
}

// sendResponse is the hub's 200 answer to POST /v1/signals.
type sendResponse struct {
	SignalID            string             `json:"signal_id"`
	Seq                 int64              `json:"seq"`
	Delivery            marconi.Delivery   `json:"delivery"`
	RecipientRouteState marconi.RouteState `json:"recipient_route_state"`
	// RecipientInstanceURL is the hub's hint where the recipient's queue is.
	RecipientInstanceURL string           `json:"recipient_instance_url"`
	SelfhealOutcome      *marconi.Outcome `json:"selfheal_outcome"`
	RecipientRouteStale  bool             `json:"recipient_route_stale"`
	SenderRouteStale     bool             `json:"sender_route_stale"`
	Duplicate            bool             `json:"duplicate"`
	Pending              []Signal         `json:"pending"`
	// History is the store's history Pending was read under (history.go).
	History string `json:"history"`
}

func (r *sendResponse) decodeAnswer(data []byte) error { return decodeSendResponse(data, r) }

func (r sendResponse) result() SendResult {
	res := SendResult{
		SignalID:            r.SignalID,
		Delivery:            r.Delivery,
		RecipientRouteState: r.RecipientRouteState,
		Seq:                 r.Seq,
		RecipientRouteStale: r.RecipientRouteStale,
		SenderRouteStale:    r.SenderRouteStale,
		Duplicate:           r.Duplicate,
	}
	if r.SelfhealOutcome != nil {
		res.SelfhealOutcome = *r.SelfhealOutcome
	}
	return res
}

// registerRequest is the body of POST /v1/sessions.
type registerRequest struct {
	SessionID   string `json:"session_id,omitempty"`
	Surface     string `json:"surface"`
	RuntimeMode string `json:"runtime_mode,omitempty"`
	ClientID    string `json:"client_id,omitempty"`
	Takeover    bool   `json:"takeover,omitempty"`
}

// heartbeatResponse is the part of the answer to POST /v1/heartbeat the client uses.
type heartbeatResponse struct {
	RouteState string   `json:"route_state"`
	Pending    []Signal `json:"pending"`
	History    string   `json:"history"`
}

// drainResponse is the answer to GET /v1/signals.
type drainResponse struct {
	Signals        []Signal `json:"signals"`
	NextAfterSeq   int64    `json:"next_after_seq"`
	History        string   `json:"history"`
	HistoryChanged bool     `json:"history_changed"`
}

// ackRequest is both the body of POST /v1/signals/ack and, with Type "ack",
// the WebSocket ack frame.
type ackRequest struct {
	Type    marconi.FrameType `json:"type,omitempty"`
	UpToSeq int64             `json:"up_to_seq"`
	// History is the store's history the acknowledged signals came under
	// (HTTP only; a WebSocket's acks are checked by its connection).
	History string `json:"history,omitempty"`
}

// frame is one message from the hub on the WebSocket after the welcome.
type frame struct {
	Type marconi.FrameType `json:"type"`
	Signal
	// History is a history frame's token.
	History string `json:"history"`
}
