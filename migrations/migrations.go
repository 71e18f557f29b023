package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"net/url"

	"github.com/golang-migrate/migrate/v4"
	// Registers the pgx5:// database driver.
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
)

//go:embed *.sql
var files embed.FS

// defaultConnectTimeout is added to the URL when it names none, so that a
// migration against an unreachable database fails instead of hanging.
const defaultConnectTimeout = "5"

// Up applies every migration not yet applied. It is a no-op when the schema
// is already at the latest version.
func Up(ctx context.Context, databaseURL string) error {
	return run(ctx, databaseURL, "up", (*migrate.Migrate).Up)
}

// Down reverts every applied migration, all the way down.
func Down(ctx context.Context, databaseURL string) error {
	return run(ctx, databaseURL, "down", (*migrate.Migrate).Down)
}

// Version reports the current schema version and whether the last migration
// failed halfway (dirty). It is 0, false when no migration is applied.
func Version(databaseURL string) (version uint, dirty bool, err error) {
	m, err := open(databaseURL)
	if err != nil {
		return 0, false, err
	}
	defer closeMigrate(m, &err)
	version, dirty, err = m.Version()
	if errors.Is(err, migrate.ErrNilVersion) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("migrations: version: %w", err)
	}
	return version, dirty, nil
}

// run opens a migrator and runs step on it. ctx is checked before and after:
// golang-migrate takes no context, and its GracefulStop channel races with
// its own reader goroutine (a data race under -race), so a migration in
// progress runs to its end.
func run(ctx context.Context, databaseURL, name string, step func(*migrate.Migrate) error) (err error) {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("migrations: %s: %w", name, err)
	}
	m, err := open(databaseURL)
	if err != nil {
		return err
	}
	defer closeMigrate(m, &err)

	err = step(m)
	if errors.Is(err, migrate.ErrNoChange) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("migrations: %s: %w", name, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("migrations: %s stopped: %w", name, err)
	}
	return nil
}

func open(databaseURL string) (*migrate.Migrate, error) {
	u, err := DriverURL(databaseURL)
	if err != nil {
		return nil, err
	}
	src, err := iofs.New(files, ".")
	if err != nil {
		return nil, fmt.Errorf("migrations: source: %w", err)
	}
	m, err := migrate.NewWithSourceInstance("iofs", src, u)
	if err != nil {
		return nil, fmt.Errorf("migrations: open database: %w", err)
	}
	return m, nil
}

func closeMigrate(m *migrate.Migrate, err *error) {
	srcErr, dbErr := m.Close()
	if *err == nil {
		if cerr := errors.Join(srcErr, dbErr); cerr != nil {
			*err = fmt.Errorf("migrations: close: %w", cerr)
		}
	}
}

// DriverURL turns a postgres:// or postgresql:// URL into the pgx5:// URL
// golang-migrate's pgx v5 driver wants, adding a connect timeout when the URL
// has none. Query parameters such as search_path pass through to pgx as
// runtime parameters.
func DriverURL(databaseURL string) (string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return "", errors.New("migrations: malformed database URL")
	}
	switch u.Scheme {
	case "postgres", "postgresql", "pgx5":
	default:
		return "", fmt.Errorf("migrations: database URL scheme %q: want postgres://", u.Scheme)
	}
	u.Scheme = "pgx5"
	q := u.Query()
	if q.Get("connect_timeout") == "" {
		q.Set("connect_timeout", defaultConnectTimeout)
		u.RawQuery = q.Encode()
	}
	return u.String(), nil
}

// Steps applies n migrations up (n > 0) or reverts -n of them (n < 0).
// Reverting more than are applied fails and changes nothing.
func Steps(ctx context.Context, databaseURL string, n int) error {
	if n < 0 {
		v, _, err := Version(databaseURL)
		if err != nil {
			return err
		}
		if uint(-n) > v {
			return fmt.Errorf("migrations: cannot step back %d: only %d applied", -n, v)
		}
	}
	return run(ctx, databaseURL, "steps", func(m *migrate.Migrate) error { return m.Steps(n) })
}
