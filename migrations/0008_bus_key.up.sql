-- The key that authenticates the signals a wake-up carries between hub
-- instances (LISTEN/NOTIFY): any role that can connect may NOTIFY, but only
-- the hub's role reads this table, so a carried signal whose MAC checks out
-- came from a hub. One row, made once with strong randomness.
CREATE TABLE bus_key (
    id  smallint PRIMARY KEY CHECK (id = 1),
    key bytea NOT NULL CHECK (octet_length(key) >= 16)
);
INSERT INTO bus_key (id, key)
VALUES (1, decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'));
REVOKE ALL ON bus_key FROM PUBLIC;
