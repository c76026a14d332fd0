-- test/privileges/pooled.sql: every caller's probes in ONE session of the
-- cluster's superuser, switching with SET ROLE between callers, as a
-- connection pool that sets the role per request does; into matrix.result.
-- What a caller gets must not depend on the session's earlier roles (the
-- extension's per-session caches: plans, topics, the owner).
\set ON_ERROR_STOP 1
SELECT x.sql
  FROM (SELECT c.i, 0 AS n,
               CASE WHEN c.name = 'revoked' THEN 'RESET ROLE'
                    ELSE format('SET ROLE %I', coalesce(l.role, 'priv_' || c.name)) END AS sql
          FROM matrix.caller AS c
          LEFT JOIN matrix.login AS l ON l.caller = c.name
        UNION ALL
        SELECT c.i, p.n,
               format('INSERT INTO matrix.result (caller, object, action, outcome) VALUES (%L, %L, %L, %s)',
                      c.name, p.object, p.action,
                      CASE WHEN c.name = 'revoked'
                           THEN format('matrix.try_revoked(%L, %L)', p.object, p.sql)
                           ELSE format('matrix.try(%L)', p.sql) END)
          FROM matrix.caller AS c
         CROSS JOIN matrix.probe AS p
         WHERE p.sql IS NOT NULL
           -- (what the extension has: the portable edition has not everything)
           AND p.object IN (SELECT m.object FROM matrix.members() AS m)) AS x
 ORDER BY x.i, x.n
\gexec
RESET ROLE;
