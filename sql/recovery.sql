-- recovery: checkpoint() records a lease-mode key's recovery point and state
-- in the caller's transaction, so they commit with the phase's writes; a
-- retry's begin() and lookup() return them; only the attempt holding the
-- lease may checkpoint (IK004).  derive_key() gives stable downstream keys.
-- Every error path: its SQLSTATE, and nothing written (keys_digest()).
\i sql/include/roles.sql
CREATE TABLE rp_order (key text PRIMARY KEY, amount int);
CREATE TABLE rp_charge (key text PRIMARY KEY, charge_id text);
GRANT ALL ON rp_order, rp_charge TO PUBLIC;
-- every row of the key table, as one value (SECURITY DEFINER: all roles' rows)
CREATE FUNCTION keys_digest() RETURNS text LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog AS $$
  SELECT md5(coalesce(string_agg(k::text, ';' ORDER BY k.key, k.scope, k.owner::oid), ''))
    FROM idempotency.idempotency_key k $$;
-- a lapsed lease, without waiting (as the superuser, who may write the table)
CREATE FUNCTION lapse(k text) RETURNS void LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog AS $$
  UPDATE idempotency.idempotency_key SET locked_until = now() - interval '1 second'
   WHERE key = k $$;

-- phase 1: the order and the point commit together
SELECT outcome, attempts, recovery_point, recovery_state
  FROM idempotency.begin('pay-1', '{"amount": 30}', lease => '1 hour');
BEGIN;
INSERT INTO rp_order VALUES ('pay-1', 30);
SELECT idempotency.checkpoint('pay-1', 'order_created', '{"order": "pay-1"}', 1);
-- this transaction sees its own point
SELECT status, recovery_point, recovery_state FROM idempotency.lookup('pay-1');
COMMIT;
SELECT status, attempts, retry_after > 0 AS leased, recovery_point, recovery_state
  FROM idempotency.lookup('pay-1');

-- phase 2 rolls back (the process died mid-transaction): neither the
-- charge row nor the point is kept
BEGIN;
INSERT INTO rp_charge VALUES ('pay-1', 'ch_lost');
SELECT idempotency.checkpoint('pay-1', 'charged', '{"charge": "ch_lost"}', 1);
ROLLBACK;
SELECT recovery_point, recovery_state FROM idempotency.lookup('pay-1');
SELECT count(*) AS charges FROM rp_charge;

-- the lease lapses; the retry resumes from the last committed point
SELECT lapse('pay-1');
SELECT outcome, status, attempts, recovery_point, recovery_state
  FROM idempotency.begin('pay-1', '{"amount": 30}', lease => '1 hour');
BEGIN;
INSERT INTO rp_charge VALUES ('pay-1', 'ch_1');
SELECT idempotency.checkpoint('pay-1', 'charged', '{"charge": "ch_1"}', 2);
COMMIT;
-- a checkpoint may repeat a point, and state may be null
SELECT idempotency.checkpoint('pay-1', 'charged', NULL, 2);
SELECT recovery_point, recovery_state FROM idempotency.lookup('pay-1');
SELECT idempotency.checkpoint('pay-1', 'recorded', '{"charge": "ch_1", "recorded": true}', 2);
-- complete() after the last phase stores the response; the point stays
SELECT idempotency.complete('pay-1', '{"paid": "ch_1"}', attempt => 2);
-- a replay returns the stored response, whatever phase it reached
SELECT outcome, status, response, attempts, recovery_point, recovery_state
  FROM idempotency.begin('pay-1', '{"amount": 30}', lease => '1 hour');
SELECT status, retry_after, recovery_point FROM idempotency.lookup('pay-1');
-- SELECT outcome still works as before (begin_result grew two columns)
SELECT outcome FROM idempotency.begin('pay-1');

-- begin() and checkpoint() in one transaction
BEGIN;
SELECT outcome, attempts FROM idempotency.begin('pay-2', lease => '1 hour');
SELECT idempotency.checkpoint('pay-2', 'order_created', '{"order": 2}', 1);
COMMIT;
SELECT recovery_point, recovery_state FROM idempotency.lookup('pay-2');
-- fail(retryable => true): the retry still resumes from the point
SELECT idempotency.fail('pay-2', '{"error": "processor down"}', attempt => 1);
SELECT outcome, attempts, response, recovery_point FROM idempotency.begin('pay-2', lease => '1 hour');
-- fail(retryable => false) ends it: replayed, point and all
SELECT idempotency.fail('pay-2', '{"error": "card declined"}', retryable => false, attempt => 2);
SELECT outcome, status, response, recovery_point FROM idempotency.begin('pay-2', lease => '1 hour');

-- new work over an expired row starts without the old point
SELECT outcome FROM idempotency.begin('pay-3', lease => '1 hour');
SELECT idempotency.checkpoint('pay-3', 'order_created', '{"order": 3}', 1);
UPDATE idempotency.idempotency_key SET expires_at = now() - interval '1 second',
       locked_until = now() - interval '2 seconds' WHERE key = 'pay-3';
SELECT outcome, attempts, recovery_point, recovery_state
  FROM idempotency.begin('pay-3', lease => '1 hour');
SELECT recovery_point, recovery_state FROM idempotency.idempotency_key WHERE key = 'pay-3';
-- and in single-transaction mode (the row is written at complete())
UPDATE idempotency.idempotency_key SET recovery_point = 'stale', recovery_state = '1',
       expires_at = now() - interval '1 second' WHERE key = 'pay-3';
BEGIN;
SELECT outcome, recovery_point FROM idempotency.begin('pay-3');
SELECT idempotency.complete('pay-3', '"done"');
COMMIT;
SELECT recovery_point, recovery_state FROM idempotency.idempotency_key WHERE key = 'pay-3';

-- ---------------------------------------------------------------------
-- errors: SQLSTATE, and nothing written
-- ---------------------------------------------------------------------
SELECT outcome FROM idempotency.begin('pay-4', lease => '1 hour');
SELECT idempotency.checkpoint('pay-4', 'order_created', '{"order": 4}', 1);
SELECT keys_digest() AS before \gset
\set VERBOSITY terse
-- nulls and bad names
SELECT idempotency.checkpoint(NULL, 'p', '{}', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.checkpoint('pay-4', NULL, '{}', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.checkpoint('pay-4', '', '{}', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.checkpoint('pay-4', repeat('p', 256), '{}', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.checkpoint('pay-4', 'p', '{}', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.checkpoint('pay-4', 'p', '{}', 1, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.checkpoint('', 'p', '{}', 1);
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
-- unknown key
SELECT idempotency.checkpoint('no-such-key', 'p', '{}', 1);
\echo :LAST_ERROR_SQLSTATE
-- the same key in another scope is another key
SELECT idempotency.checkpoint('pay-4', 'p', '{}', 1, 'other scope');
\echo :LAST_ERROR_SQLSTATE
-- an attempt that never existed
SELECT idempotency.checkpoint('pay-4', 'p', '{}', 7);
\echo :LAST_ERROR_SQLSTATE
-- not in lease mode: begun in this transaction without a lease
BEGIN;
SELECT outcome FROM idempotency.begin('pay-5');
SELECT idempotency.checkpoint('pay-5', 'p', '{}', 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT keys_digest() = :'before' AS nothing_written;
-- a taken-over attempt (a zombie)
SELECT lapse('pay-4');
SELECT outcome, attempts, recovery_point FROM idempotency.begin('pay-4', lease => '1 hour');
SELECT keys_digest() AS before \gset
SELECT idempotency.checkpoint('pay-4', 'zombie', '{"zombie": true}', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT keys_digest() = :'before' AS nothing_written;
-- a finished key, by its own attempt and by an old one
SELECT idempotency.complete('pay-4', '"done"', attempt => 2);
SELECT keys_digest() AS before \gset
SELECT idempotency.checkpoint('pay-4', 'late', '{}', 2);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.checkpoint('pay-4', 'late', '{}', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT keys_digest() = :'before' AS nothing_written;
-- completed in this transaction
BEGIN;
SELECT outcome FROM idempotency.begin('pay-6', lease => '1 hour');
SELECT idempotency.complete('pay-6', '"done"', attempt => 1);
SELECT idempotency.checkpoint('pay-6', 'late', '{}', 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- an expired key
SELECT outcome FROM idempotency.begin('pay-7', lease => '1 hour');
UPDATE idempotency.idempotency_key SET expires_at = now() - interval '1 second',
       locked_until = now() - interval '2 seconds' WHERE key = 'pay-7';
SELECT keys_digest() AS before \gset
SELECT idempotency.checkpoint('pay-7', 'p', '{}', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT keys_digest() = :'before' AS nothing_written;
-- a read-only transaction
SELECT outcome FROM idempotency.begin('pay-8', lease => '1 hour');
SELECT keys_digest() AS before \gset
BEGIN READ ONLY;
SELECT idempotency.checkpoint('pay-8', 'p', '{}', 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT keys_digest() = :'before' AS nothing_written;
-- another role: alice's key is no key to bob
SET ROLE regress_alice;
SELECT outcome FROM idempotency.begin('pay-9', lease => '1 hour');
RESET ROLE;
SELECT keys_digest() AS before \gset
SET ROLE regress_bob;
SELECT idempotency.checkpoint('pay-9', 'stolen', '{}', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.lookup('pay-9');
RESET ROLE;
SELECT keys_digest() = :'before' AS nothing_written;
SET ROLE regress_alice;
SELECT idempotency.checkpoint('pay-9', 'order_created', '{"order": 9}', 1);
SELECT recovery_point, recovery_state FROM idempotency.lookup('pay-9');
RESET ROLE;
-- the errors wrote nothing (pay-4 as the last \gset left it)
SELECT recovery_point FROM idempotency.idempotency_key WHERE key = 'pay-4';

-- ---------------------------------------------------------------------
-- derive_key()
-- ---------------------------------------------------------------------
SELECT idempotency.derive_key('pay-1', 'charge') AS charge_key \gset
SELECT :'charge_key' ~ '^idk_[a-z2-7]{26}$' AS shape, length(:'charge_key') AS length;
-- the same for every call (every attempt), different per step, scope and
-- key (each a key with a row of its own: derive_key() derives from the row)
SELECT outcome FROM idempotency.begin('pay-1', lease => '1 hour', scope => 'tenant-2');
SELECT outcome FROM idempotency.begin('ab', lease => '1 hour');
SELECT outcome FROM idempotency.begin('a', lease => '1 hour');
SELECT idempotency.derive_key('pay-1', 'charge') = :'charge_key' AS stable,
       idempotency.derive_key('pay-1', 'refund') <> :'charge_key' AS per_step,
       idempotency.derive_key('pay-1', 'charge', 'tenant-2') <> :'charge_key' AS per_scope,
       idempotency.derive_key('pay-2', 'charge') <> :'charge_key' AS per_key,
       idempotency.derive_key('pay-1', 'charge', '') = :'charge_key' AS default_scope;
-- no ambiguity between fields: ('ab', 'c') is not ('a', 'bc')
SELECT idempotency.derive_key('ab', 'c') <> idempotency.derive_key('a', 'bc') AS framed;
-- per role: bob's 'pay-1' is not ours, and bob cannot read the secret
SET ROLE regress_bob;
SELECT idempotency.derive_key('pay-1', 'charge');
\echo :LAST_ERROR_SQLSTATE
SELECT outcome FROM idempotency.begin('pay-1', lease => '1 hour');
SELECT idempotency.derive_key('pay-1', 'charge') <> :'charge_key' AS per_role;
SELECT * FROM idempotency.derive_secret;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- errors
\set VERBOSITY terse
SELECT idempotency.derive_key(NULL, 'charge');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.derive_key('pay-1', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.derive_key('pay-1', '');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.derive_key('pay-1', 'charge', NULL);
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
-- a key derives with the secret its seed names, whichever row is oldest (a
-- restore into a database that has the extension adds the dumped row beside
-- the target's own); a missing secret is 55000
CREATE TEMP TABLE saved_secret AS SELECT * FROM idempotency.derive_secret;
INSERT INTO idempotency.derive_secret VALUES (sha256('restored'), now() - interval '1 year');
SELECT idempotency.derive_key('pay-1', 'charge') = :'charge_key' AS its_own_secret;
DELETE FROM idempotency.derive_secret;
SELECT idempotency.derive_key('pay-1', 'charge');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idempotency.derive_secret SELECT * FROM saved_secret;
SELECT idempotency.derive_key('pay-1', 'charge') = :'charge_key' AS restored;

-- the same on the SQL path (a DBA's trigger on the key table turns the
-- fast path off): the prepared SELECT reads the point back
CREATE FUNCTION rp_noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
CREATE TRIGGER rp_noop BEFORE INSERT OR UPDATE ON idempotency.idempotency_key
    FOR EACH ROW EXECUTE FUNCTION rp_noop();
SELECT outcome FROM idempotency.begin('pay-sql', lease => '1 hour');
SELECT idempotency.checkpoint('pay-sql', 'order_created', '{"order": 11}', 1);
SELECT lapse('pay-sql');
SELECT outcome, attempts, recovery_point, recovery_state FROM idempotency.begin('pay-sql', lease => '1 hour');
SELECT idempotency.checkpoint('pay-sql', 'zombie', '{}', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.complete('pay-sql', '"done"', attempt => 2);
SELECT outcome, response, recovery_point FROM idempotency.begin('pay-sql');
SELECT status, recovery_point, recovery_state FROM idempotency.lookup('pay-sql');
DROP TRIGGER rp_noop ON idempotency.idempotency_key;
DROP FUNCTION rp_noop();

-- refused checkpoints are counted in idempotency.stats (ik004, zombies)
SELECT idempotency.stats_reset();
SELECT outcome FROM idempotency.begin('pay-s', lease => '1 hour', scope => 'rp-stats');
SELECT lapse('pay-s');
SELECT outcome, attempts FROM idempotency.begin('pay-s', lease => '1 hour', scope => 'rp-stats');
SELECT idempotency.checkpoint('pay-s', 'zombie', '{}', 1, 'rp-stats');
BEGIN;
SELECT outcome FROM idempotency.begin('pay-t', scope => 'rp-stats');
SELECT idempotency.checkpoint('pay-t', 'p', '{}', 1, 'rp-stats');
ROLLBACK;
SELECT idempotency.checkpoint('pay-s', 'charged', '{}', 2, 'rp-stats');
SELECT begin_new, begin_retry, lease_takeovers, ik004_not_held, zombies_refused
  FROM idempotency.stats WHERE scope = 'rp-stats';

-- ---------------------------------------------------------------------
-- the library on a table without the recovery point columns (a 0.4.0
-- table, see upgrade.sql for the real one): begin() works, checkpoint()
-- asks for the update, nothing is written
-- ---------------------------------------------------------------------
ALTER TABLE idempotency.idempotency_key DROP COLUMN recovery_point, DROP COLUMN recovery_state;
SELECT outcome, recovery_point FROM idempotency.begin('pay-10', lease => '1 hour');
SELECT keys_digest() AS before \gset
SELECT idempotency.checkpoint('pay-10', 'p', '{}', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT keys_digest() = :'before' AS nothing_written;
SELECT status, recovery_point FROM idempotency.lookup('pay-10');
SELECT idempotency.complete('pay-10', '"done"', attempt => 1);
SELECT outcome, response FROM idempotency.begin('pay-10');

DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
DROP TABLE rp_order, rp_charge;
DROP FUNCTION keys_digest(), lapse(text);
