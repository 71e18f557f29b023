package hub

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/hub/conns"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/breaker"
)

// statusByCode is the one table from error code to HTTP status.
var statusByCode = map[marconi.Code]int{
	marconi.CodeInvalidJSON:             http.StatusBadRequest,
	marconi.CodeInvalidField:            http.StatusBadRequest,
	marconi.CodeInvalidSurface:          http.StatusBadRequest,
	marconi.CodeInvalidRuntimeMode:      http.StatusBadRequest,
	marconi.CodeReservedRuntimeMode:     http.StatusBadRequest,
	marconi.CodeUnauthorized:            http.StatusUnauthorized,
	marconi.CodeForbidden:               http.StatusForbidden,
	marconi.CodeRecipientNotRegistered:  http.StatusNotFound,
	marconi.CodeNotFound:                http.StatusNotFound,
	marconi.CodeWrongInstance:           http.StatusConflict,
	marconi.CodeNotAdaptivePlacement:    http.StatusConflict,
	marconi.CodeHistoryChanged:          http.StatusConflict,
	marconi.CodeSessionExpired:          http.StatusGone,
	marconi.CodePayloadTooLarge:         http.StatusRequestEntityTooLarge,
	marconi.CodeRequestTimeout:          http.StatusRequestTimeout,
	marconi.CodeTooManyRequests:         http.StatusTooManyRequests,
	marconi.CodeQuotaExceeded:           http.StatusTooManyRequests,
	marconi.CodeRegistryUnavailable:     http.StatusServiceUnavailable,
	marconi.CodeDraining:                http.StatusServiceUnavailable,
	marconi.CodeUpgradeRequired:         http.StatusUpgradeRequired,
	marconi.CodeBadRequest:              http.StatusBadRequest,
	marconi.CodeHeadersTooLarge:         http.StatusRequestHeaderFieldsTooLarge,
	marconi.CodeNotImplemented:          http.StatusNotImplemented,
	marconi.CodeHTTPVersionNotSupported: http.StatusHTTPVersionNotSupported,
	marconi.CodeInternal:                http.StatusInternalServerError,
}

// statusOf is code's HTTP status; a code missing from the table is a 500.
func statusOf(code marconi.Code) int {
	if status, ok := statusByCode[code]; ok {
		return status
	}
	return http.StatusInternalServerError
}

// errorBody is the wire shape of every error.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code        marconi.Code `json:"code"`
	Message     string       `json:"message"`
	InstanceID  string       `json:"instance_id,omitempty"`
	InstanceURL string       `json:"instance_url,omitempty"`
}

// publicError turns any error into the *marconi.Error a client may see.
// Store unavailability becomes registry_unavailable; anything unknown is
// internal, and its text stays in the log.
func publicError(err error) *marconi.Error {
	if e, ok := errors.AsType[*marconi.Error](err); ok {
		return e
	}
	if qe, ok := errors.AsType[*sessionstore.QuotaError](err); ok {
		return marconi.QuotaExceeded(qe.Quota, 0, "%d of %d in use; acknowledge or deregister to free some", qe.Current, qe.Limit)
	}
	if errors.Is(err, sessionstore.ErrInvalidInput) {
		return marconi.Errorf(marconi.CodeInvalidField, "a field holds a value that cannot be stored (such as a NUL character)")
	}
	if errors.Is(err, sessionstore.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		return marconi.Errorf(marconi.CodeRegistryUnavailable, "the session registry cannot be reached; try again shortly")
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		switch he.Code {
		case http.StatusNotFound, http.StatusMethodNotAllowed:
			return marconi.Errorf(marconi.CodeNotFound, "no such endpoint")
		case http.StatusRequestEntityTooLarge:
			return marconi.Errorf(marconi.CodePayloadTooLarge, "request body too large")
		}
	}
	return marconi.Errorf(marconi.CodeInternal, "internal error")
}

