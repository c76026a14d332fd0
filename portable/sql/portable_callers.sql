-- portable_callers: what a caller cannot make the portable edition do,
-- each error path with its SQLSTATE and that nothing was written: commit a
-- key begun without a lease unfinished by renewing it, run a statement
-- prepared under once()'s name with another text, act on the keys of a
-- role that took the name of the session's renamed role; and what it must
-- not refuse: a request nested deeper than PL/pgSQL recursion reaches;
-- and a default_ttl the C edition refuses at SET.
\set VERBOSITY terse

-- renew() of a key this transaction began without a lease: IK004 (the C
-- edition has no row to renew before complete()); the commit check still
-- refuses the unfinished key, and nothing is stored
SET ROLE regress_alice;
BEGIN;
SELECT outcome FROM idempotency.begin('c-renew');
SELECT idempotency.renew('c-renew', '1 hour', 1) IS NOT NULL AS renewed;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN;
SELECT outcome FROM idempotency.begin('c-renew');
SAVEPOINT s;
SELECT idempotency.renew('c-renew', '1 hour', 1) IS NOT NULL AS renewed;
ROLLBACK TO SAVEPOINT s;
COMMIT;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored FROM idempotency.idempotency_key WHERE key = 'c-renew';
-- a retry begun without a lease over a retryable failure: the same
BEGIN;
SELECT outcome FROM idempotency.begin('c-renew');
SELECT idempotency.fail('c-renew', '"later"', retryable => true);
COMMIT;
BEGIN;
SELECT outcome, attempts FROM idempotency.begin('c-renew');
SELECT idempotency.renew('c-renew', '1 hour', 2) IS NOT NULL AS renewed;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT status, attempts, locked_until FROM idempotency.idempotency_key WHERE key = 'c-renew';
-- a lease begun in this transaction is still renewed
BEGIN;
SELECT outcome FROM idempotency.begin('c-lease', lease => '1 minute');
SELECT idempotency.renew('c-lease', '1 hour', 1) > now() + interval '59 minutes' AS renewed;
COMMIT;
SELECT status, locked_until > now() + interval '59 minutes' AS leased
  FROM idempotency.idempotency_key WHERE key = 'c-lease';
RESET ROLE;
DELETE FROM idempotency.idempotency_key WHERE key IN ('c-renew', 'c-lease');

