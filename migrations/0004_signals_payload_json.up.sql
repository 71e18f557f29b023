-- Payloads are kept as the exact text the sender gave. jsonb parsed and
-- re-encoded them: it expanded tiny payloads enormously on read
-- ([1e131071] reads back as 131074 bytes), refused valid JSON holding
-- \u0000 (SQLSTATE 22P05), and rewrote key order, duplicate keys and
-- whitespace, so a replay differed from the live push of the same signal.
-- json checks the syntax and stores the text verbatim.
--
-- The type change rewrites the table under an ACCESS EXCLUSIVE lock; on a
-- large signals table, prune it first.
ALTER TABLE signals ALTER COLUMN payload TYPE json USING payload::json;
