// Package marconi is the wire vocabulary that the hub and its Go client
// share: error codes and the error a client may see, close codes, frame
// types, header names, surfaces, route states, deliveries, self-heal
// outcomes and modes, each declared once (docs/api.md is the contract they
// spell). It holds plain words and no server code, so the client can import
// it; docs/architecture.md describes the packages around it.
package marconi

import (
	"errors"
	"fmt"
	"time"
)

// Code is the stable code of an error answered to a client (the code field
// of the {"error": {...}} body, and of an error frame).
type Code string

// Stable error codes of the wire contract (docs/api.md).
const (
	CodeInvalidJSON            Code = "invalid_json"
	CodeInvalidField           Code = "invalid_field"
	CodeInvalidSurface         Code = "invalid_surface"
	CodeInvalidRuntimeMode     Code = "invalid_runtime_mode"
	CodeReservedRuntimeMode    Code = "reserved_runtime_mode"
	CodeUnauthorized           Code = "unauthorized"
	CodeForbidden              Code = "forbidden"
	CodeRecipientNotRegistered Code = "recipient_not_registered"
	CodeNotFound               Code = "not_found"
	CodeWrongInstance          Code = "wrong_instance"
	CodeNotAdaptivePlacement   Code = "not_adaptive_placement"
	CodeSessionExpired         Code = "session_expired"
	CodePayloadTooLarge        Code = "payload_too_large"
	CodeRequestTimeout         Code = "request_timeout"
	CodeTooManyRequests        Code = "too_many_requests"
	CodeQuotaExceeded          Code = "quota_exceeded"
	CodeRegistryUnavailable    Code = "registry_unavailable"
	CodeDraining               Code = "draining"
	CodeUpgradeRequired        Code = "upgrade_required"
	CodeInternal               Code = "internal"
	// CodeBadRequest, CodeHeadersTooLarge, CodeNotImplemented and
	// CodeHTTPVersionNotSupported answer a request net/http refuses before
	// the hub sees it: malformed HTTP (bad header bytes, duplicate
	// Content-Length...), headers past MARCONI_MAX_HEADER_BYTES, a transfer
	// coding it does not know, a protocol version it does not speak
	// ("HTTP/0.9", "HTTP/2.0" on an HTTP/1 connection).
	CodeBadRequest              Code = "bad_request"
	CodeHeadersTooLarge         Code = "headers_too_large"
	CodeNotImplemented          Code = "not_implemented"
	CodeHTTPVersionNotSupported Code = "http_version_not_supported"
	// CodeHistoryChanged refuses an ack made under another history of the
	// store than its current one (a standby promoted since): its seqs may
	// name signals the client never received. Nothing is acknowledged;
	// drain again (docs/api.md).
	CodeHistoryChanged Code = "history_changed"
)

// Codes lists every Code, in the order of docs/api.md's table.
var Codes = []Code{
	CodeInvalidJSON, CodeInvalidField, CodeInvalidSurface, CodeInvalidRuntimeMode,
	CodeReservedRuntimeMode, CodeUnauthorized, CodeForbidden, CodeRecipientNotRegistered,
	CodeNotFound, CodeWrongInstance, CodeNotAdaptivePlacement, CodeHistoryChanged, CodeSessionExpired,
	CodePayloadTooLarge, CodeRequestTimeout, CodeTooManyRequests, CodeQuotaExceeded,
	CodeRegistryUnavailable, CodeDraining, CodeUpgradeRequired, CodeInternal,
	CodeBadRequest, CodeHeadersTooLarge, CodeNotImplemented, CodeHTTPVersionNotSupported,
}

// Error is an error a client may see: a stable Code and a human-readable
// Message. Anything that is not an *Error is internal and answered as
// "internal" without its text.
type Error struct {
	Code    Code
	Message string
	// InstanceID and InstanceURL are set with CodeWrongInstance.
	InstanceID  string
	InstanceURL string
	// Quota names the quota refused, with CodeQuotaExceeded.
	Quota Quota
	// RetryAfter, when positive, is sent as Retry-After (whole seconds,
	// rounded up): with CodeTooManyRequests, CodeQuotaExceeded, and
	// CodeRegistryUnavailable when it answers a transient conflict.
	RetryAfter time.Duration
}

// Error implements error.
func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Errorf returns an *Error with code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the *Error in err's chain, or CodeInternal.
func ErrorCode(err error) Code {
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
