-- The bus key (0008) can be rotated on a live fleet (`marconi buskey rotate`,
-- POST /v1/ops/bus_key/rotate): the row keeps the key before the current
-- one, so that a wake-up sealed by an instance that has not yet re-read the
-- row still opens, and a version each instance reports
-- (marconi_bus_key_version) and the time of the rotation, from which each
-- instance judges, on the database's clock, how long the previous key
-- still opens (MARCONI_BUS_KEY_GRACE_SECONDS). One row still; the key
-- column keeps its meaning, so an instance of a release before this one
-- reads the current key as it did.
ALTER TABLE bus_key
    ADD COLUMN previous bytea CHECK (octet_length(previous) >= 16),
    ADD COLUMN version bigint NOT NULL DEFAULT 1 CHECK (version >= 1),
    ADD COLUMN rotated_at timestamptz NOT NULL DEFAULT now();
