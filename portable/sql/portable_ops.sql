-- portable_ops: forget() and renew() in the portable edition, the cases of
-- the C edition's stats.sql without its counters (the portable edition has
-- no shared-memory statistics): each outcome, each error path with its
-- SQLSTATE, and that a refused call wrote nothing.
\set VERBOSITY terse
SET ROLE regress_alice;

-- leases: renew() extends one, and moves expires_at with it
SELECT outcome, attempts FROM idempotency.begin('job', scope => 'jobs', lease => '1 hour', ttl => '1 minute');
SELECT idempotency.renew('job', '2 hours', 1, 'jobs') AS new_end \gset
SELECT locked_until = :'new_end' AS lease_is_new_end, expires_at >= locked_until AS expiry_follows,
       locked_until > now() + '90 minutes' AS longer
  FROM idempotency.idempotency_key WHERE key = 'job';
SELECT locked_until AS before_end, expires_at AS before_exp, attempts AS before_attempts
  FROM idempotency.idempotency_key WHERE key = 'job' \gset
-- renew() of an attempt that does not hold the key: IK004, nothing written
SELECT idempotency.renew('job', '3 hours', 2, 'jobs');
\echo :LAST_ERROR_SQLSTATE
-- a lease that is not positive: 22023; NULL attempt or lease: 22004
SELECT idempotency.renew('job', '0 s', 1, 'jobs');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.renew('job', '1 hour', NULL, 'jobs');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.renew('job', NULL, 1, 'jobs');
\echo :LAST_ERROR_SQLSTATE
-- a NULL key or scope, an empty key: IK003
SELECT idempotency.renew(NULL, '1 hour', 1, 'jobs');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.renew('job', '1 hour', 1, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.renew('', '1 hour', 1, 'jobs');
\echo :LAST_ERROR_SQLSTATE
-- a read-only transaction: 25006
BEGIN READ ONLY;
SELECT idempotency.renew('job', '3 hours', 1, 'jobs');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- an unknown key, another scope: IK004
SELECT idempotency.renew('nothing', '1 hour', 1, 'jobs');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.renew('job', '1 hour', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT locked_until = :'before_end' AS lease_unchanged, expires_at = :'before_exp' AS expiry_unchanged,
       attempts = :before_attempts AS attempts_unchanged, status
  FROM idempotency.idempotency_key WHERE key = 'job';

-- a lapsed lease taken over: the first attempt's renew() and complete() are refused
SELECT outcome, attempts FROM idempotency.begin('job2', scope => 'jobs', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT outcome, attempts FROM idempotency.begin('job2', scope => 'jobs', lease => '1 hour');
SELECT idempotency.renew('job2', '1 hour', 1, 'jobs');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.complete('job2', '"attempt 2"', 'jobs', attempt => 2);
-- renew() of a finished lease: IK004, the outcome stays
SELECT idempotency.renew('job2', '1 hour', 2, 'jobs');
\echo :LAST_ERROR_SQLSTATE
SELECT status, response, locked_until FROM idempotency.idempotency_key WHERE key = 'job2';
-- renew() in the transaction that began the lease
BEGIN;
SELECT outcome FROM idempotency.begin('job3', scope => 'jobs', lease => '1 minute');
SELECT idempotency.renew('job3', '1 hour', 1, 'jobs') > now() + '50 minutes' AS renewed;
COMMIT;

-- forget(): a key failed for good is cleared, and the next begin() is new
BEGIN;
SELECT outcome FROM idempotency.begin('k2', scope => 'pay');
SELECT idempotency.fail('k2', '{"e": 2}', 'pay', retryable => false);
COMMIT;
SELECT idempotency.forget('k2', 'pay');
SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'k2';
BEGIN;
SELECT outcome, attempts FROM idempotency.begin('k2', scope => 'pay');
ROLLBACK;
-- nothing there: false; a key in the wrong scope is another key
BEGIN;
SELECT outcome FROM idempotency.begin('k1', scope => 'pay');
SELECT idempotency.complete('k1', '{"paid": 1}', 'pay');
COMMIT;
SELECT idempotency.forget('nothing', 'pay');
SELECT idempotency.forget('k1');
-- a NULL key or scope, an empty key: IK003
SELECT idempotency.forget(NULL, 'pay');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.forget('k1', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.forget('', 'pay');
\echo :LAST_ERROR_SQLSTATE
-- in flight: under a live lease, or begun by this transaction: IK002
SELECT idempotency.forget('job', 'jobs');
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SELECT outcome FROM idempotency.begin('k5', scope => 'pay');
SELECT idempotency.forget('k5', 'pay');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN;
SELECT outcome FROM idempotency.begin('k7', scope => 'pay', lease => '1 hour');
SELECT idempotency.forget('k7', 'pay');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- a read-only transaction: 25006
BEGIN READ ONLY;
SELECT idempotency.forget('k1', 'pay');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- none of the refused calls deleted anything
SELECT key, status FROM idempotency.idempotency_key WHERE key IN ('k1', 'job', 'k5', 'k7') ORDER BY key;
-- a key this transaction completed may be forgotten in it
BEGIN;
SELECT outcome FROM idempotency.begin('k6', scope => 'pay');
SELECT idempotency.complete('k6', '{}', 'pay');
SELECT idempotency.forget('k6', 'pay');
SELECT outcome FROM idempotency.begin('k6', scope => 'pay');
SELECT idempotency.complete('k6', '{"again": true}', 'pay');
COMMIT;
SELECT status, response FROM idempotency.idempotency_key WHERE key = 'k6';
-- an expired key: false (the purge takes it)
BEGIN;
SELECT outcome FROM idempotency.begin('k8', scope => 'pay', ttl => '1 ms');
SELECT idempotency.complete('k8', '{}', 'pay');
COMMIT;
SELECT pg_sleep(0.01);
SELECT idempotency.forget('k8', 'pay');
SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'k8';

-- another role sees none of these keys: forget() is false, renew() IK004
SET ROLE regress_bob;
SELECT idempotency.forget('k1', 'pay');
SELECT idempotency.renew('job', '1 hour', 1, 'jobs');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT owner, key, status FROM idempotency.idempotency_key WHERE key IN ('k1', 'job') ORDER BY key;
DELETE FROM idempotency.idempotency_key WHERE scope IN ('pay', 'jobs');
