// Package marconi holds what every part of the hub shares: the error a client
// may see, with its stable code from docs/api.md. The packages of the house
// are described in DESIGN.md; the wire contract in docs/api.md.
package marconi

import (
	"errors"
	"fmt"
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
	CodeTooManyRequests        = "too_many_requests"
	CodeRegistryUnavailable    = "registry_unavailable"
	CodeDraining               = "draining"
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
