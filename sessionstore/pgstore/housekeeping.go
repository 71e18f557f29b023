package pgstore

import (
	"context"
	"fmt"
)

// AutovacuumWarning says what is wrong when the server does not vacuum the
// store's tables by itself, and "" when it does or when it cannot tell.
// Every send and acknowledgement leaves dead row versions, and without
// autovacuum they pile up until each statement that walks them is slower
// (docs/operations.md, "Postgres housekeeping"): the hub says so at start
// rather than let an operator find it in a latency graph.
func (s *Store) AutovacuumWarning(ctx context.Context) string {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return ""
	}
	var on string
	if err := s.pool.QueryRow(ctx, `SELECT current_setting('autovacuum')`).Scan(&on); err != nil || on == "on" {
		return ""
	}
	return fmt.Sprintf("autovacuum is %s on this Postgres: the dead rows every send and acknowledgement leave will pile up and slow the store until someone runs VACUUM (docs/operations.md, \"Postgres housekeeping\")", on)
}
