-- stats: the counters of idempotency.stats after a scripted sequence (the
-- test cluster has the library in shared_preload_libraries), who sees
-- which rows, stats_reset(); forget() and renew() on own and other roles'
-- keys.  Waits, log_waits, eviction, restarts and the unpreloaded library
-- are in test/t/005_stats.pl.
CREATE ROLE regress_stats_a NOLOGIN;
CREATE ROLE regress_stats_b NOLOGIN;
GRANT CREATE ON SCHEMA public TO regress_stats_a;

SELECT idempotency.stats_reset();
SELECT count(*) AS entries FROM idempotency.stats;

-- the counters of this database, by role and scope
CREATE VIEW counters AS
SELECT role, scope, begin_new AS new, begin_retry AS retry, begin_replay AS replay,
       completed AS done, failed_retryable AS fail_r, failed_final AS fail_f,
       ik001_reused AS ik001, ik002_in_progress AS ik002, ik004_not_held AS ik004,
       waits, lease_takeovers AS takeover, zombies_refused AS zombie,
       purged, forgotten AS forgot, renewed AS renew
  FROM idempotency.stats
 WHERE database = current_database()
 ORDER BY role, scope;
GRANT SELECT ON counters TO PUBLIC;

SET ROLE regress_stats_a;
\set VERBOSITY terse

-- new, then complete; replay; IK001
BEGIN;
SELECT outcome FROM idempotency.begin('k1', '{"a": 1}', 'pay');
SELECT idempotency.complete('k1', '{"paid": 1}', 'pay');
COMMIT;
SELECT outcome, response FROM idempotency.begin('k1', '{"a": 1}', 'pay');
SELECT outcome FROM idempotency.begin('k1', '{"a": 2}', 'pay');
\echo :LAST_ERROR_SQLSTATE
-- new, failed retryably; retry, failed for good; its failure replayed
BEGIN;
SELECT outcome FROM idempotency.begin('k2', scope => 'pay');
SELECT idempotency.fail('k2', '{"e": 1}', 'pay');
COMMIT;
BEGIN;
SELECT outcome FROM idempotency.begin('k2', scope => 'pay');
SELECT idempotency.fail('k2', '{"e": 2}', 'pay', retryable => false);
COMMIT;
SELECT outcome, status, response FROM idempotency.begin('k2', scope => 'pay');
-- IK004: complete() of a key not held
SELECT idempotency.complete('k3', '{}', 'pay');
\echo :LAST_ERROR_SQLSTATE
-- IK002: begun twice in one transaction (the rolled-back new still counts)
BEGIN;
SELECT outcome FROM idempotency.begin('k4', scope => 'pay');
SELECT outcome FROM idempotency.begin('k4', scope => 'pay');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT * FROM counters;

