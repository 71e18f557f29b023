-- Each instance's heartbeat writes the version of the bus key it seals
-- with (0013), so that the fabric summary shows, after a rotation, which
-- instances have picked the new key up. NULL is unknown: an instance that
-- has not read the key yet, or one of a release before this one, whose
-- heartbeat names its columns and leaves this one alone. Nullable without
-- a default, so adding it rewrites nothing.
ALTER TABLE instances ADD COLUMN bus_key_version bigint CHECK (bus_key_version >= 1);
