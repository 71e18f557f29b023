package sessionstore

import "errors"

// ErrNotFound is returned when the row asked for does not exist or is no
// longer live (an expired session counts as absent).
var ErrNotFound = errors.New("sessionstore: not found")

// ErrConflict is returned when a write would break uniqueness: a live session
// with the same key already exists, or an API key hash is already stored.
var ErrConflict = errors.New("sessionstore: conflict")

// ErrTokenMismatch is returned by ResumeSession when the presented token hash
// is not the session's current one.
var ErrTokenMismatch = errors.New("sessionstore: token mismatch")

// ErrUnavailable is returned when the store cannot be reached (connection
// refused, timed out, closed). Callers fail closed on it: they answer 503 and
// never fall back to process memory.
var ErrUnavailable = errors.New("sessionstore: unavailable")
