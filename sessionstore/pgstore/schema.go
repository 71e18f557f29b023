package pgstore

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SchemaVersion reads the schema version the migrations recorded
// (golang-migrate's schema_migrations table, in the search path) and whether
// the last one failed halfway (dirty). It is 0, false when no migration is
// applied. It lets /readyz tell a schema behind or ahead of the binary from a
// ready one.
func (s *Store) SchemaVersion(ctx context.Context) (version uint, dirty bool, err error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return 0, false, wrap("schema version", err)
	}
	var v int64
	err = s.pool.QueryRow(ctx, `SELECT version, dirty FROM schema_migrations LIMIT 1`).Scan(&v, &dirty)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.Code == codeUndefinedTable:
		return 0, false, nil
	case err != nil:
		return 0, false, wrap("schema version", err)
	}
	return uint(v), dirty, nil
}
