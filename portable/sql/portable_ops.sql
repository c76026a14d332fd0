-- portable_ops: forget() and renew() in the portable edition, the cases of
-- the C edition's stats.sql without its counters (the portable edition has
-- no shared-memory statistics): each outcome, each error path with its
-- SQLSTATE, and that a refused call wrote nothing; checkpoint() in a
-- read-only transaction (the key's checks first, as in the C edition).
-- Then purge() by the installing role, which purges every role's rows
-- (what a pg_cron job runs, where the C edition has its background worker).
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
-- a trigger that skips the delete: forget() fails (09000) rather than say
-- false, which means there was no key; the key stands (as in the C
-- edition's hardening.sql)
BEGIN;
CREATE FUNCTION skip_delete() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$;
CREATE TRIGGER skip_delete BEFORE DELETE ON idempotency.idempotency_key
  FOR EACH ROW EXECUTE FUNCTION skip_delete();
SET LOCAL ROLE regress_alice;
SELECT idempotency.forget('k1', 'pay');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
SELECT key, status FROM idempotency.idempotency_key WHERE key = 'k1';
DELETE FROM idempotency.idempotency_key WHERE scope IN ('pay', 'jobs');

-- forget() of a key another session is beginning anew (its row not
-- committed, so not visible here): IK002 without waiting for it, nothing
-- deleted or left behind (the other session through dblink, so the order
-- is fixed; test/specs/forget_new.spec races the same in the C edition)
CREATE EXTENSION dblink;
SELECT dblink_connect('other', pg_catalog.format('host=%s port=%s dbname=%s user=postgres',
       current_setting('unix_socket_directories'), current_setting('port'), current_database()));
SELECT dblink_exec('other', 'SET ROLE regress_alice');
SELECT dblink_exec('other', 'BEGIN');
SELECT * FROM dblink('other', $$SELECT outcome FROM idempotency.begin('held-elsewhere')$$) AS t(outcome text);
SET ROLE regress_alice;
SELECT idempotency.forget('held-elsewhere');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT dblink_exec('other', 'ROLLBACK');
SET ROLE regress_alice;
SELECT idempotency.forget('held-elsewhere') AS after_rollback;
RESET ROLE;
SELECT count(*) AS rows_left FROM idempotency.idempotency_key WHERE key = 'held-elsewhere';
SELECT dblink_disconnect('other');
DROP EXTENSION dblink;

-- checkpoint() in a read-only transaction: the key's checks come first (an
-- unknown key is IK004), then 25006; nothing written
SET ROLE regress_alice;
SELECT outcome FROM idempotency.begin('cp-ro', lease => '1 hour');
BEGIN READ ONLY;
SELECT idempotency.checkpoint('cp-unknown', 'p', '{}', 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT idempotency.checkpoint('cp-ro', 'p', '{}', 2);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT idempotency.checkpoint('cp-ro', 'p', '{}', 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT recovery_point FROM idempotency.lookup('cp-ro');
RESET ROLE;

-- purge() by the installing role (regress_admin here): every role's expired
-- keys, tokens and seen messages, in batches; live rows stay (the rows the
-- earlier files left are cleared first)
DELETE FROM idempotency.idempotency_key;
DELETE FROM idempotency.seen_message;
DELETE FROM idempotency.token;
SET ROLE regress_alice;
SELECT count(*) FROM generate_series(1, 3) i, idempotency.begin('exp-a' || i, ttl => '1 ms', lease => '1 ms');
SELECT outcome FROM idempotency.begin('live-a', ttl => '1 hour', lease => '1 ms');
SELECT idempotency.issue_token(ttl => '1 ms') IS NOT NULL AS token;
SELECT idempotency.first_seen('q', 'm-a', ttl => '1 ms');
SET ROLE regress_bob;
SELECT count(*) FROM generate_series(1, 3) i, idempotency.begin('exp-b' || i, ttl => '1 ms', lease => '1 ms');
SELECT idempotency.first_seen('q', 'm-b', ttl => '1 hour');
RESET ROLE;
SELECT pg_sleep(0.01);
SELECT (SELECT count(*) FROM idempotency.idempotency_key) AS keys,
       (SELECT count(*) FROM idempotency.token WHERE expires_at <= now()) AS expired_tokens,
       (SELECT count(*) FROM idempotency.seen_message) AS seen;
-- another role purges its own rows only
SET ROLE regress_bob;
SELECT idempotency.purge(2) AS bobs_first, idempotency.purge(2) AS bobs_second;
SET ROLE regress_admin;
SELECT idempotency.purge(2) AS first_batches, idempotency.purge(2) AS second_batches,
       idempotency.purge(2) AS nothing_left;
RESET ROLE;
SELECT owner, key FROM idempotency.idempotency_key ORDER BY owner::text, key;
SELECT count(*) AS expired_tokens FROM idempotency.token WHERE expires_at <= now();
SELECT owner, message_id FROM idempotency.seen_message ORDER BY owner::text, message_id;
-- a batch below 1: 22023, nothing deleted; NULL (STRICT): NULL
SELECT count(*) FROM generate_series(1, 2) i, idempotency.begin('exp-c' || i, ttl => '1 ms', lease => '1 ms');
SELECT pg_sleep(0.01);
SELECT idempotency.purge(0);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.purge(NULL) IS NULL AS strict;
-- a read-only transaction: 25006, nothing deleted
BEGIN READ ONLY;
SELECT idempotency.purge();
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT count(*) AS still_there FROM idempotency.idempotency_key WHERE key LIKE 'exp-c%';
SELECT idempotency.purge() AS purged;
DELETE FROM idempotency.idempotency_key;
DELETE FROM idempotency.seen_message;
DELETE FROM idempotency.token;
