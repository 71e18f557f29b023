// Package marconi holds what every part of the hub shares: the error a client
// may see, with its stable code from docs/api.md. The packages of the house
// are described in DESIGN.md; the wire contract in docs/api.md.
package marconi

import (
	"errors"
	"fmt"
	"time"
)

// Stable error codes of the wire contract (docs/api.md).
const (
	CodeInvalidJSON            = "invalid_json"
	CodeInvalidField           = "invalid_field"
	CodeInvalidSurface         = "invalid_surface"
	CodeInvalidRuntimeMode     = "invalid_runtime_mode"
	CodeReservedRuntimeMode    = "reserved_runtime_mode"
	CodeUnauthorized           = "unauthorized"
	CodeForbidden              = "forbidden"
	CodeRecipientNotRegistered = "recipient_not_registered"
	CodeNotFound               = "not_found"
	CodeWrongInstance          = "wrong_instance"
	CodeNotAdaptivePlacement   = "not_adaptive_placement"
	CodeSessionExpired         = "session_expired"
	CodePayloadTooLarge        = "payload_too_large"
	CodeRequestTimeout         = "request_timeout"
	CodeTooManyRequests        = "too_many_requests"
	CodeQuotaExceeded          = "quota_exceeded"
	CodeRegistryUnavailable    = "registry_unavailable"
	CodeDraining               = "draining"
	CodeUpgradeRequired        = "upgrade_required"
	// CodeBadRequest, CodeHeadersTooLarge and CodeNotImplemented answer a
	// request net/http refuses before the hub sees it: malformed HTTP (bad
	// header bytes, duplicate Content-Length...), headers past
	// MARCONI_MAX_HEADER_BYTES, a transfer coding it does not know.
	CodeBadRequest      = "bad_request"
	CodeHeadersTooLarge = "headers_too_large"
	CodeNotImplemented  = "not_implemented"
	CodeInternal               = "internal"
)

// Error is an error a client may see: a stable Code and a human-readable
// Message. Anything that is not an *Error is internal and answered as
// "internal" without its text.
type Error struct {
	Code    string
	Message string
	// InstanceID and InstanceURL are set with CodeWrongInstance.
	InstanceID  string
	InstanceURL string
	// Quota names the quota refused, with CodeQuotaExceeded.
	Quota Quota
	// RetryAfter, when positive, is sent as Retry-After (whole seconds,
	// rounded up) with CodeTooManyRequests and CodeQuotaExceeded.
	RetryAfter time.Duration
}

// Error implements error.
func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Errorf returns an *Error with code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the *Error in err's chain, or CodeInternal.
func ErrorCode(err error) string {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Code
	}
	return CodeInternal
}

// Quota names one limit that keeps a single key, project or client from
// taking what every tenant shares (docs/security.md). Its value is the
// label of marconi_quota_refusals_total and is named in the refusal's message.
type Quota string

// The quotas.
const (
	QuotaSessionsPerProject     Quota = "sessions_per_project"
	QuotaPendingPerRecipient    Quota = "pending_per_recipient"
	QuotaPendingBytesPerProject Quota = "pending_bytes_per_project"
	QuotaRegistrationsPerSecond Quota = "registrations_per_second"
	QuotaFramesPerSecond        Quota = "frames_per_second"
	QuotaConnectionsPerAddress  Quota = "connections_per_address"
	QuotaConnectionsTotal       Quota = "connections_total"
	// QuotaHeartbeatsPerSession counts heartbeats answered without a store
	// write: one came from the session less than MARCONI_TOUCH_INTERVAL_SECONDS
	// before (the heartbeat is answered 200; only its write is refused).
	QuotaHeartbeatsPerSession Quota = "heartbeats_per_session"
	// QuotaAttachesPerSession bounds WebSocket attaches per session
	// (MARCONI_QUOTA_ATTACHES_PER_SECOND, burst twice it).
	QuotaAttachesPerSession Quota = "attaches_per_session"
)

// Quotas lists every Quota, so that metrics can export each from start.
var Quotas = []Quota{
	QuotaSessionsPerProject, QuotaPendingPerRecipient, QuotaPendingBytesPerProject,
	QuotaRegistrationsPerSecond, QuotaFramesPerSecond, QuotaConnectionsPerAddress,
	QuotaConnectionsTotal, QuotaHeartbeatsPerSession, QuotaAttachesPerSession,
}

// QuotaExceeded returns the CodeQuotaExceeded error for q. retryAfter is
// zero where waiting does not help (only acknowledging or deregistering does).
func QuotaExceeded(q Quota, retryAfter time.Duration, format string, args ...any) *Error {
	return &Error{
		Code:       CodeQuotaExceeded,
		Message:    fmt.Sprintf("quota %s exceeded: ", q) + fmt.Sprintf(format, args...),
		Quota:      q,
		RetryAfter: retryAfter,
	}
}
