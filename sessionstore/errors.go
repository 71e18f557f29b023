package sessionstore

import (
	"errors"
	"fmt"

	"github.com/marconihub/marconi"
)

// ErrNotFound is returned when the row asked for does not exist or is no
// longer live (an expired session counts as absent).
var ErrNotFound = errors.New("sessionstore: not found")

// ErrConflict is returned when a write would break uniqueness: a live session
// with the same key already exists, or an API key hash is already stored.
var ErrConflict = errors.New("sessionstore: conflict")

// ErrTokenMismatch is returned when a presented token hash is not the
// session's current one (ResumeSession, AppendSignal's sender check,
// AckSignalsAs).
var ErrTokenMismatch = errors.New("sessionstore: token mismatch")

// ErrRecipientChanged is returned by AppendSignal when the live recipient
// is no longer what NewSignal.Seen says (registered again, resumed or taken
// over, its queue attached, detached or moved). Nothing was stored: the caller reads the
// recipient again and classifies the send anew.
var ErrRecipientChanged = errors.New("sessionstore: recipient changed")

// ErrHistoryChanged is returned by AckSignalsAs when the holder's
// History is older than the store's (Historian): the seqs it acknowledges
// were read before the store's data went back in time, and may now name
// signals the holder never received. Nothing was acknowledged; the holder
// is caught up again and acknowledges what it then receives.
var ErrHistoryChanged = errors.New("sessionstore: the store's history changed since the acknowledged signals were read")

// ErrUnavailable is returned when the store cannot be reached (connection
// refused, timed out, closed). Callers fail closed on it: they answer 503 and
// never fall back to process memory.
var ErrUnavailable = errors.New("sessionstore: unavailable")

// ErrInvalidInput is returned when the backing store refuses a value as data
// it cannot hold (in Postgres, SQLSTATE class 22: a NUL byte in text, an
// invalid byte sequence, a value too long). It is the caller's input that is
// wrong: the hub answers 400 invalid_field. Nothing was stored.
var ErrInvalidInput = errors.New("sessionstore: invalid input")

// ErrQuotaExceeded is matched (errors.Is) by every *QuotaError: a write that a
// quota enforced inside the store refused. Nothing was stored.
var ErrQuotaExceeded = errors.New("sessionstore: quota exceeded")

// QuotaError is returned when a quota that the store enforces atomically with
// a write (pending signals per recipient, pending bytes per project) refuses
// it. Nothing was stored.
type QuotaError struct {
	Quota marconi.Quota
	// Limit is the quota's configured value; Current what was already used.
	Limit, Current int64
}

// Error implements error.
func (e *QuotaError) Error() string {
	return fmt.Sprintf("sessionstore: quota %s exceeded (%d of %d)", e.Quota, e.Current, e.Limit)
}

// Is makes errors.Is(err, ErrQuotaExceeded) true.
func (e *QuotaError) Is(target error) bool { return target == ErrQuotaExceeded }
