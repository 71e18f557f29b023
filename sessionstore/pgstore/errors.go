package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/marconihub/marconi/sessionstore"
)

// Postgres error codes and classes this package maps.
const (
	codeUniqueViolation  = "23505"
	classDataException   = "22" // data_exception: NUL in text, bad encoding, value too long
	classConnection      = "08" // connection_exception
	codeAdminShutdown    = "57P01"
	codeCrashShutdown    = "57P02"
	codeCannotConnectNow = "57P03"
	codeTooManyConns     = "53300"
	codeQueryCanceled    = "57014" // statement_timeout or a cancel request after a deadline
	codeDeadlock         = "40P01" // deadlock_detected: this transaction was the one aborted
	// codeReadOnly is read_only_sql_transaction: a write reached a standby,
	// or a primary being demoted. The store is not writable here now.
	codeReadOnly = "25006"
)

// wrap turns err into the store's error for operation op: a sessionstore
// sentinel where one applies (ErrNotFound, ErrConflict, ErrUnavailable), the
// cause kept visible with %w. The text names the operation, never SQL.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, sessionstore.ErrNotFound),
		errors.Is(err, sessionstore.ErrConflict),
		errors.Is(err, sessionstore.ErrTokenMismatch),
		errors.Is(err, sessionstore.ErrUnavailable),
		errors.Is(err, sessionstore.ErrInvalidInput),
		errors.Is(err, sessionstore.ErrQuotaExceeded):
		return fmt.Errorf("pgstore: %s: %w", op, err)
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("pgstore: %s: %w", op, sessionstore.ErrNotFound)
	case isConflict(err):
		return fmt.Errorf("pgstore: %s: %w: %w", op, sessionstore.ErrConflict, err)
	case isDataException(err):
		return fmt.Errorf("pgstore: %s: %w: %w", op, sessionstore.ErrInvalidInput, err)
	case isUnavailable(err):
		return fmt.Errorf("pgstore: %s: %w: %w", op, sessionstore.ErrUnavailable, err)
	}
	return fmt.Errorf("pgstore: %s: %w", op, err)
}

func isConflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == codeUniqueViolation
}

// isDataException reports whether Postgres refused a value as data it cannot
// hold (SQLSTATE class 22): the caller's input, not the store, is at fault.
func isDataException(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && len(pgErr.Code) == 5 && pgErr.Code[:2] == classDataException
}

// isUnavailable reports whether err means Postgres could not be reached, did
// not answer in time, or cannot take writes (a standby, or a server in the
// middle of a failover): the cases where the hub fails closed.
func isUnavailable(err error) bool {
	// Any failure to connect, whatever the server said (too many clients,
	// starting up, a bad password), leaves the store unreachable.
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case len(pgErr.Code) == 5 && pgErr.Code[:2] == classConnection,
			pgErr.Code == codeAdminShutdown, pgErr.Code == codeCrashShutdown,
			pgErr.Code == codeCannotConnectNow, pgErr.Code == codeTooManyConns,
			pgErr.Code == codeQueryCanceled, pgErr.Code == codeReadOnly:
			return true
		}
		return false
	}
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded),
		pgconn.Timeout(err),
		errors.Is(err, puddle.ErrClosedPool),
		errors.Is(err, net.ErrClosed),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE),
		errors.Is(err, pgconn.ErrConnClosed),
		errors.Is(err, errReadOnlyServer),
		errors.As(err, &netErr):
		return true
	}
	return false
}
