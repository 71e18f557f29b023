-- The settle's read of a batch's own signals (marconi_settle_usage, 0011;
-- marconi_settle_leased, 0015) finds each by id, through signals_id_key,
-- whatever plan Postgres keeps for it. A plpgsql function's statements are
-- prepared once per connection, planned for their arguments at their first
-- five runs and then, when it looks no dearer, generically, from the
-- statistics of that moment, for the connection's life: made while the
-- signals table was small (a fresh database's first batches), that plan
-- joined the batch's ids to a walk of every signal (signals_id_key read
-- whole, each row's xmin compared), at every batch, however large the table
-- grew. OFFSET 0 keeps the EXISTS a lookup of each id (Postgres does not
-- turn it into a join), as the store's own statements keep theirs
-- (sessionstore/pgstore, appendSQL). Nothing else changes.
CREATE OR REPLACE FUNCTION marconi_settle_usage(ids text[], tenants text[], projects text[], bytes bigint[], limits bigint[])
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
        WHERE EXISTS (SELECT 1 FROM signals g WHERE g.id = x.id AND g.xmin = pg_current_xact_id()::xid OFFSET 0)
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

CREATE OR REPLACE FUNCTION marconi_settle_leased(lane text, chunk bigint, ids text[], tenants text[], projects text[], bytes bigint[], limits bigint[])
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
        WHERE EXISTS (SELECT 1 FROM signals g WHERE g.id = x.id AND g.xmin = pg_current_xact_id()::xid OFFSET 0)
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
