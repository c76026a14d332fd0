-- citus: the Citus set-up step on a server without Citus.  The
-- Citus suite itself is test/citus/run (a coordinator and two workers).
\set VERBOSITY default
-- a clear error, 55000, and nothing changes
SELECT idempotency.distribute();
\set VERBOSITY sqlstate
SELECT idempotency.distribute();
\set VERBOSITY default
SELECT count(*) AS policies FROM pg_policies WHERE schemaname = 'idempotency';
SELECT has_table_privilege('public', 'idempotency.idempotency_key', 'INSERT') AS public_may_insert;
-- plain roles may not call it
CREATE ROLE citus_plain;
SET ROLE citus_plain;
SELECT idempotency.distribute();
RESET ROLE;
DROP ROLE citus_plain;
-- without Citus the key table takes the fast path: once() works as before
SELECT outcome FROM idempotency.once('citus-1', '{}', 'SELECT 1 AS one');
SELECT outcome FROM idempotency.once('citus-1', '{}', 'SELECT 1 AS one');
SELECT idempotency.forget('citus-1');
