-- Back to jsonb. This fails (and leaves the migration dirty) when a stored
-- payload is one jsonb refuses, such as a string holding \u0000 or a number
-- out of jsonb's range; delete those signals first. Payloads that go through
-- come back re-encoded (key order, duplicate keys, whitespace).
ALTER TABLE signals ALTER COLUMN payload TYPE jsonb USING payload::jsonb;
