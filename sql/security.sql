-- security: roles never see or touch each other's keys; a hostile
-- search_path changes nothing; plain roles cannot write the table directly.
\i sql/include/roles.sql

-- the same key used by two roles is two independent keys
SET ROLE regress_alice;
BEGIN;
SELECT outcome FROM idempotency.begin('shared-key', '{"who": "alice"}');
SELECT idempotency.complete('shared-key', '"alice''s answer"');
COMMIT;
SET ROLE regress_bob;
-- bob's request differs, yet this is no IK001: alice's key is not his
BEGIN;
SELECT outcome, response FROM idempotency.begin('shared-key', '{"who": "bob"}');
ROLLBACK;
BEGIN;
SELECT outcome FROM idempotency.begin('shared-key', '{"who": "bob"}');
SELECT idempotency.complete('shared-key', '"bob''s answer"');
COMMIT;
SELECT outcome, response FROM idempotency.begin('shared-key');
-- bob sees only his own rows
SELECT owner, key, response FROM idempotency.idempotency_key;
-- and cannot write the table directly
INSERT INTO idempotency.idempotency_key (owner, key, status, expires_at)
  VALUES ('regress_alice', 'forged', 'completed', now() + '1 day');
\echo :LAST_ERROR_SQLSTATE
UPDATE idempotency.idempotency_key SET response = '"forged"';
\echo :LAST_ERROR_SQLSTATE
DELETE FROM idempotency.idempotency_key;
\echo :LAST_ERROR_SQLSTATE
-- bob cannot complete a key alice holds: only the transaction's own role can
RESET ROLE;
SET ROLE regress_alice;
BEGIN;
SELECT outcome FROM idempotency.begin('alice-only');
SET LOCAL ROLE regress_bob;
SELECT idempotency.complete('alice-only', '"bob was here"');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
RESET ROLE;
SET ROLE regress_alice;
SELECT owner, key, response FROM idempotency.idempotency_key ORDER BY key;
RESET ROLE;
-- a role with quotes and spaces in its name works and is kept apart
SET ROLE "regress Mixed ""Case"" role";
BEGIN;
SELECT outcome FROM idempotency.begin('shared-key');
SELECT idempotency.complete('shared-key', '"mixed"');
COMMIT;
SELECT owner, key, response FROM idempotency.idempotency_key;
RESET ROLE;
SELECT owner, response FROM idempotency.idempotency_key WHERE key = 'shared-key' ORDER BY response::text;

-- a hostile search_path: a schema in front with its own table, functions
-- and operators named like ours and like pg_catalog's
CREATE SCHEMA evil;
CREATE TABLE evil.idempotency_key (LIKE idempotency.idempotency_key);
CREATE FUNCTION evil.hijack(regrole, regrole) RETURNS boolean LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'hijacked regrole ='; END $$;
CREATE OPERATOR evil.= (LEFTARG = regrole, RIGHTARG = regrole, FUNCTION = evil.hijack);
CREATE FUNCTION evil.hijack(text, text) RETURNS boolean LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'hijacked text ='; END $$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.hijack);
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT 'epoch'::timestamptz $$;
CREATE FUNCTION evil.octet_length(bytea) RETURNS int LANGUAGE sql AS $$ SELECT 32 $$;
-- a fresh session, so the extension prepares its statements under this path
\c
SET search_path = evil, public, pg_catalog;
SELECT 'x'::text = 'y'::text AS "operator is hijacked here";
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SELECT outcome FROM idempotency.begin('hostile', '{"a": 1}');
SELECT idempotency.complete('hostile', '"safe"');
COMMIT;
SELECT outcome, response FROM idempotency.begin('hostile', '{"a": 1}');
BEGIN;
SELECT outcome FROM idempotency.begin('hostile-2');
SELECT idempotency.fail('hostile-2', '"safe too"', retryable => false);
COMMIT;
SELECT outcome, response FROM idempotency.begin('hostile-2');
SELECT count(*) AS evil_rows FROM evil.idempotency_key;
RESET search_path;
SELECT key, response, created_at > 'epoch' AS real_time
  FROM idempotency.idempotency_key WHERE key LIKE 'hostile%' ORDER BY key;
DROP SCHEMA evil CASCADE;

-- every user-settable idempotency.* parameter has SET granted to PUBLIC, so
-- that a role may store it (ALTER ROLE/FUNCTION/PROCEDURE ... SET) before
-- the library is loaded in its session, and restore a routine that sets it;
-- none of the others is granted
SELECT s.name, s.context,
       EXISTS (SELECT FROM pg_parameter_acl AS a, aclexplode(a.paracl) AS x
                WHERE a.parname = s.name AND x.grantee = 0 AND x.privilege_type = 'SET') AS public_set
  FROM pg_settings AS s
 WHERE s.name LIKE 'idempotency.%' ORDER BY s.name;
