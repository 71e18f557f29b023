-- An acknowledgement no longer marks its signals: a signal is acknowledged
-- by its session's acked_seq alone (every read of pending signals is
-- bounded by it, and the retention loop deletes the signals at or below it
-- once they were made more than MARCONI_RETAIN_ACKED_SECONDS ago). An ack
-- writes a signal only to drop a payload larger than
-- MARCONI_RETAIN_ACKED_PAYLOAD_BYTES; acked_at is no longer set.
--
-- Nothing in the tables changes; this step says so in the schema, and its
-- down step marks what a binary from before it needs to find acknowledged
-- signals by (docs/operations.md, "Migration 0016"). COMMENT takes a SHARE
-- UPDATE EXCLUSIVE lock, which sends, acks and reads do not wait for.
COMMENT ON COLUMN sessions.acked_seq IS
    'the highest acknowledged seq: the session''s signals at or below it are acknowledged (migration 0016)';
COMMENT ON COLUMN signals.acked_at IS
    'set by binaries before migration 0016 only; a signal is acknowledged when its seq is at or below its session''s acked_seq';
