-- Durable signals, one sequence per recipient (sessions.last_seq).
CREATE TABLE signals (
    tenant_id       text        NOT NULL,
    project_id      text        NOT NULL,
    to_session      text        NOT NULL,
    seq             bigint      NOT NULL,
    id              text        NOT NULL,
    from_session    text        NOT NULL,
    kind            text        NOT NULL DEFAULT '',
    payload         jsonb,
    created_at      timestamptz NOT NULL,
    -- idempotency_key is NULL when the sender gave none.
    idempotency_key text,
    delivery        text        NOT NULL DEFAULT '',
    route_state     text        NOT NULL DEFAULT '',
    acked_at        timestamptz,
    PRIMARY KEY (tenant_id, project_id, to_session, seq),
    CONSTRAINT signals_id_key UNIQUE (id),
    CONSTRAINT signals_recipient_fkey FOREIGN KEY (tenant_id, project_id, to_session)
        REFERENCES sessions (tenant_id, project_id, session_id) ON DELETE CASCADE
);

-- Pending (unacknowledged) signals of one recipient, in seq order.
CREATE INDEX signals_unacked_idx ON signals (tenant_id, project_id, to_session, seq)
    WHERE acked_at IS NULL;

-- Idempotency lookups: same sender, same key, within the window.
CREATE INDEX signals_idempotency_idx ON signals (tenant_id, project_id, from_session, idempotency_key, created_at)
    WHERE idempotency_key IS NOT NULL;

-- Prune of acknowledged signals.
CREATE INDEX signals_acked_at_idx ON signals (acked_at) WHERE acked_at IS NOT NULL;
