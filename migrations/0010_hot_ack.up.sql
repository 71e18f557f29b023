-- An acknowledgement is a HOT update: no index depends on acked_at (or on
-- payload, which the ack drops), so marking a signal acknowledged rewrites
-- its row in its own page and touches no index, where it used to add an
-- entry to every index of signals (9 WAL records an ack).
--
-- signals_unacked_idx goes: every read of pending signals is bounded below
-- by sessions.acked_seq and reads the primary key (tenant_id, project_id,
-- to_session, seq). signals_acked_at_idx goes: Prune finds acknowledged
-- signals through created_at (a signal is acknowledged after it is made).
--
-- The fillfactors keep room in each page for the new versions that HOT
-- updates write beside the old ones: a signal is rewritten once (its ack),
-- a session's row at every append and every ack to it. They apply to pages
-- filled from now on; existing full pages get their room back as they are
-- pruned and vacuumed. docs/operations.md, "Migration 0010", says what an
-- operator must know: this file runs as one transaction, and holds an
-- ACCESS EXCLUSIVE lock on signals from its start to its end.
--
-- That lock is taken first, and at once: built under CREATE INDEX's SHARE
-- lock, the indexes let reads go on, but the DROP INDEX after them then
-- upgrades to ACCESS EXCLUSIVE, and an append or an ack that had taken its
-- ACCESS SHARE lock (its read of signals) and waits for ROW EXCLUSIVE (its
-- write) behind the SHARE lock deadlocks with it: Postgres aborts the
-- migration. No lock_timeout: a migration that gave up would leave the
-- schema marked dirty, which every hub, old or new, answers with 503.
--
-- IF NOT EXISTS: on a large table an operator builds the two new indexes
-- beforehand with CREATE INDEX CONCURRENTLY (the statements are in
-- docs/operations.md, "Migration 0010"), while the hubs run; the lock is
-- then held only for the drops and the settings, an instant.
LOCK TABLE signals IN ACCESS EXCLUSIVE MODE;

CREATE INDEX IF NOT EXISTS signals_created_at_idx ON signals (created_at);

-- The append's idempotency lookup, on a key the primary key cannot serve
-- (sessionstore/pgstore/append.go, appendSQL). signals_idempotency_idx was
-- led by tenant_id and project_id, as the primary key is, and lost to it in
-- generic plans made without statistics, which then walked every signal of
-- the project at every append.
CREATE INDEX IF NOT EXISTS signals_sender_key_idx ON signals (from_session, idempotency_key, created_at)
    WHERE idempotency_key IS NOT NULL;

DROP INDEX signals_unacked_idx;
DROP INDEX signals_acked_at_idx;
DROP INDEX signals_idempotency_idx;

ALTER TABLE signals SET (fillfactor = 55);
ALTER TABLE sessions SET (fillfactor = 50);