-- once() runs its own statement, not one prepared under its name with
-- another text (prepared statements outlive a transaction: under a pooler
-- in transaction mode the server session may bring another client's)
SET ROLE regress_alice;
SELECT pg_catalog.format('PREPARE %I AS SELECT %L::text AS planted', 'idempotency_once_r_' || md5(concat_ws(E'\n', current_user, current_setting('search_path'), 'SELECT $1::int + 1 AS n')),
                         'another statement') \gexec
SELECT pg_catalog.format('PREPARE %I AS SELECT %L::text AS planted', 'idempotency_once_n_' || md5(concat_ws(E'\n', current_user, current_setting('search_path'), 'SELECT $1::int + 1 AS n')),
                         'another statement') \gexec
SELECT outcome, response FROM idempotency.once('c-once', '{}', 'SELECT $1::int + 1 AS n', '41');
SELECT outcome, response FROM idempotency.once('c-once', '{}', 'SELECT $1::int + 1 AS n', '41');
SELECT name LIKE 'idempotency_once_r_%' AS kept, statement LIKE '%planted%' AS planted
  FROM pg_prepared_statements WHERE name LIKE 'idempotency_once_%' ORDER BY name;
-- a statement without RETURNING under its other name
SELECT pg_catalog.format('PREPARE %I AS SELECT %L::text AS planted', 'idempotency_once_n_' || md5(concat_ws(E'\n', current_user, current_setting('search_path'), 'UPDATE portable_callers_t SET n = n + 1')),
                         'another statement') \gexec
RESET ROLE;
CREATE TABLE portable_callers_t (n int);
INSERT INTO portable_callers_t VALUES (0);
GRANT SELECT, UPDATE ON portable_callers_t TO regress_alice;
SET ROLE regress_alice;
SELECT outcome, response FROM idempotency.once('c-once-2', '{}', 'UPDATE portable_callers_t SET n = n + 1');
SELECT n FROM portable_callers_t;
SELECT count(*) FILTER (WHERE statement LIKE '%planted%') AS planted
  FROM pg_prepared_statements WHERE name LIKE 'idempotency_once_%';
DEALLOCATE ALL;
RESET ROLE;
DROP TABLE portable_callers_t;
DELETE FROM idempotency.idempotency_key WHERE key IN ('c-once', 'c-once-2');

-- A replay by once() is refused, as in the C edition, when its statement
-- cannot be analysed for the role and search_path it runs under, or its
-- table was dropped: after DEALLOCATE ALL (or a pooler's
-- server_reset_query) a statement alice ran is analysed again for bob
-- (42501), under another search_path (42P01), and over a dropped table
-- (42P01)
CREATE SCHEMA portable_callers_priv AUTHORIZATION regress_alice;
CREATE TABLE portable_callers_priv.t (n int);
INSERT INTO portable_callers_priv.t VALUES (7);
ALTER TABLE portable_callers_priv.t OWNER TO regress_alice;
SET ROLE regress_bob;
SELECT outcome, response FROM idempotency.once('c-scope-b', '{}', 'SELECT 1 AS n');
SET ROLE regress_alice;
SELECT outcome, response FROM idempotency.once('c-scope-a', '{}', 'SELECT n FROM portable_callers_priv.t');
DEALLOCATE ALL;
SET ROLE regress_bob;
SELECT outcome, response FROM idempotency.once('c-scope-b', '{}', 'SELECT n FROM portable_callers_priv.t');
\echo :LAST_ERROR_SQLSTATE
SET ROLE regress_alice;
SET search_path = portable_callers_priv;
SELECT outcome, response FROM idempotency.once('c-scope-a2', '{}', 'SELECT n FROM t');
RESET search_path;
DEALLOCATE ALL;
SELECT outcome, response FROM idempotency.once('c-scope-a2', '{}', 'SELECT n FROM t');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DROP SCHEMA portable_callers_priv CASCADE;
SET ROLE regress_alice;
DEALLOCATE ALL;
SELECT outcome, response FROM idempotency.once('c-scope-a', '{}', 'SELECT n FROM portable_callers_priv.t');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DEALLOCATE ALL;
DELETE FROM idempotency.idempotency_key WHERE key LIKE 'c-scope%';

-- A statement kept by one role is not another role's: the C edition
-- analyses it again for bob, who may read the table but not look up its
-- schema (42501, nothing run, nothing written); the portable edition must
-- not run alice's kept statement for bob
CREATE SCHEMA portable_callers_priv2 AUTHORIZATION regress_alice;
CREATE TABLE portable_callers_priv2.t (n int);
INSERT INTO portable_callers_priv2.t VALUES (55);
ALTER TABLE portable_callers_priv2.t OWNER TO regress_alice;
GRANT SELECT ON portable_callers_priv2.t TO regress_bob;
SET ROLE regress_alice;
SELECT outcome, response FROM idempotency.once('c-kept-a', '{}', 'SELECT n FROM portable_callers_priv2.t');
SET ROLE regress_bob;
SELECT outcome, response FROM idempotency.once('c-kept-b', '{}', 'SELECT n FROM portable_callers_priv2.t');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT count(*) AS written FROM idempotency.idempotency_key WHERE key = 'c-kept-b';
DROP SCHEMA portable_callers_priv2 CASCADE;
DEALLOCATE ALL;
DELETE FROM idempotency.idempotency_key WHERE key LIKE 'c-kept%';

-- once() under a search_path whose first schema has its own = on text:
-- once() compares with pg_catalog's; the statement is checked, run and
-- stored, the hostile operator never called
CREATE SCHEMA portable_callers_evil;
CREATE FUNCTION portable_callers_evil.texteq(text, text) RETURNS boolean LANGUAGE plpgsql
AS $$ BEGIN RAISE EXCEPTION 'the hostile = was called'; END $$;
CREATE OPERATOR portable_callers_evil.= (leftarg = text, rightarg = text, function = portable_callers_evil.texteq);
SET search_path = portable_callers_evil, public, pg_catalog;
SELECT outcome, response FROM idempotency.once('c-evil', NULL, 'SELECT 41 + 1 AS answer');
SELECT outcome, response FROM idempotency.once('c-evil', NULL, 'SELECT 41 + 1 AS answer');
RESET search_path;
DROP SCHEMA portable_callers_evil CASCADE;
DELETE FROM idempotency.idempotency_key WHERE key = 'c-evil';

-- A session whose SET ROLE role is renamed, and whose old name a new role
-- takes, does not act on the new role's keys: 42501, nothing replayed or
-- written.  The session user must be no superuser (one may act as any
-- role): a pool's login role that is a member of the tenants' roles.
CREATE ROLE regress_pool NOLOGIN;
CREATE ROLE regress_tenant NOLOGIN;
GRANT regress_tenant TO regress_pool;
CREATE EXTENSION dblink;
SELECT dblink_connect('admin', pg_catalog.format('host=%s port=%s dbname=%s user=postgres',
       current_setting('unix_socket_directories'), current_setting('port'), current_database()));
SET SESSION AUTHORIZATION regress_pool;
SET ROLE regress_tenant;
SELECT outcome FROM idempotency.begin('c-tenant', lease => '1 hour');
SELECT dblink_exec('admin', 'ALTER ROLE regress_tenant RENAME TO regress_tenant_old');
-- renamed, and no role has the name yet: 42501 as well (not "role does
-- not exist"), nothing written
SELECT outcome FROM idempotency.begin('c-secret');
\echo :LAST_ERROR_SQLSTATE
SELECT dblink_exec('admin', 'CREATE ROLE regress_tenant NOLOGIN');
SELECT * FROM dblink('admin', $$SET ROLE regress_tenant;
                                SELECT idempotency.begin('c-secret');
                                SELECT idempotency.complete('c-secret', '"the new role''s"');
                                SELECT outcome FROM idempotency.begin('c-secret')$$) AS t(outcome text);
SELECT outcome, response FROM idempotency.begin('c-secret');
\echo :LAST_ERROR_SQLSTATE
SELECT status FROM idempotency.lookup('c-secret');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.forget('c-secret');
\echo :LAST_ERROR_SQLSTATE
-- SET ROLE again: the session's own (renamed) role and its key
SET ROLE regress_tenant_old;
SELECT status, attempts FROM idempotency.lookup('c-tenant');
SELECT count(*) FROM idempotency.lookup('c-secret');
RESET SESSION AUTHORIZATION;
SELECT owner, key, status, response FROM idempotency.idempotency_key
 WHERE key IN ('c-tenant', 'c-secret') ORDER BY key;
DELETE FROM idempotency.idempotency_key WHERE key IN ('c-tenant', 'c-secret');
SELECT dblink_disconnect('admin');
DROP EXTENSION dblink;
DROP ROLE regress_tenant, regress_tenant_old, regress_pool;

-- A request nested deeper than PL/pgSQL's recursion reaches (jsonb takes
-- it, the C edition hashes it): hashed by the same encoding, not 54001.
-- The expected hash is built from the encoding's bytes (an array: tag [,
-- its element count; the innermost one empty; each closed by ])
SELECT encode(idempotency.fingerprint((repeat('[', 1000) || repeat(']', 1000))::jsonb), 'hex')
     = encode(sha256(decode(repeat('5b00000001', 999) || '5b00000000' || repeat('5d00000000', 1000), 'hex')), 'hex')
       AS deep_array_hash;
