-- A binary from before 0016 prunes an acknowledged signal by its acked_at,
-- which acknowledgements no longer set: mark every signal at or below its
-- session's acked_seq, as that binary's ack would have, and drop the
-- payloads kept with them, so that its retention loop finds them.
UPDATE signals g SET acked_at = now(), payload = NULL
FROM sessions e
WHERE g.tenant_id = e.tenant_id AND g.project_id = e.project_id AND g.to_session = e.session_id
  AND g.seq <= e.acked_seq AND g.acked_at IS NULL;
COMMENT ON COLUMN sessions.acked_seq IS NULL;
COMMENT ON COLUMN signals.acked_at IS NULL;
