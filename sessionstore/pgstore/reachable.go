package pgstore

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// errReadOnlyServer is a server that answers but takes no writes: a
// standby, or a primary being demoted (transaction_read_only is on). For
// the hub the store is unavailable there.
var errReadOnlyServer = errors.New("the server is read-only")

// rowQuerier is what writable needs of a pool or a connection.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// writable answers like a ping, and fails with errReadOnlyServer when the
// server would refuse a write: a hub whose URL leads to a standby is not
// ready, though the standby answers.
func writable(ctx context.Context, q rowQuerier) error {
	var readOnly string
	if err := q.QueryRow(ctx, "SHOW transaction_read_only").Scan(&readOnly); err != nil {
		return err
	}
	if readOnly == "on" {
		return errReadOnlyServer
	}
	return nil
}

// Reachable reports whether Postgres answers at all, even while every pooled
// connection is busy: through the pool when it can serve at once, else on a
// connection of its own, opened and closed here. Ping would wait for a pooled
// connection, so a store merely slow (the pool held by calls that run out of
// time) would pass for one that is gone. It returns ErrUnavailable when
// Postgres cannot be reached, does not answer in time, or is read-only.
func (s *Store) Reachable(ctx context.Context) error {
	st := s.pool.Stat()
	if st.IdleConns() > 0 || st.TotalConns() < st.MaxConns() {
		return s.Ping(ctx)
	}
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return wrap("reachable", err)
	}
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return wrap("reachable", err)
	}
	defer conn.Close(ctx) // ctx ended: the socket is closed without waiting
	return wrap("reachable", writable(ctx, conn))
}
