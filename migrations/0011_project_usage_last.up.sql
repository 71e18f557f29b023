-- marconi_settle_usage is the last statement of every group commit that
-- appends (sessionstore/pgstore, append.go): the project counters are locked
-- last, after every sessions row the batch writes, and held only from there
-- to the commit, instead of from the batch's first statement to its commit.
--
-- It locks (creating where missing) the project_usage row of each project of
-- the batch, in order; folds in the bytes that acks, deletes and prunes freed
-- (project_usage_deltas, migration 0005) and the bytes of the batch's own
-- appends (each appended signal is one of ids inserted by this transaction,
-- its bytes at the same place in bytes); and checks each project's
-- pending-bytes limit (the smallest positive one of its appends; 0: none)
-- under the lock. A batch that would take a project past its limit raises
-- SQLSTATE MQ001 with the project's bytes before the batch's appends in
-- DETAIL: the implicit transaction rolls back and the store runs the batch's
-- members again one by one, so that only the append at fault is refused.
--
-- Each statement of a plpgsql function takes a snapshot of its own, so the
-- fold, run once the locks are granted, sees every delta committed before.
CREATE FUNCTION marconi_settle_usage(ids text[], tenants text[], projects text[], bytes bigint[], limits bigint[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    over record;
BEGIN
    INSERT INTO project_usage AS u (tenant_id, project_id)
    SELECT DISTINCT t, p FROM unnest(tenants, projects) AS x(t, p) ORDER BY t, p
    ON CONFLICT (tenant_id, project_id) DO UPDATE SET pending_bytes = u.pending_bytes;

    WITH d AS (
        DELETE FROM project_usage_deltas
        WHERE (tenant_id, project_id) IN (SELECT t, p FROM unnest(tenants, projects) AS x(t, p))
        RETURNING tenant_id, project_id, delta
    ), freed AS (
        SELECT tenant_id AS t, project_id AS p, sum(delta)::bigint AS n FROM d GROUP BY 1, 2
    ), added AS (
        SELECT x.t, x.p, sum(x.n)::bigint AS n, min(x.lim) FILTER (WHERE x.lim > 0) AS lim
        FROM unnest(ids, tenants, projects, bytes, limits) AS x(id, t, p, n, lim)
        WHERE EXISTS (SELECT 1 FROM signals g WHERE g.id = x.id AND g.xmin = pg_current_xact_id()::xid)
        GROUP BY 1, 2
    ), f AS (
        SELECT coalesce(a.t, r.t) AS t, coalesce(a.p, r.p) AS p,
               coalesce(r.n, 0) AS freed, coalesce(a.n, 0) AS added, a.lim
        FROM added a FULL JOIN freed r ON a.t = r.t AND a.p = r.p
    ), u AS (
        UPDATE project_usage u SET pending_bytes = u.pending_bytes + f.freed + f.added
        FROM f WHERE u.tenant_id = f.t AND u.project_id = f.p
        RETURNING u.tenant_id, u.project_id, u.pending_bytes, f.added, f.lim
    )
    SELECT * INTO over FROM u WHERE u.added > 0 AND u.lim IS NOT NULL AND u.pending_bytes > u.lim
    ORDER BY u.tenant_id, u.project_id LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MQ001',
            MESSAGE = format('project %s/%s: %s pending bytes over its limit of %s',
                             over.tenant_id, over.project_id, over.pending_bytes, over.lim),
            DETAIL = (over.pending_bytes - over.added)::text;
    END IF;
END
$$;