-- the same for objects, and the shallow encoding agrees with the flat one
SELECT idempotency.fingerprint(('{"a": ' || repeat('{"a": ', 499) || '1' || repeat('}', 500))::jsonb)
     = sha256(decode(repeat('7b000000016b0000000161', 500) || '6e0000000131' || repeat('7d00000000', 500), 'hex'))
       AS deep_object_hash;
SELECT count(*) AS docs, count(*) FILTER (WHERE idempotency._fp_flat(d.j) IS DISTINCT FROM idempotency._fp_value(d.j)) AS differ
  FROM (VALUES ('{"amount": 100.50, "currency": "EUR", "items": [1, 2.0, {"a": null, "bb": true, "c": false}], "x": ""}'::jsonb),
               ('[]'), ('{}'), ('"s"'), ('1e3'), ('-0.000'), ('null'), ('true'), ('[[[[]]]]'),
               ('{"é": "ü\"\\\n\u0001", "": {"": []}}'), ('[1, [2, [3, "x"]], {"k": [{"z": 1}]}]'),
               ('{"a:": "b:", "\"": [":", "]", "}"]}'), ('[-1.5e-3, 12345678901234567890.10]'),
               (('{"k": "\ud83d\ude00", "long": "' || repeat('x', 2000) || '"}')::jsonb)) AS d(j);
