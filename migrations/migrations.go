package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/golang-migrate/migrate/v4"
	// Registers the pgx5:// database driver.
	pgxmigrate "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

//go:embed *.sql
var files embed.FS

// defaultConnectTimeout, in seconds, is added to the URL when it names
// none, so that a migration against an unreachable database fails instead
// of hanging.
const defaultConnectTimeout = 5

// Option changes how Up, Down and Steps run.
type Option func(*options)

type options struct {
	progress func(Migration, Direction)
}

func newOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Direction says whether a migration was applied (Up) or reverted (Down).
type Direction string

// The two directions a step can go.
const (
	DirectionUp   Direction = "up"
	DirectionDown Direction = "down"
)

// WithProgress calls fn after each migration is applied or reverted, so that
// an operator sees every step as it happens.
func WithProgress(fn func(Migration, Direction)) Option {
	return func(o *options) { o.progress = fn }
}

// Up applies every migration not yet applied. It is a no-op when the schema
// is already at the latest version. A schema ahead of this binary (migrated
// by a newer one) is an error that says so.
func Up(ctx context.Context, databaseURL string, opts ...Option) error {
	reporting := newOptions(opts).progress != nil
	return run(ctx, databaseURL, "up", opts, func(m *migrate.Migrate, at uint, step func(int) error) error {
		if at > Latest() {
			return fmt.Errorf("schema version %d is ahead of this binary (it knows up to %d): run the newer binary", at, Latest())
		}
		if !reporting { // one lock and one pass, as the hub does at every start
			if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
				return err
			}
			return nil
		}
		for _, mig := range All() {
			if mig.Version > at {
				if err := step(1); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// Down reverts every applied migration, all the way down.
func Down(ctx context.Context, databaseURL string, opts ...Option) error {
	return stepDown(ctx, databaseURL, "down", -1, opts)
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

// run opens a migrator and runs plan on it from the current version; plan
// moves one migration at a time with step(1) or step(-1), each reported to
// the WithProgress function. ctx is checked before every step: golang-migrate
// takes no context, and its GracefulStop channel races with its own reader
// goroutine (a data race under -race), so a migration in progress runs to its
// end.
func run(ctx context.Context, databaseURL, name string, opts []Option, plan func(m *migrate.Migrate, at uint, step func(int) error) error) (err error) {
	o := newOptions(opts)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("migrations: %s: %w", name, err)
	}
	m, err := open(databaseURL)
	if err != nil {
		return err
	}
	defer closeMigrate(m, &err)

	at, dirty, err := m.Version()
	if errors.Is(err, migrate.ErrNilVersion) {
		at, err = 0, nil
	}
	if err != nil {
		return fmt.Errorf("migrations: %s: version: %w", name, err)
	}
	if dirty {
		return fmt.Errorf("migrations: %s: %w", name, migrate.ErrDirty{Version: int(at)})
	}
	step := func(n int) error {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("stopped: %w", err)
		}
		if err := m.Steps(n); err != nil {
			return err
		}
		done, dir := Migration{Version: at}, DirectionDown
		if n > 0 {
			dir = DirectionUp
		}
		next, _, err := m.Version()
		if errors.Is(err, migrate.ErrNilVersion) {
			next, err = 0, nil
		}
		if err != nil {
			return err
		}
		if dir == DirectionUp {
			done.Version = next
		}
		at = next
		if o.progress != nil {
			o.progress(named(done), dir)
		}
		return nil
	}
	if err := plan(m, at, step); err != nil {
		return fmt.Errorf("migrations: %s: %w", name, err)
	}
	return nil
}

// named fills in the name of the embedded migration of m's version.
func named(m Migration) Migration {
	for _, e := range All() {
		if e.Version == m.Version {
			return e
		}
	}
	return m
}

// urlScheme matches what opens a URL; a keyword/value string (a keyword,
// then "=") never starts so, though a value in it may hold "://".
var urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)

// IsURL reports whether databaseURL is written as a URL (scheme://…)
// rather than as a keyword/value connection string (host=… dbname=…).
func IsURL(databaseURL string) bool { return urlScheme.MatchString(databaseURL) }

// open opens the migrations on databaseURL: a URL (postgres://…) through
// golang-migrate's pgx5:// driver URL, or a keyword/value connection string
// (host=… dbname=…), which that driver cannot parse, through pgx's own
// parser and the driver's WithInstance.
func open(databaseURL string) (*migrate.Migrate, error) {
	if !IsURL(databaseURL) {
		return openKeywordValue(databaseURL)
	}
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

// openKeywordValue is open for a keyword/value connection string, with
// what DriverURL does for a URL: pgxpool's pool_* settings are left out
// (pgxpool.ParseConfig takes them), and a connect timeout is added when
// the string has none.
func openKeywordValue(dsn string) (*migrate.Migrate, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("migrations: malformed database connection string")
	}
	cc := pc.ConnConfig
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = defaultConnectTimeout * time.Second
	}
	src, err := iofs.New(files, ".")
	if err != nil {
		return nil, fmt.Errorf("migrations: source: %w", err)
	}
	db := stdlib.OpenDB(*cc)
	// The driver's migration lock is keyed by the database name as the
	// URL's path ("/name"): the same name here takes the same lock as an
	// instance given the URL form.
	name := ""
	if cc.Database != "" {
		name = "/" + cc.Database
	}
	drv, err := pgxmigrate.WithInstance(db, &pgxmigrate.Config{DatabaseName: name, MultiStatementMaxSize: pgxmigrate.DefaultMultiStatementMaxSize})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("migrations: open database: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", drv)
	if err != nil {
		drv.Close()
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
// runtime parameters, except pgxpool's own pool_* settings (pool_max_conns,
// …): they size the hub's pool, and the driver would send them to the server
// as runtime parameters, which it refuses, so the migration would never run.
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
	for k := range q {
		if strings.HasPrefix(k, "pool_") {
			q.Del(k)
		}
	}
	if q.Get("connect_timeout") == "" {
		q.Set("connect_timeout", strconv.Itoa(defaultConnectTimeout))
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Steps applies n migrations up (n > 0) or reverts -n of them (n < 0).
// Reverting more than are applied fails and changes nothing.
func Steps(ctx context.Context, databaseURL string, n int, opts ...Option) error {
	if n < 0 {
		return stepDown(ctx, databaseURL, "steps", -n, opts)
	}
	return run(ctx, databaseURL, "steps", opts, func(_ *migrate.Migrate, _ uint, step func(int) error) error {
		for range n {
			if err := step(1); err != nil {
				return err
			}
		}
		return nil
	})
}

// stepDown reverts n migrations, or all of them when n is -1.
func stepDown(ctx context.Context, databaseURL, name string, n int, opts []Option) error {
	return run(ctx, databaseURL, name, opts, func(_ *migrate.Migrate, at uint, step func(int) error) error {
		applied := 0
		for _, mig := range All() {
			if mig.Version <= at {
				applied++
			}
		}
		if n == -1 {
			n = applied
		}
		if n > applied {
			return fmt.Errorf("cannot step back %d: only %d applied", n, applied)
		}
		for range n {
			if err := step(-1); err != nil {
				return err
			}
		}
		return nil
	})
}