// errorHandler is echo's HTTPErrorHandler: one error shape for every error.
func (s *Server) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	if errors.Is(err, context.Canceled) && c.Request().Context().Err() != nil {
		// The client went away mid-request: nobody reads an answer.
		s.log.Debug("request cancelled by the client", "method", c.Request().Method, "path", c.Path())
		return
	}
	pe := publicError(err)
	// A conflict answered registry_unavailable (an ack whose session kept
	// changing under it) is a refusal to retry, not a store outage.
	outage := pe.Code == marconi.CodeRegistryUnavailable && !errors.Is(err, sessionstore.ErrConflict)
	if outage {
		pe = s.withStoreClass(pe, err)
	}
	if pe.Code == marconi.CodeQuotaExceeded {
		s.QuotaRefused(pe.Quota)
	}
	switch {
	case pe.Code == marconi.CodeInternal:
		s.log.Error("request failed", "method", c.Request().Method, "path", c.Path(), "err", err)
	case outage:
		s.metrics.registryErrors.Inc()
		s.ready.forget() // the next /readyz asks the store again
		s.storeLog(err)("store unavailable", "method", c.Request().Method, "path", c.Path(), "err", err)
	default:
		// The activity log: every refusal at info, by code. Neither the
		// message nor anything logged here carries a secret.
		attrs := []any{"method", c.Request().Method, "route", c.Path(), "status", statusOf(pe.Code), "code", pe.Code, "detail", pe.Message}
		if st := stateOf(c); st != nil && st.hasCaller {
			attrs = append(attrs, keyAttrs(st.caller.Key))
		}
		s.log.Info("request refused", attrs...)
	}
	s.writeError(c, pe)
}

// writeError answers pe in the one error shape, with its status from
// statusByCode and its Retry-After. It logs and counts nothing: errorHandler
// does that for a failed request, and /readyz answers through it directly.
func (s *Server) writeError(c echo.Context, pe *marconi.Error) {
	status := statusOf(pe.Code)
	switch {
	case pe.RetryAfter > 0:
		c.Response().Header().Set(marconi.HeaderRetryAfter, strconv.Itoa(int((pe.RetryAfter+time.Second-1)/time.Second)))
	case pe.Code == marconi.CodeTooManyRequests:
		c.Response().Header().Set(marconi.HeaderRetryAfter, "1")
	}
	body := errorBody{Error: errorDetail{Code: pe.Code, Message: pe.Message, InstanceID: pe.InstanceID, InstanceURL: pe.InstanceURL}}
	var err error
	if c.Request().Method == http.MethodHead {
		err = c.NoContent(status)
	} else {
		err = c.JSON(status, body)
	}
	if err != nil {
		s.log.Debug("writing error response", "err", err)
	}
}

// storeLog is the level to log a store failure at: a call the open store
// breaker refused at once is Debug (the breaker logged the outage when it
// opened and logs its end), anything else Warn.
func (s *Server) storeLog(err error) func(msg string, args ...any) {
	if errors.Is(err, breaker.ErrOpen) {
		return s.log.Debug
	}
	return s.log.Warn
}

// logAttrs is a small helper for structured logs of a session key.
func keyAttrs(k sessionstore.Key) slog.Attr { return conns.KeyAttrs(k) }

// withStoreClass names, in a 503 registry_unavailable that a store error
// caused, the class of that failure ("connection refused", "no answer in
// time"; never the database's address, which only the log, the banner and
// the admin's /readyz carry), so that one answer tells a client or an
// operator what kind of outage it is, the breaker's fast refusals included.
func (s *Server) withStoreClass(pe *marconi.Error, err error) *marconi.Error {
	d, ok := s.store.(storeDiagnoser)
	if !ok {
		return pe
	}
	if _, public := errors.AsType[*marconi.Error](err); public {
		return pe // the hub's own message already
	}
	cause := d.Classify(err)
	if cause == "" {
		return pe
	}
	return marconi.Errorf(marconi.CodeRegistryUnavailable, "the session registry cannot be reached (%s); try again shortly", cause)
}
