-- Back to 0009: the two indexes on acked_at and the idempotency index led
-- by tenant_id and project_id again, 0010's two indexes gone, the default
-- fillfactors. Acknowledgements are then no longer HOT updates. The same
-- lock as 0010's, taken first for the same reason (see there).
LOCK TABLE signals IN ACCESS EXCLUSIVE MODE;

CREATE INDEX signals_unacked_idx ON signals (tenant_id, project_id, to_session, seq)
    WHERE acked_at IS NULL;
CREATE INDEX signals_acked_at_idx ON signals (acked_at) WHERE acked_at IS NOT NULL;
CREATE INDEX signals_idempotency_idx ON signals (tenant_id, project_id, from_session, idempotency_key, created_at)
    WHERE idempotency_key IS NOT NULL;

DROP INDEX signals_sender_key_idx;
DROP INDEX signals_created_at_idx;

ALTER TABLE signals RESET (fillfactor);
ALTER TABLE sessions RESET (fillfactor);
