-- A signal's insert no longer checks its recipient through a foreign key:
-- the append (sessionstore/pgstore, append.go) inserts a signal only with
-- the seq that its own UPDATE of the recipient's sessions row returned, so
-- the row exists, is live and is locked by the inserting transaction; the
-- foreign key's check repeated that, at every append, as a query of its own
-- (a probe of sessions_pkey, a share lock on the row, written to the WAL).
--
-- What the foreign key did on delete stays: a session's signals go with it.
-- An AFTER DELETE trigger on sessions deletes them, in the deleting
-- statement, as ON DELETE CASCADE did: every path that deletes a session
-- (the hub's, an older hub's during a rolling deploy, an operator's)
-- still leaves no signal behind. The trigger's statement takes its own
-- snapshot once the sessions row is locked and deleted, so it sees every
-- append that committed before; no later append can store a signal for the
-- row (its UPDATE finds the row gone and inserts nothing).
--
-- docs/operations.md, "Migration 0012", says what it locks: both tables,
-- ACCESS EXCLUSIVE, taken first and at once; nothing is rebuilt or scanned,
-- so the lock is held for an instant once granted.
LOCK TABLE sessions, signals IN ACCESS EXCLUSIVE MODE;

CREATE FUNCTION marconi_delete_session_signals() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM signals
    WHERE tenant_id = OLD.tenant_id AND project_id = OLD.project_id AND to_session = OLD.session_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER sessions_delete_signals AFTER DELETE ON sessions
    FOR EACH ROW EXECUTE FUNCTION marconi_delete_session_signals();

ALTER TABLE signals DROP CONSTRAINT IF EXISTS signals_recipient_fkey;
