DROP TABLE project_usage_deltas;
DROP TABLE project_usage;
ALTER TABLE sessions DROP COLUMN acked_seq, DROP COLUMN pending_bytes, DROP COLUMN queue_latest_attach;
