package conns

import (
	"github.com/coder/websocket"

	"github.com/marconihub/marconi"
)

// A Disconnect is why the hub closes a connection: the close code and
// reason the client reads, and the label the disconnect is counted under in
// marconi_ws_disconnects_total.
type Disconnect struct {
	Code   websocket.StatusCode
	Reason string
	Label  string
}

func (d Disconnect) String() string { return d.Label }

// The disconnects the hub decides. The first one a connection gets wins.
var (
	DisconnectReplaced          = Disconnect{marconi.CloseReplaced, "replaced by a newer connection of this session", "replaced"}
	DisconnectReplacedElsewhere = Disconnect{marconi.CloseReplaced, "replaced by a newer connection of this session on another instance", "replaced"}
	// DisconnectTokenReplaced closes a connection opened with a token that
	// a resume or a takeover replaced.
	DisconnectTokenReplaced = Disconnect{marconi.CloseReplaced, "session token replaced (resumed or taken over); reconnect with the new token", "replaced"}
	DisconnectSessionGone   = Disconnect{marconi.CloseSessionExpired, "session deregistered or expired; register again", "deregistered"}
	DisconnectDeregistered  = Disconnect{marconi.CloseSessionExpired, "session deregistered", "deregistered"}
	// DisconnectSessionExpired closes a connection whose session's
	// expires_at has passed (the expiry check, expiry.go).
	DisconnectSessionExpired = Disconnect{marconi.CloseSessionExpired, "session expired; register again", "expired"}
	DisconnectSlowConsumer   = Disconnect{marconi.CloseSlowConsumer, "slow consumer: queue full; signals stay durable", "slow_consumer"}
	DisconnectShutdown       = Disconnect{marconi.CloseRestarting, "hub restarting", "shutdown"}
	// DisconnectOperator is the dashboard's disconnect action: 1012, so the
	// client reconnects as after a restart.
	DisconnectOperator = Disconnect{marconi.CloseRestarting, "disconnected by an operator; reconnect", "operator"}
	// DisconnectFrameRate closes a connection whose client sends frames
	// faster than MARCONI_WS_FRAMES_PER_SECOND (burst twice it).
	DisconnectFrameRate = Disconnect{marconi.ClosePolicy, "quota_exceeded: frames_per_second", "quota_exceeded"}
	// DisconnectInvalidUTF8 closes a connection whose client sent a text
	// frame that is not UTF-8 (RFC 6455 §8.1).
	DisconnectInvalidUTF8 = Disconnect{marconi.CloseInvalidPayload, "invalid UTF-8 in a text frame", labelInvalidUTF8}
)

// Labels of disconnects the peer or the network decides.
const (
	labelClientClosed   = "client_closed"
	labelConnectionLost = "connection_lost"
	labelPingTimeout    = "ping_timeout"
	labelMessageTooBig  = "message_too_big"
	labelInvalidUTF8    = "invalid_utf8"
)

// disconnectLabels are every label of marconi_ws_disconnects_total, so that
// each series exists from the start. affinity_reset is kept for dashboards
// that query it.
var disconnectLabels = []string{labelClientClosed, labelConnectionLost, labelPingTimeout, "replaced", "slow_consumer", "deregistered", "shutdown", labelMessageTooBig, "affinity_reset", "quota_exceeded", "operator", labelInvalidUTF8, "expired"}
