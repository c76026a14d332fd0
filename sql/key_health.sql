-- key_health: a monitoring role (pg_monitor, or pg_read_all_stats alone)
-- sees per role and scope the keys by status, the oldest in progress, the
-- leases past their end and the purge backlog, without any key, request
-- fingerprint or response; other roles may not call it (42501) and read
-- their own keys in the table.  Ages are checked against bounds, not printed.
CREATE ROLE regress_kh_app NOLOGIN;
CREATE ROLE regress_kh_other NOLOGIN;
CREATE ROLE regress_kh_monitor NOLOGIN IN ROLE pg_monitor;
CREATE ROLE regress_kh_stats NOLOGIN IN ROLE pg_read_all_stats;
CREATE ROLE regress_kh_reader NOLOGIN;
CREATE ROLE regress_kh_gone NOLOGIN;
GRANT SELECT ON idempotency.key_health TO regress_kh_reader;  -- the view without EXECUTE

SET ROLE regress_kh_app;
BEGIN;
SELECT outcome FROM idempotency.begin('kh-done', '{"n": 1}', 'kh-pay');
SELECT idempotency.complete('kh-done', '{"secret": "response-1"}', 'kh-pay');
SELECT outcome FROM idempotency.begin('kh-final', '{}', 'kh-pay');
SELECT idempotency.fail('kh-final', '{"error": "declined"}', 'kh-pay', retryable => false);
SELECT outcome FROM idempotency.begin('kh-again', '{}', 'kh-pay');
SELECT idempotency.fail('kh-again', '{"error": "timeout"}', 'kh-pay');
SELECT outcome FROM idempotency.begin('kh-old', '{}', 'kh-ship');
SELECT idempotency.complete('kh-old', '{}', 'kh-ship');
COMMIT;
SELECT outcome FROM idempotency.begin('kh-lease', '{}', 'kh-pay', lease => '1 hour');
SELECT outcome FROM idempotency.begin('kh-stuck', '{}', 'kh-pay', lease => '1 hour');
SET ROLE regress_kh_other;
SELECT outcome FROM idempotency.begin('kh-other', '{}', 'kh-pay', lease => '1 hour');
RESET ROLE;
-- a lease that ended two hours ago and a key that expired an hour ago,
-- without waiting (as the superuser, who may write the table)
UPDATE idempotency.idempotency_key SET locked_until = now() - interval '2 hours'
 WHERE key = 'kh-stuck';
UPDATE idempotency.idempotency_key SET expires_at = now() - interval '1 hour'
 WHERE key = 'kh-old';

-- the monitoring role: every role's figures; no row of the table itself
SET ROLE regress_kh_monitor;
SELECT role, scope, in_progress, completed, failed_retryable, failed_final,
       oldest_in_progress_age BETWEEN '0' AND '1 hour' AS young_in_progress,
       lapsed_leases, longest_lapse BETWEEN '2 hours' AND '3 hours' AS lapsed_two_hours,
       expired, oldest_expired_age BETWEEN '1 hour' AND '2 hours' AS expired_an_hour
  FROM idempotency.key_health
 WHERE role LIKE 'regress_kh%' ORDER BY role, scope;
SELECT count(*) AS key_rows_seen FROM idempotency.idempotency_key WHERE key LIKE 'kh-%';
-- the stuck-lease alert of docs/operations.md
SELECT count(*) FROM idempotency.key_health WHERE longest_lapse > interval '1 hour';
-- pg_read_all_stats alone is enough
SET ROLE regress_kh_stats;
SELECT sum(in_progress) AS in_progress, sum(lapsed_leases) AS lapsed
  FROM idempotency.key_health() WHERE scope LIKE 'kh-%';
RESET ROLE;

-- what it shows: counts, ages, the role and the scope, never a key,
-- fingerprint or response
SELECT string_agg(attname, ', ' ORDER BY attnum) AS columns
  FROM pg_attribute WHERE attrelid = 'idempotency.key_health'::regclass AND attnum > 0;

-- an application role may not call it: 42501, and reads its own keys
\set VERBOSITY terse
SET ROLE regress_kh_app;
SELECT * FROM idempotency.key_health;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.key_health();
\echo :LAST_ERROR_SQLSTATE
-- "list my keys" (docs/operations.md): the role's own keys by state and age
SELECT scope, status, count(*) AS keys
  FROM idempotency.idempotency_key
 WHERE expires_at > now()
 GROUP BY scope, status ORDER BY scope, status;
SELECT scope, key, attempts, locked_until <= now() AS lapsed
  FROM idempotency.idempotency_key
 WHERE status = 'in_progress' AND expires_at > now()
 ORDER BY created_at, key LIMIT 50;
-- the view without EXECUTE on its function: 42501 as well
SET ROLE regress_kh_reader;
SELECT count(*) FROM idempotency.key_health;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
\set VERBOSITY default

-- after the owner's purge() the backlog is gone
SET ROLE regress_kh_app;
SELECT idempotency.purge() AS purged;
RESET ROLE;
SELECT sum(expired) AS expired FROM idempotency.key_health WHERE scope LIKE 'kh-%';

-- a dropped role's rows: role NULL, userid its old oid; no role's purge()
-- removes them (each purges its own), a superuser's DELETE does
SET ROLE regress_kh_gone;
SELECT outcome FROM idempotency.begin('kh-gone', '{}', 'kh-gone', lease => '1 hour');
RESET ROLE;
SELECT oid AS gone_oid FROM pg_roles WHERE rolname = 'regress_kh_gone' \gset
DROP ROLE regress_kh_gone;
UPDATE idempotency.idempotency_key SET expires_at = now() - interval '1 hour' WHERE key = 'kh-gone';
SELECT role IS NULL AS no_role, userid = :gone_oid AS old_oid, expired
  FROM idempotency.key_health WHERE scope = 'kh-gone';
SELECT idempotency.purge() AS purged;
SET ROLE regress_kh_app;
SELECT idempotency.purge() AS purged;
RESET ROLE;
SELECT sum(expired) AS still_expired FROM idempotency.key_health WHERE scope = 'kh-gone';
DELETE FROM idempotency.idempotency_key WHERE owner = :gone_oid::oid AND expires_at <= now();
SELECT count(*) AS rows_left FROM idempotency.key_health WHERE scope = 'kh-gone';

DELETE FROM idempotency.idempotency_key WHERE key LIKE 'kh-%';
DROP ROLE regress_kh_app, regress_kh_other, regress_kh_monitor, regress_kh_stats;
REVOKE SELECT ON idempotency.key_health FROM regress_kh_reader;
DROP ROLE regress_kh_reader;
