package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
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
	_, detail := diagnose(err, s.addr())
	return detail
}

// Classify is the package's Classify, as a method (see Diagnose).
func (s *Store) Classify(err error) string {
	class, _ := diagnose(err, s.addr())
	return class
}

// addr is the database's host:port, or every host:port of a multi-host
// URL, comma-separated.
func (s *Store) addr() string {
	return hostsOf(s.pool.Config().ConnConfig.Config)
}

// hostsOf is cfg's host:port and those of its fallbacks, comma-separated.
func hostsOf(cfg pgconn.Config) string {
	hosts := []string{net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))}
	for _, fb := range cfg.Fallbacks {
		if h := net.JoinHostPort(fb.Host, fmt.Sprint(fb.Port)); !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return strings.Join(hosts, ",")
}

// Diagnose says in a few words why err kept the store from Postgres, for an
// operator: "connection refused at db:5432", "authentication failed for user
// marconi", "database marconi does not exist". It never includes a password.
// It returns "" when err is nil, and err's own text when it knows no better.
func Diagnose(err error) string {
	_, detail := diagnose(err, "")
	return detail
}

// Classify is Diagnose for anyone: the class of failure ("connection
// refused", "authentication failed") without the database's address, user,
// name or any text of err's own, for answers that anyone who can reach the
// hub may read. It returns "" when err is nil.
func Classify(err error) string {
	class, _ := diagnose(err, "")
	return class
}

// diagnose returns Classify's class and Diagnose's detail of err, with the
// address to name when err does not say.
func diagnose(err error, where string) (class, detail string) {
	if err == nil {
		return "", ""
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Config != nil {
		where = hostsOf(*ce.Config)
	}
	at := " at " + orUnknown(where)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case codeInvalidPassword, codeInvalidAuth:
			if ce != nil {
				return "authentication failed", fmt.Sprintf("authentication failed for user %q at %s", ce.Config.User, where)
			}
			return "authentication failed", "authentication failed"
		case codeInvalidCatalog:
			if ce != nil {
				return "the database does not exist", fmt.Sprintf("database %q does not exist at %s", ce.Config.Database, where)
			}
			return "the database does not exist", "the database does not exist"
		case codeCannotConnectNow:
			return same("Postgres is starting up or shutting down")
		case codeTooManyConns:
			return same("Postgres has too many connections")
		case codeUndefinedTable:
			return same("the schema is not migrated (run marconi migrate up)")
		case codeInsufficientPrivs:
			return "permission denied", "permission denied: " + pgErr.Message
		case codeReadOnly:
			return readOnly(where, pgErr.Message)
		}
	}
	if errors.Is(err, errReadOnlyServer) {
		return readOnly(where, "transaction_read_only is on")
	}
	if errors.Is(err, pgconn.ErrReadOnlyConnection) {
		// target_session_attrs=read-write found servers, all of them read-only.
		return "no read-write server (only standbys answer: a failover under way?)",
			"no server of " + orUnknown(where) + " takes writes (only standbys answer: a failover under way?)"
	}
	var dnsErr *net.DNSError
	var netErr net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused", "connection refused" + at
	case errors.As(err, &dnsErr):
		return "database host not found", fmt.Sprintf("host %q not found", dnsErr.Name)
	case errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err), errors.As(err, &netErr) && netErr.Timeout():
		return "no answer in time", "no answer from " + orUnknown(where) + " in time"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "connection reset", "connection reset by " + orUnknown(where)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed before Postgres answered", "connection closed by " + orUnknown(where) + " before Postgres answered"
	}
	if pgErr != nil {
		return "Postgres error " + pgErr.Code, fmt.Sprintf("Postgres error %s: %s", pgErr.Code, pgErr.Message)
	}
	return "unclassified; the hub's log says why", err.Error()
}

// readOnly is the class and detail of a server that refuses writes.
func readOnly(where, why string) (class, detail string) {
	return "Postgres is read-only (a standby, or a failover under way)",
		"Postgres at " + orUnknown(where) + " is read-only (a standby, or a failover under way): " + why
}

// same is a class that is its own detail: it names nothing private.
func same(s string) (class, detail string) { return s, s }

func orUnknown(where string) string {
	if where == "" {
		return "the database"
	}
	return where
}
