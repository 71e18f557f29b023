-- Back to 0011: the foreign key from signals to sessions again, with its
-- ON DELETE CASCADE, in place of the trigger. Adding it reads every signal
-- once to check its recipient, under the same locks as 0012's, taken first
-- for the same reason: sends and acks wait meanwhile, longer the larger
-- the table. It fails, and changes nothing, if a signal names no session
-- (none can, but for one inserted by hand).
LOCK TABLE sessions, signals IN ACCESS EXCLUSIVE MODE;

DROP TRIGGER sessions_delete_signals ON sessions;
DROP FUNCTION marconi_delete_session_signals;

ALTER TABLE signals ADD CONSTRAINT signals_recipient_fkey FOREIGN KEY (tenant_id, project_id, to_session)
    REFERENCES sessions (tenant_id, project_id, session_id) ON DELETE CASCADE;
