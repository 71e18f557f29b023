package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// Postgres error codes Diagnose names.
const (
	codeInvalidPassword   = "28P01"
	codeInvalidAuth       = "28000"
	codeInvalidCatalog    = "3D000" // the database does not exist
	codeUndefinedTable    = "42P01"
	codeInsufficientPrivs = "42501"
)

// Diagnose is the package's Diagnose, as a method so that a consumer that
// knows only sessionstore.Store can ask for it; it names the database's
// address even when err came from a connection already open.
func (s *Store) Diagnose(err error) string {
	cfg := s.pool.Config().ConnConfig
	return diagnose(err, net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port)))
}

// Diagnose says in a few words why err kept the store from Postgres, for an
// operator: "connection refused at db:5432", "authentication failed for user
// marconi", "database marconi does not exist". It never includes a password.
// It returns "" when err is nil, and err's own text when it knows no better.
func Diagnose(err error) string { return diagnose(err, "") }

// diagnose is Diagnose with the address to name when err does not say.
func diagnose(err error, where string) string {
	if err == nil {
		return ""
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Config != nil {
		where = net.JoinHostPort(ce.Config.Host, fmt.Sprint(ce.Config.Port))
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case codeInvalidPassword, codeInvalidAuth:
			if ce != nil {
				return fmt.Sprintf("authentication failed for user %q at %s", ce.Config.User, where)
			}
			return "authentication failed"
		case codeInvalidCatalog:
			if ce != nil {
				return fmt.Sprintf("database %q does not exist at %s", ce.Config.Database, where)
			}
			return "the database does not exist"
		case codeCannotConnectNow:
			return "Postgres is starting up or shutting down"
		case codeTooManyConns:
			return "Postgres has too many connections"
		case codeUndefinedTable:
			return "the schema is not migrated (run marconi migrate up)"
		case codeInsufficientPrivs:
			return "permission denied: " + pgErr.Message
		}
	}
	var dnsErr *net.DNSError
	var netErr net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused at " + orUnknown(where)
	case errors.As(err, &dnsErr):
		return fmt.Sprintf("host %q not found", dnsErr.Name)
	case errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err), errors.As(err, &netErr) && netErr.Timeout():
		return "no answer from " + orUnknown(where) + " in time"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "connection reset by " + orUnknown(where)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed by " + orUnknown(where) + " before Postgres answered"
	}
	if pgErr != nil {
		return fmt.Sprintf("Postgres error %s: %s", pgErr.Code, pgErr.Message)
	}
	return err.Error()
}

func orUnknown(where string) string {
	if where == "" {
		return "the database"
	}
	return where
}
