-- lookup: retry information a program can read (own role only, no lock,
-- no write); IK002's DETAIL in ISO 8601 UTC whatever the session settings.
\i sql/include/roles.sql
\set VERBOSITY default
CREATE FUNCTION look(k text, s text DEFAULT '')
RETURNS TABLE (status text, attempts int, has_times boolean, locked boolean,
               retry_after int) LANGUAGE sql AS $$
  SELECT status, attempts,
         created_at IS NOT NULL AND updated_at >= created_at AND expires_at > now(),
         locked_until IS NOT NULL, retry_after
    FROM idempotency.lookup(k, s) $$;

-- unknown: no row
SELECT * FROM look('lookup-none');
-- completed: finished, so no retry_after
SELECT outcome FROM idempotency.once('lookup-1', NULL, 'SELECT 1 AS n');
SELECT * FROM look('lookup-1');
-- the row as stored
SELECT l.created_at = k.created_at AND l.updated_at = k.updated_at AND
       l.expires_at = k.expires_at AS same_times
  FROM idempotency.lookup('lookup-1') l, idempotency.idempotency_key k
 WHERE k.key = 'lookup-1';
-- scopes are separate
BEGIN;
SELECT outcome FROM idempotency.begin('lookup-1', scope => 'orders');
SELECT idempotency.fail('lookup-1', '{"e": 1}', 'orders');
COMMIT;
SELECT * FROM look('lookup-1', 'orders');
-- failed for good: finished
BEGIN;
SELECT outcome FROM idempotency.begin('lookup-2');
SELECT idempotency.fail('lookup-2', '{"e": 2}', retryable => false);
COMMIT;
SELECT * FROM look('lookup-2');
-- under a live lease: seconds until it ends
SELECT outcome FROM idempotency.begin('lookup-3', lease => '1 hour');
SELECT status, attempts, locked, retry_after BETWEEN 3590 AND 3600 AS about_an_hour
  FROM look('lookup-3');
-- a lapsed lease: a retry can go now
SELECT outcome FROM idempotency.begin('lookup-4', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT * FROM look('lookup-4');
-- expired: no row
BEGIN;
SELECT outcome FROM idempotency.begin('lookup-5', ttl => '10 ms');
SELECT idempotency.complete('lookup-5', '{}');
COMMIT;
SELECT pg_sleep(0.05);
SELECT * FROM look('lookup-5');
-- another role's key: no row (and its own is separate)
SET ROLE regress_bob;
SELECT * FROM look('lookup-1');
SELECT outcome FROM idempotency.once('lookup-1', NULL, 'SELECT 2 AS n');
SELECT * FROM look('lookup-1');
RESET ROLE;
-- no write, no key lock, in a read-only transaction too
BEGIN READ ONLY;
SELECT * FROM look('lookup-1');
SELECT * FROM look('lookup-3');
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
SELECT count(*) AS key_locks FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 18756 AND pid = pg_backend_pid();
COMMIT;
-- invalid keys: IK003, as begin()
SELECT * FROM idempotency.lookup('');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.lookup(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.lookup('x', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.lookup(repeat('x', 300));
\echo :LAST_ERROR_SQLSTATE

-- IK002 under a lease: the DETAIL gives the lease end in ISO 8601 UTC and
-- the seconds to wait, whatever DateStyle and TimeZone say
SET DateStyle = 'SQL, DMY';
SET TimeZone = 'Asia/Kathmandu';
SET idempotency.lock_wait = 0;
CREATE FUNCTION ik002_detail(k text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE d text; s text;
BEGIN
  PERFORM idempotency.begin(k, lease => '1 hour');
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL, s = RETURNED_SQLSTATE;
  RETURN s || ' ' || d;
END $$;
SELECT ik002_detail('lookup-3') AS detail \gset
SELECT :'detail' ~ '^IK002 Attempt 1 holds it until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ; retry after \d+ seconds\.$'
       AS iso_detail;
-- the time is the lease end, rounded up to the second
SELECT substring(:'detail' from 'until (\S+);')::timestamptz =
       date_trunc('second', k.locked_until) +
         CASE WHEN k.locked_until = date_trunc('second', k.locked_until) THEN '0' ELSE '1 second' END::interval
       AS detail_is_lease_end,
       substring(:'detail' from 'after (\d+) seconds')::int BETWEEN l.retry_after AND l.retry_after + 1
         AS same_as_lookup
  FROM idempotency.idempotency_key k, idempotency.lookup('lookup-3') l
 WHERE k.key = 'lookup-3';
RESET DateStyle;
RESET TimeZone;
RESET idempotency.lock_wait;
