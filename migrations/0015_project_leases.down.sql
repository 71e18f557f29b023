-- Every lease goes back to its project's counter, as if its holder had
-- never taken it; then the leases go.
UPDATE project_usage u SET pending_bytes = u.pending_bytes - l.bytes
FROM (SELECT tenant_id, project_id, sum(bytes) AS bytes FROM project_leases GROUP BY 1, 2) l
WHERE u.tenant_id = l.tenant_id AND u.project_id = l.project_id;
DROP FUNCTION marconi_settle_leased;
DROP TABLE project_leases;
