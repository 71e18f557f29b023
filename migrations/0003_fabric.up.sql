-- The fabric: hub instances, fallback events and cluster-wide counters.
CREATE TABLE instances (
    id                text        PRIMARY KEY,
    url               text        NOT NULL DEFAULT '',
    draining          boolean     NOT NULL DEFAULT false,
    started_at        timestamptz NOT NULL,
    last_heartbeat_at timestamptz NOT NULL
);

CREATE TABLE fallback_events (
    id                  bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id           text        NOT NULL,
    project_id          text        NOT NULL,
    session_id          text        NOT NULL,
    from_instance       text        NOT NULL DEFAULT '',
    to_instance         text        NOT NULL DEFAULT '',
    runtime_mode        text        NOT NULL DEFAULT '',
    runtime_mode_source text        NOT NULL DEFAULT '',
    reason              text        NOT NULL DEFAULT '',
    at                  timestamptz NOT NULL
);

CREATE INDEX fallback_events_at_idx ON fallback_events (at DESC, id DESC);

CREATE TABLE counters (
    name  text   PRIMARY KEY,
    value bigint NOT NULL DEFAULT 0
);
