-- test/privileges/probe.sql: run every probe as one caller, each in its own
-- transaction (try() undoes it), into matrix.result.  psql -v caller=NAME,
-- in a session of the caller's role (priv_NAME, or as matrix.login says);
-- for caller revoked a session of the cluster's superuser, and
-- try_revoked() revokes the object from PUBLIC, probes as priv_revoked and
-- undoes both.
\set ON_ERROR_STOP 1
SELECT format('INSERT INTO matrix.result (caller, object, action, outcome) VALUES (%L, %L, %L, %s)',
              :'caller', p.object, p.action,
              CASE WHEN :'caller' = 'revoked'
                   THEN format('matrix.try_revoked(%L, %L)', p.object, p.sql)
                   ELSE format('matrix.try(%L)', p.sql) END)
  FROM matrix.probe AS p
 WHERE p.sql IS NOT NULL
   -- (what the extension has: the portable edition has not everything)
   AND p.object IN (SELECT m.object FROM matrix.members() AS m)
 ORDER BY p.n
\gexec
