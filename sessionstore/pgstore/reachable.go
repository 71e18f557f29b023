package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Reachable reports whether Postgres answers at all, even while every pooled
// connection is busy: through the pool when it can serve at once, else on a
// connection of its own, opened and closed here. Ping would wait for a pooled
// connection, so a store merely slow (the pool held by calls that run out of
// time) would pass for one that is gone. It returns ErrUnavailable when
// Postgres cannot be reached or does not answer in time.
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
	return wrap("reachable", conn.Ping(ctx))
}
