-- Quota leases: a group commit that appends no longer locks its projects'
-- project_usage rows at every batch (0011), which held every batch of a
-- project, on every instance, in series behind the one committing.
--
-- A lease is bytes of a project's pending-bytes room that one batch lane
-- (holder: an instance's id and the lane's number, sessionstore/pgstore)
-- took from project_usage ahead of its appends. project_usage.pending_bytes
-- counts the leased bytes as used, so the limit holds whatever the leases:
-- the bytes stored are pending_bytes, plus the unfolded deltas, minus every
-- lease. A batch whose lane's lease covers its appends takes them from the
-- lease, under that lease row's lock only, which no other lane takes but to
-- reclaim it (below); only a batch whose lease runs short locks the project
-- row, folds the deltas in and takes a new lease.
--
-- A batch that would pass the limit first reclaims the leases of the other
-- holders that no running transaction holds (FOR UPDATE SKIP LOCKED: it
-- never waits for one), deleting their rows; only the leases of batches
-- running at that moment stay out of reach. So a project is refused at
-- most the unused part of those running batches' leases below its limit,
-- never above it.
CREATE TABLE project_leases (
    tenant_id  text   NOT NULL,
    project_id text   NOT NULL,
    holder     text   NOT NULL,
    bytes      bigint NOT NULL DEFAULT 0 CHECK (bytes >= 0),
    PRIMARY KEY (tenant_id, project_id, holder)
);

-- marconi_settle_leased is marconi_settle_usage (0011) with leases: the
-- last statement of a group commit that appends, run by the lane whose
-- leases are held as lane, taking leases of chunk bytes. Projects are
-- settled in order, each by locking the lane's lease row first and the
-- project row only when the lease is short: every batch takes its locks in
-- one order (lease, then project, one project after another), and the
-- reclaim skips what is locked, so batches cannot deadlock on them. It
-- raises MQ001 as marconi_settle_usage does, its DETAIL the project's
-- stored bytes before the batch's appends.
CREATE FUNCTION marconi_settle_leased(lane text, chunk bigint, ids text[], tenants text[], projects text[], bytes bigint[], limits bigint[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    a record;
    have bigint;
    used bigint;
    grant_ bigint;
    others bigint;
BEGIN
    FOR a IN
        SELECT x.t, x.p, sum(x.n)::bigint AS n, min(x.lim) FILTER (WHERE x.lim > 0) AS lim
        FROM unnest(ids, tenants, projects, bytes, limits) AS x(id, t, p, n, lim)
        WHERE EXISTS (SELECT 1 FROM signals g WHERE g.id = x.id AND g.xmin = pg_current_xact_id()::xid)
        GROUP BY 1, 2 ORDER BY 1, 2
    LOOP
        -- The short way, one statement: the lease covers the appends, and
        -- the counter (every lease counted as used) is within this batch's
        -- limit (a limit lowered since the lease was taken goes the long
        -- way).
        UPDATE project_leases l SET bytes = l.bytes - a.n
        WHERE l.tenant_id = a.t AND l.project_id = a.p AND l.holder = lane AND l.bytes >= a.n
          AND (a.lim IS NULL OR (SELECT u.pending_bytes FROM project_usage u
                                 WHERE u.tenant_id = a.t AND u.project_id = a.p) <= a.lim);
        IF FOUND THEN
            CONTINUE;
        END IF;

        -- The long way: the lane's lease locked (made if missing), then,
        -- under the project's lock, the freed bytes folded in and the
        -- lease given back; used is then the bytes stored plus the other
        -- lanes' leases.
        INSERT INTO project_leases AS l (tenant_id, project_id, holder) VALUES (a.t, a.p, lane)
        ON CONFLICT (tenant_id, project_id, holder) DO UPDATE SET bytes = l.bytes
        RETURNING l.bytes INTO have;
        INSERT INTO project_usage AS u (tenant_id, project_id) VALUES (a.t, a.p)
        ON CONFLICT (tenant_id, project_id) DO UPDATE SET pending_bytes = u.pending_bytes
        RETURNING u.pending_bytes INTO used;
        WITH d AS (
            DELETE FROM project_usage_deltas WHERE tenant_id = a.t AND project_id = a.p RETURNING delta
        )
        SELECT used + coalesce(sum(delta), 0) - have INTO used FROM d;

        IF a.lim IS NOT NULL AND used + a.n > a.lim THEN
            -- Reclaim the leases no running batch holds (their rows go).
            WITH free AS (
                SELECT l.holder FROM project_leases l
                WHERE l.tenant_id = a.t AND l.project_id = a.p AND l.holder <> lane
                FOR UPDATE SKIP LOCKED
            ), gone AS (
                DELETE FROM project_leases l USING free
                WHERE l.tenant_id = a.t AND l.project_id = a.p AND l.holder = free.holder
                RETURNING l.bytes
            )
            SELECT used - coalesce(sum(gone.bytes), 0) INTO used FROM gone;
            IF used + a.n > a.lim THEN
                SELECT coalesce(sum(l.bytes), 0) INTO others FROM project_leases l
                WHERE l.tenant_id = a.t AND l.project_id = a.p AND l.holder <> lane;
                RAISE EXCEPTION USING ERRCODE = 'MQ001',
                    MESSAGE = format('project %s/%s: %s pending bytes over its limit of %s',
                                     a.t, a.p, used - others + a.n, a.lim),
                    DETAIL = (used - others)::text;
            END IF;
        END IF;

        grant_ := greatest(a.n, CASE WHEN a.lim IS NULL THEN chunk ELSE least(chunk, a.lim - used) END);
        UPDATE project_usage SET pending_bytes = used + grant_ WHERE tenant_id = a.t AND project_id = a.p;
        UPDATE project_leases SET bytes = grant_ - a.n
        WHERE tenant_id = a.t AND project_id = a.p AND holder = lane;
    END LOOP;
END
$$;
