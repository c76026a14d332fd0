-- portable: what only the portable edition has, each error path with its
-- SQLSTATE: whose key a call makes (SET ROLE, not the functions' owner),
-- no direct writes, the placeholder settings read at the call, and a row a
-- trigger skipped.
\set VERBOSITY terse
CREATE TABLE portable_effect (note text);

-- the key belongs to the role the session acts as, even though the
-- functions run as the role that installed them
SET ROLE regress_alice;
BEGIN;
SELECT outcome FROM idempotency.begin('p-1');
SELECT idempotency.complete('p-1', '"alice"');
COMMIT;
RESET ROLE;
SELECT owner, key, status, response FROM idempotency.idempotency_key WHERE key = 'p-1';
SELECT proowner::regrole AS owner, prosecdef, proconfig
  FROM pg_proc WHERE oid = 'idempotency.begin'::regproc;
-- bob has his own namespace of keys, and cannot see alice's
SET ROLE regress_bob;
BEGIN;
SELECT outcome FROM idempotency.begin('p-1', '{"other": true}');
SELECT owner, status FROM idempotency.idempotency_key WHERE key = 'p-1';
ROLLBACK;
RESET ROLE;

-- no direct writes by an application role (42501), whatever it tries
SET ROLE regress_alice;
INSERT INTO idempotency.idempotency_key (owner, key, status, expires_at)
VALUES ('regress_alice', 'forged', 'completed', now() + interval '1 day');
\echo :LAST_ERROR_SQLSTATE
UPDATE idempotency.idempotency_key SET response = '"forged"' WHERE key = 'p-1';
\echo :LAST_ERROR_SQLSTATE
DELETE FROM idempotency.idempotency_key WHERE key = 'p-1';
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency._finish('p-1', '', 'completed', '"forged"', NULL, NULL);
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT response FROM idempotency.idempotency_key WHERE key = 'p-1';

-- settings are read when begin() needs them: a bad lock_wait is refused
-- then (the C edition refuses it at SET), and nothing is written
SET idempotency.lock_wait = '-5';
BEGIN;
INSERT INTO portable_effect VALUES ('before a bad setting');
SELECT outcome FROM idempotency.begin('p-2');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SET idempotency.lock_wait = 'soon';
SELECT outcome FROM idempotency.begin('p-2');
\echo :LAST_ERROR_SQLSTATE
RESET idempotency.lock_wait;
-- a bare number is in the setting's unit: default_ttl in seconds
SET idempotency.default_ttl = 90;
BEGIN;
SELECT outcome FROM idempotency.begin('p-3');
SELECT idempotency.complete('p-3', '{}');
COMMIT;
RESET idempotency.default_ttl;
SELECT expires_at - created_at AS ttl FROM idempotency.idempotency_key WHERE key = 'p-3';
SELECT count(*) AS effects FROM portable_effect;
SELECT count(*) AS p2_rows FROM idempotency.idempotency_key WHERE key = 'p-2';

-- a trigger that skips the key's row: the C edition's error (09000), not a
-- key that no duplicate could find
CREATE FUNCTION skip_row() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER skip BEFORE INSERT ON idempotency.idempotency_key
  FOR EACH ROW EXECUTE FUNCTION public.skip_row();
SELECT outcome FROM idempotency.begin('p-skipped');
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER skip ON idempotency.idempotency_key;
SELECT count(*) AS skipped_rows FROM idempotency.idempotency_key WHERE key = 'p-skipped';

-- the commit check does not fire for a lease (its row is meant to commit
-- in progress) and fires for a key begun after a savepoint was released
SELECT outcome FROM idempotency.begin('p-lease', lease => '1 hour');
BEGIN;
SAVEPOINT a;
SELECT outcome FROM idempotency.begin('p-released');
RELEASE SAVEPOINT a;
COMMIT;
\echo :LAST_ERROR_SQLSTATE
SELECT key, status FROM idempotency.idempotency_key WHERE key LIKE 'p-%' ORDER BY key;
DELETE FROM idempotency.idempotency_key WHERE key LIKE 'p-%';

-- once(), the text form (the calling form both editions accept): the
-- statement decides each argument's type; a text of more than one
-- statement is refused before anything in it runs (42601)
SELECT * FROM idempotency.once('p-once-1', '{"n": 1}',
  'INSERT INTO portable_effect (note) VALUES ($1 || $2::int) RETURNING note', 'once-', '7');
SELECT * FROM idempotency.once('p-once-1', '{"n": 1}',
  'INSERT INTO portable_effect (note) VALUES ($1 || $2::int) RETURNING note', 'once-', '7');
SELECT * FROM idempotency.once('p-once-2', NULL,
  'SELECT 1; INSERT INTO portable_effect (note) VALUES (''sneaked in'')');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.once('p-once-2', NULL, 'SELECT 1 INTO portable_nope');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.once('p-once-2', NULL, 'SELECT $1::int', '1', '2');
\echo :LAST_ERROR_SQLSTATE
-- a statement without RETURNING stores null
SELECT * FROM idempotency.once('p-once-3', NULL, 'DELETE FROM portable_effect WHERE note = $1', 'none such');
SELECT note FROM portable_effect ORDER BY note;
SELECT to_regclass('portable_nope') IS NULL AS no_table, count(*) AS p_once_2_rows
  FROM idempotency.idempotency_key WHERE key = 'p-once-2';
DELETE FROM idempotency.idempotency_key WHERE key LIKE 'p-once-%';
