-- The current key stays; the previous one, the version and the time of the
-- last rotation go.
ALTER TABLE bus_key DROP COLUMN previous, DROP COLUMN version, DROP COLUMN rotated_at;
