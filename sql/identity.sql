-- identity: whose key is this (SPEC section 12).
-- derive_key() derives from the key's own row (a per-key seed drawn when
-- the row is first written, and its created_at), not from the role's name
-- or the database's copied secrets; message ids are fresh random values,
-- not a function of a row id and a copied secret.  Each check below failed
-- on 0.5.0.
SELECT current_database() AS regress_db \gset
CREATE ROLE regress_id_alice NOLOGIN;
\set VERBOSITY terse

-- a renamed role's key: found, and the same derived key
SET ROLE regress_id_alice;
SELECT outcome FROM idempotency.begin('charge-1', lease => '1 hour');
SELECT idempotency.derive_key('charge-1', 'card') AS before_rename \gset
RESET ROLE;
ALTER ROLE regress_id_alice RENAME TO regress_id_alice_renamed;
SET ROLE regress_id_alice_renamed;
SELECT status, attempts FROM idempotency.lookup('charge-1');
SELECT idempotency.derive_key('charge-1', 'card') = :'before_rename' AS same_after_rename;
RESET ROLE;

-- a new role of the old name: none of the old role's keys, none of its
-- derived keys (0.5.0 derived the old role's key from the name alone)
CREATE ROLE regress_id_alice NOLOGIN;
SET ROLE regress_id_alice;
SELECT count(*) AS keys_seen FROM idempotency.lookup('charge-1');
SELECT idempotency.derive_key('charge-1', 'card');
\echo :LAST_ERROR_SQLSTATE
SELECT outcome FROM idempotency.begin('charge-1', lease => '1 hour');
SELECT idempotency.derive_key('charge-1', 'card') <> :'before_rename' AS not_inherited;
RESET ROLE;

-- the same after the first role is dropped and its name taken again
DROP ROLE regress_id_alice_renamed;
CREATE ROLE regress_id_alice_renamed NOLOGIN;
SET ROLE regress_id_alice_renamed;
SELECT count(*) AS keys_seen FROM idempotency.lookup('charge-1');
SELECT idempotency.derive_key('charge-1', 'card');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

-- every row has its own seed: version 2, the tag of the secret it derives
-- with and 16 fresh bytes, on the fast path and on the SQL path (a trigger
-- on the table turns the fast path off)
SELECT outcome FROM idempotency.begin('seed-fast', lease => '1 hour');
CREATE FUNCTION id_noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
CREATE TRIGGER id_noop BEFORE INSERT OR UPDATE ON idempotency.idempotency_key
    FOR EACH ROW EXECUTE FUNCTION id_noop();
SELECT outcome FROM idempotency.begin('seed-sql', lease => '1 hour');
DROP TRIGGER id_noop ON idempotency.idempotency_key;
DROP FUNCTION id_noop();
SELECT key, length(derive_seed) AS bytes, get_byte(derive_seed, 0) AS version
  FROM idempotency.idempotency_key WHERE key IN ('seed-fast', 'seed-sql') ORDER BY key;
SELECT count(DISTINCT derive_seed) = count(*) AS all_distinct
  FROM idempotency.idempotency_key WHERE get_byte(derive_seed, 0) = 2;
SELECT bool_and(substr(k.derive_seed, 2, 8) = substr(sha256(s.secret), 1, 8)) AS names_its_secret
  FROM idempotency.idempotency_key AS k, idempotency.derive_secret AS s
 WHERE k.key IN ('seed-fast', 'seed-sql');
SELECT restored_050 FROM idempotency.derive_secret;
-- the same key in two roles: two seeds, two derived keys
SET ROLE regress_id_alice;
SELECT idempotency.derive_key('charge-1', 'card') AS alice_key \gset
RESET ROLE;
SELECT outcome FROM idempotency.begin('charge-1', lease => '1 hour');
SELECT idempotency.derive_key('charge-1', 'card') <> :'alice_key' AS per_role;

-- a single-transaction key has no row before complete(): IK004, nothing
-- written; after complete() its row is this transaction's, which could
-- still roll back: IK004 too; once committed, its row derives
BEGIN;
SELECT outcome FROM idempotency.begin('single-1');
SAVEPOINT s;
SELECT idempotency.derive_key('single-1', 'x');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO s;
SELECT idempotency.complete('single-1', '"done"');
SAVEPOINT s;
SELECT idempotency.derive_key('single-1', 'x');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO s;
COMMIT;
SELECT idempotency.derive_key('single-1', 'x') ~ '^idk_[a-z2-7]{26}$' AS derives_after_commit;
SELECT count(*) AS rows_of_single FROM idempotency.idempotency_key WHERE key = 'single-1';

-- a lease begun in a transaction that then rolls back: derive_key() in
-- that transaction is refused (0.6.0 before this check derived from the
-- uncommitted seed, and the retry derived another key: the other system
-- saw two requests); the retry's derived key, once committed, is stable
BEGIN;
SELECT outcome FROM idempotency.begin('lease-rb', lease => '1 hour');
SAVEPOINT s;
SELECT idempotency.derive_key('lease-rb', 'charge');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO s;
ROLLBACK;
SELECT outcome FROM idempotency.begin('lease-rb', lease => '1 hour');
SELECT idempotency.derive_key('lease-rb', 'charge') AS lease_rb \gset
BEGIN;
SELECT idempotency.derive_key('lease-rb', 'charge') = :'lease_rb' AS same_in_a_later_transaction;
COMMIT;

-- new work over an expired row starts a new life: a new derived key
SELECT idempotency.derive_key('seed-fast', 'card') AS first_life \gset
UPDATE idempotency.idempotency_key SET expires_at = now() - interval '1 second'
 WHERE key = 'seed-fast';
SELECT idempotency.derive_key('seed-fast', 'card');
\echo :LAST_ERROR_SQLSTATE
SELECT outcome FROM idempotency.begin('seed-fast', lease => '1 hour');
SELECT idempotency.derive_key('seed-fast', 'card') <> :'first_life' AS new_life;

-- a row without a seed (restored from a dump of 0.5.0, whose COPY does not
-- name the column) derives as 0.5.0 did, with the secret restored from
-- that dump (restored_050; none here: 55000, nothing written); new work
-- over it once it expired draws a seed
SELECT outcome FROM idempotency.begin('seedless', lease => '1 hour');
UPDATE idempotency.idempotency_key SET derive_seed = NULL,
       created_at = created_at - interval '1 second' WHERE key = 'seedless';
SELECT idempotency.derive_key('seedless', 'card');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idempotency.derive_secret (secret, created_at)
VALUES (sha256('from a dump of 0.5.0'), now() - interval '1 year');
SELECT idempotency.derive_key('seedless', 'card') AS seedless_key \gset
SELECT :'seedless_key' ~ '^idk_[a-z2-7]{26}$' AS derives,
       idempotency.derive_key('seedless', 'card') = :'seedless_key' AS stable;
UPDATE idempotency.idempotency_key SET expires_at = now() - interval '1 second' WHERE key = 'seedless';
SELECT outcome FROM idempotency.begin('seedless', lease => '1 hour');
SELECT get_byte(derive_seed, 0) AS new_life_seed_version FROM idempotency.idempotency_key WHERE key = 'seedless';
DELETE FROM idempotency.derive_secret WHERE restored_050;
SELECT count(*) = 1 AS own_secret_kept FROM idempotency.derive_secret;

-- a new seed carries the tag of the oldest derive secret (by created_at,
-- then by secret), read again after a change to the table (TRUNCATE,
-- rolled back here); the rows are inserted so that neither the first row
-- read, nor the smallest secret, nor the first of the oldest is the one
BEGIN;
TRUNCATE idempotency.derive_secret;
INSERT INTO idempotency.derive_secret (secret, created_at, restored_050) VALUES
    (decode(repeat('03', 32), 'hex'), '2000-01-01 00:00:00+00', false),
    (decode(repeat('01', 32), 'hex'), '2001-01-01 00:00:00+00', false),
    (decode(repeat('02', 32), 'hex'), '2000-01-01 00:00:00+00', false);
SELECT outcome FROM idempotency.begin('seed-oldest', lease => '1 hour');
SELECT substr(derive_seed, 2, 8) = substr(sha256(decode(repeat('02', 32), 'hex')), 1, 8) AS oldest_secret_tag
  FROM idempotency.idempotency_key WHERE key = 'seed-oldest';
ROLLBACK;
SELECT outcome FROM idempotency.begin('seed-after', lease => '1 hour');
SELECT bool_and(substr(k.derive_seed, 2, 8) = substr(sha256(s.secret), 1, 8)) AS own_secret_again
  FROM idempotency.idempotency_key AS k, idempotency.derive_secret AS s
 WHERE k.key = 'seed-after';

-- the lock secret: a table without its row is 55000, nothing written; the
-- row put back serves again (the trigger makes the next transaction read it)
CREATE TEMP TABLE saved_lock_secret AS SELECT * FROM idempotency.lock_secret;
DELETE FROM idempotency.lock_secret;
SELECT outcome FROM idempotency.begin('no-lock-secret');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS rows_written FROM idempotency.idempotency_key WHERE key = 'no-lock-secret';
INSERT INTO idempotency.lock_secret SELECT * FROM saved_lock_secret;
SELECT outcome FROM idempotency.begin('no-lock-secret', lease => '1 hour');

-- a secret column changed by hand: 55000, nothing written
BEGIN;
ALTER TABLE idempotency.lock_secret DROP CONSTRAINT lock_secret_length,
    ALTER COLUMN secret TYPE text USING 'not a secret';
SELECT outcome FROM idempotency.begin('bad-lock-secret');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN;
ALTER TABLE idempotency.derive_secret DROP CONSTRAINT derive_secret_length,
    ALTER COLUMN secret TYPE text USING 'not a secret';
SELECT outcome FROM idempotency.begin('bad-derive-secret', lease => '1 hour');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT count(*) AS rows_written FROM idempotency.idempotency_key
 WHERE key IN ('bad-lock-secret', 'bad-derive-secret');

-- template clones: the same key, derived and published in two databases
-- cloned from one template, gives two derived keys and two message ids
-- (0.5.0: the same, from the copied secrets and sequence)
CREATE DATABASE regress_id_template;
\c regress_id_template
CREATE EXTENSION idempotency;
SELECT idempotency.create_topic('refunds') > 0 AS topic;
\c :regress_db
CREATE DATABASE regress_id_a TEMPLATE regress_id_template;
CREATE DATABASE regress_id_b TEMPLATE regress_id_template;
\c regress_id_a
SELECT outcome FROM idempotency.begin('refund-1', lease => '1 hour');
BEGIN;
SELECT idempotency.derive_key('refund-1', 'refund') AS derived_a \gset
SELECT idempotency.publish('refunds', '{"amount": 100}') AS message_a \gset
COMMIT;
\c regress_id_b
SELECT outcome FROM idempotency.begin('refund-1', lease => '1 hour');
BEGIN;
SELECT idempotency.derive_key('refund-1', 'refund') AS derived_b \gset
SELECT idempotency.publish('refunds', '{"amount": 999}') AS message_b \gset
COMMIT;
\c :regress_db
SELECT :'derived_a' <> :'derived_b' AS derived_keys_differ,
       :'message_a' <> :'message_b' AS message_ids_differ;
DROP DATABASE regress_id_a;
DROP DATABASE regress_id_b;
DROP DATABASE regress_id_template;

-- message ids are version 4 UUIDs, all distinct
SELECT idempotency.create_topic('id_check') > 0 AS topic;
SELECT count(DISTINCT m) AS distinct_ids,
       bool_and(substr(m::text, 15, 1) = '4' AND substr(m::text, 20, 1) IN ('8', '9', 'a', 'b')) AS v4
  FROM (SELECT idempotency.publish('id_check', pg_catalog.jsonb_build_object('n', n)) AS m
          FROM generate_series(1, 200) AS n) AS s;
SELECT idempotency.drop_topic('id_check', force => true);

-- roleref's operator is idempotency.===, which the parser never picks for
-- a user's own = (with schema idempotency first on the search_path an
-- operator named = turned 'name' = regrole into a roleref comparison)
SET search_path = idempotency, public;
SELECT 'pg_database_owner' = 'pg_database_owner'::regrole;
\echo :LAST_ERROR_SQLSTATE
RESET search_path;

-- roleref prints a role that no longer exists as "-" (nobody), not as
-- regrole's bare oid, which another node or cluster reads back as whatever
-- role has that oid there (a dropped role's keys went to an unrelated role
-- after a shard move or a restore)
CREATE ROLE regress_id_doomed;
SELECT oid AS doomed_oid FROM pg_roles WHERE rolname = 'regress_id_doomed' \gset
SELECT :'doomed_oid'::oid::idempotency.roleref::text = 'regress_id_doomed' AS named_while_it_exists;
DROP ROLE regress_id_doomed;
SELECT :'doomed_oid'::oid::idempotency.roleref::text AS dropped_prints,
       :'doomed_oid'::oid::regrole::text = :'doomed_oid' AS regrole_prints_the_oid,
       '-'::idempotency.roleref::oid AS reads_back_as;
SELECT 0::oid::idempotency.roleref::text AS invalid_prints;

-- clean up
DELETE FROM idempotency.idempotency_key
 WHERE key IN ('charge-1', 'seed-fast', 'seed-sql', 'single-1', 'lease-rb');
DROP ROLE regress_id_alice;
DROP ROLE regress_id_alice_renamed;
\set VERBOSITY default