-- leases, in scope jobs: IK002 inside the lease; renew() extends it
SELECT outcome, attempts FROM idempotency.begin('job', scope => 'jobs', lease => '1 hour');
SELECT outcome FROM idempotency.begin('job', scope => 'jobs', lease => '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT locked_until AS old_end FROM idempotency.idempotency_key WHERE key = 'job' \gset
SELECT idempotency.renew('job', '2 hours', 1, 'jobs') AS new_end \gset
SELECT :'new_end'::timestamptz > now() + '119 minutes' AS two_hours_from_now,
       locked_until = :'new_end' AS stored, expires_at >= locked_until AS expiry_covers_lease,
       status, attempts
  FROM idempotency.idempotency_key WHERE key = 'job';
-- renew() of an attempt that does not hold the key: IK004, nothing written
SELECT idempotency.renew('job', '3 hours', 2, 'jobs');
\echo :LAST_ERROR_SQLSTATE
SELECT locked_until = :'new_end' AS unchanged FROM idempotency.idempotency_key WHERE key = 'job';
-- arguments: a lease that is not positive, a NULL attempt
SELECT idempotency.renew('job', '0 s', 1, 'jobs');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.renew('job', '1 hour', NULL, 'jobs');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.renew('job', NULL, 1, 'jobs');
\echo :LAST_ERROR_SQLSTATE
-- a read-only transaction: 25006, the lease unchanged
BEGIN READ ONLY;
SELECT idempotency.renew('job', '3 hours', 1, 'jobs');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT locked_until = :'new_end' AS unchanged FROM idempotency.idempotency_key WHERE key = 'job';
-- a lapsed lease taken over; the zombie's complete() and renew() refused
SELECT outcome FROM idempotency.begin('job2', scope => 'jobs', lease => '1 ms');
SELECT pg_sleep(0.01);
SELECT outcome, attempts FROM idempotency.begin('job2', scope => 'jobs', lease => '1 hour');
SELECT idempotency.complete('job2', '"zombie"', 'jobs', attempt => 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.renew('job2', '1 hour', 1, 'jobs');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.complete('job2', '"attempt 2"', 'jobs', attempt => 2);
-- renew() of a finished lease: IK004
SELECT idempotency.renew('job2', '1 hour', 2, 'jobs');
\echo :LAST_ERROR_SQLSTATE
SELECT status, response, locked_until FROM idempotency.idempotency_key WHERE key = 'job2';

-- forget(): a key failed for good is cleared, and the next begin() is new
SELECT idempotency.forget('k2', 'pay');
SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'k2';
BEGIN;
SELECT outcome, attempts FROM idempotency.begin('k2', scope => 'pay');
ROLLBACK;
-- nothing there: false; a key in the wrong scope is another key
SELECT idempotency.forget('nothing', 'pay');
-- a NULL key or scope: IK003
SELECT idempotency.forget(NULL, 'pay');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.forget('k1', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.forget('k1');
-- in flight: under a live lease, or begun by this transaction: IK002
SELECT idempotency.forget('job', 'jobs');
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SELECT outcome FROM idempotency.begin('k5', scope => 'pay');
SELECT idempotency.forget('k5', 'pay');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- a read-only transaction: 25006
BEGIN READ ONLY;
SELECT idempotency.forget('k1', 'pay');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT key, status FROM idempotency.idempotency_key WHERE key IN ('k1', 'job') ORDER BY key;
-- a key this transaction completed may be forgotten in it
BEGIN;
SELECT outcome FROM idempotency.begin('k6', scope => 'pay');
SELECT idempotency.complete('k6', '{}', 'pay');
SELECT idempotency.forget('k6', 'pay');
SELECT outcome FROM idempotency.begin('k6', scope => 'pay');
SELECT idempotency.complete('k6', '{"again": true}', 'pay');
COMMIT;
SELECT status, response FROM idempotency.idempotency_key WHERE key = 'k6';

-- purge() counts under the caller's role, scope ''
BEGIN;
SELECT outcome FROM idempotency.begin('old', ttl => '1 ms');
SELECT idempotency.complete('old', '{}');
COMMIT;
SELECT pg_sleep(0.01);
SELECT idempotency.purge();
SELECT * FROM counters;

-- another role: sees its own rows only, and none of regress_stats_a's keys
SET ROLE regress_stats_b;
BEGIN;
SELECT outcome FROM idempotency.begin('k1', '{"other": "request"}', 'pay');
ROLLBACK;
SELECT idempotency.forget('k1', 'pay');
SELECT idempotency.renew('job', '1 hour', 1, 'jobs');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM counters;
SELECT count(*) AS rows_of_other_roles FROM idempotency.stats WHERE role <> current_user;
-- stats_reset() is not for plain roles, nor is log_waits
SELECT idempotency.stats_reset();
\echo :LAST_ERROR_SQLSTATE
SET idempotency.log_waits = 0;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT count(*) AS k1_still_there FROM idempotency.idempotency_key
 WHERE key = 'k1' AND owner = 'regress_stats_a'::regrole;

-- members of pg_read_all_stats see every role's rows
GRANT pg_read_all_stats TO regress_stats_b;
SET ROLE regress_stats_b;
SELECT role, scope FROM counters;
RESET ROLE;
\set VERBOSITY default

-- a long scope is shown clipped to 64 bytes, counted by the whole scope
SET ROLE regress_stats_a;
BEGIN;
SELECT outcome FROM idempotency.begin('k', scope => repeat('s', 100) || 'x');
SELECT outcome FROM idempotency.begin('k', scope => repeat('s', 100) || 'y');
ROLLBACK;
RESET ROLE;
SELECT length(scope), begin_new FROM idempotency.stats
 WHERE role = 'regress_stats_a' AND scope LIKE 'sss%';

-- stats_max is fixed at server start
SET idempotency.stats_max = 20;
\echo :LAST_ERROR_SQLSTATE

-- reset: no rows left
SELECT idempotency.stats_reset();
SELECT count(*) AS entries FROM idempotency.stats;

DROP VIEW counters;
DELETE FROM idempotency.idempotency_key WHERE owner IN ('regress_stats_a'::regrole, 'regress_stats_b'::regrole);
REVOKE CREATE ON SCHEMA public FROM regress_stats_a;
DROP ROLE regress_stats_a, regress_stats_b;
