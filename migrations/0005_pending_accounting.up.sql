-- Pending accounting for the store-side quotas and the one-statement append.
--
-- Acknowledgements are cumulative (every ack acknowledges all signals up to a
-- seq), so a recipient's pending signals are exactly those with
-- seq > acked_seq: their count is last_seq - acked_seq, read from the row the
-- append locks anyway. pending_bytes is the payload bytes of those signals.
-- project_usage keeps the same bytes summed per project. Only appends lock
-- and write its row (once per group commit); what frees bytes (acks, deletes,
-- prunes) inserts a negative delta into project_usage_deltas instead, which
-- the next append folds in, so acks never wait on a project-wide lock.
--
-- queue_latest_attach is the attach time of the newest SetQueue, kept after
-- the queue detaches, so that a late SetQueue of an older attach is refused.
ALTER TABLE sessions
    ADD COLUMN acked_seq           bigint NOT NULL DEFAULT 0,
    ADD COLUMN pending_bytes       bigint NOT NULL DEFAULT 0,
    ADD COLUMN queue_latest_attach timestamptz;

UPDATE sessions s SET
    queue_latest_attach = queue_attached_at,
    acked_seq = coalesce((SELECT min(g.seq) - 1 FROM signals g
                          WHERE g.tenant_id = s.tenant_id AND g.project_id = s.project_id
                            AND g.to_session = s.session_id AND g.acked_at IS NULL), s.last_seq),
    pending_bytes = coalesce((SELECT sum(coalesce(octet_length(g.payload::text), 0)) FROM signals g
                              WHERE g.tenant_id = s.tenant_id AND g.project_id = s.project_id
                                AND g.to_session = s.session_id AND g.acked_at IS NULL), 0);

CREATE TABLE project_usage (
    tenant_id     text   NOT NULL,
    project_id    text   NOT NULL,
    pending_bytes bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, project_id)
);

INSERT INTO project_usage (tenant_id, project_id, pending_bytes)
SELECT tenant_id, project_id, sum(pending_bytes) FROM sessions GROUP BY tenant_id, project_id;

CREATE TABLE project_usage_deltas (
    tenant_id  text   NOT NULL,
    project_id text   NOT NULL,
    delta      bigint NOT NULL
);

CREATE INDEX project_usage_deltas_project_idx ON project_usage_deltas (tenant_id, project_id);
