-- Sessions and API keys: the registry of who may talk to the hub.
CREATE TABLE sessions (
    tenant_id           text        NOT NULL,
    project_id          text        NOT NULL,
    session_id          text        NOT NULL,
    token_hash          bytea       NOT NULL,
    surface             text        NOT NULL DEFAULT '',
    runtime_mode        text        NOT NULL DEFAULT '',
    runtime_mode_source text        NOT NULL DEFAULT '',
    client_id           text        NOT NULL DEFAULT '',
    registered_at       timestamptz NOT NULL,
    last_seen_at        timestamptz,
    last_verb_at        timestamptz,
    expires_at          timestamptz NOT NULL,
    assigned_instance   text        NOT NULL DEFAULT '',
    queue_instance      text        NOT NULL DEFAULT '',
    queue_attached_at   timestamptz,
    queue_detached_at   timestamptz,
    -- last_seq is the last signal seq handed out to this session as recipient.
    last_seq            bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, project_id, session_id),
    CONSTRAINT sessions_token_hash_key UNIQUE (token_hash)
);

CREATE INDEX sessions_expires_at_idx ON sessions (expires_at);

CREATE TABLE api_keys (
    hash       bytea       PRIMARY KEY,
    tenant_id  text        NOT NULL,
    project_id text        NOT NULL,
    created_at timestamptz NOT NULL
);