SET ROLE regress_alice;
BEGIN;
SELECT outcome FROM idempotency.begin('c-deep', (repeat('[', 1000) || repeat(']', 1000))::jsonb);
SELECT idempotency.complete('c-deep', '"deep"');
COMMIT;
SELECT outcome, response FROM idempotency.begin('c-deep', (repeat('[', 1000) || repeat(']', 1000))::jsonb);
SELECT outcome FROM idempotency.begin('c-deep', (repeat('[', 999) || '1' || repeat(']', 999))::jsonb);
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DELETE FROM idempotency.idempotency_key WHERE key = 'c-deep';

-- idempotency.default_ttl below 1 s (the C edition refuses it at SET; here
-- a placeholder takes any text): 22023 when read, nothing stored; a key
-- that expired as it was made would be new again, and its work done twice
SET ROLE regress_alice;
SET idempotency.default_ttl = 0;
BEGIN;
SELECT outcome FROM idempotency.begin('c-ttl');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SET idempotency.default_ttl = '400ms';
SELECT idempotency.first_seen('c-ttl', 'm1');
\echo :LAST_ERROR_SQLSTATE
-- at least 1 s, rounded to whole seconds as the C edition's setting is
SET idempotency.default_ttl = '600ms';
BEGIN;
SELECT outcome FROM idempotency.begin('c-ttl');
SELECT idempotency.complete('c-ttl', '"done"');
COMMIT;
SELECT expires_at - created_at AS lifetime FROM idempotency.idempotency_key WHERE key = 'c-ttl';
RESET idempotency.default_ttl;
RESET ROLE;
SELECT count(*) AS stored FROM idempotency.seen_message WHERE scope = 'c-ttl';
DELETE FROM idempotency.idempotency_key WHERE key = 'c-ttl';

-- idempotency.max_key_length outside 1 .. 1024 (the C edition refuses it at
-- SET; here a placeholder takes any text): 22023 when a key is checked,
-- nothing stored
SET ROLE regress_alice;
SET idempotency.max_key_length = 2000;
SELECT outcome FROM idempotency.begin(repeat('k', 1500));
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.derive_key('c-max', 'step');
\echo :LAST_ERROR_SQLSTATE
-- a key within 1024 bytes is not checked further, with a ttl or lease as
-- without one (rolled back: nothing stored)
BEGIN;
SELECT outcome FROM idempotency.begin('c-max');
SELECT outcome FROM idempotency.begin('c-max-ttl', ttl => '1 hour');
SELECT outcome FROM idempotency.begin('c-max-lease', lease => '1 hour');
ROLLBACK;
SET idempotency.max_key_length = 0;
SELECT outcome FROM idempotency.begin('c-max');
\echo :LAST_ERROR_SQLSTATE
RESET idempotency.max_key_length;
RESET ROLE;
SELECT count(*) AS stored FROM idempotency.idempotency_key WHERE key IN ('c-max', repeat('k', 1500));
