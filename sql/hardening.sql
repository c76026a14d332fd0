-- hardening: whatever a DBA does to the extension's tables, the functions
-- work under PostgreSQL's rules or raise a clear error naming the table;
-- never a crash, never a value its column would refuse.  Read-only
-- transactions and parallel workers cannot store keys.  (Each DDL case
-- runs in a transaction that is rolled back.)

-- the key table starts empty, whatever ran before in this database: a
-- constraint a case adds must hold for the rows already there, and the
-- case is about the row the functions write, not about other files' rows
DELETE FROM idempotency.idempotency_key;

-- attempts as text: 0.3.0 crashed (read an int4 from a text column)
BEGIN;
ALTER TABLE idempotency.idempotency_key ALTER COLUMN attempts TYPE text;
SELECT outcome, attempts FROM idempotency.begin('h-attempts');
SELECT idempotency.complete('h-attempts', '{"x": 1}');
SELECT outcome, attempts, response FROM idempotency.begin('h-attempts');
SELECT key, attempts, pg_typeof(attempts) FROM idempotency.idempotency_key WHERE key = 'h-attempts';
ROLLBACK;

-- response as json: 0.3.0 stored jsonb's binary bytes into the json column
BEGIN;
ALTER TABLE idempotency.idempotency_key ALTER COLUMN response TYPE json;
SELECT outcome FROM idempotency.begin('h-json');
SELECT idempotency.complete('h-json', '{"b": 1, "a": 2}');
SELECT response::text FROM idempotency.idempotency_key WHERE key = 'h-json';
SELECT outcome, response FROM idempotency.begin('h-json');
ROLLBACK;

-- key varchar(5): 0.3.0 stored an 8-character key anyway
BEGIN;
ALTER TABLE idempotency.idempotency_key ALTER COLUMN key TYPE varchar(5);
SELECT outcome FROM idempotency.begin('12345678');
SELECT idempotency.complete('12345678', '{}');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- key as a domain with a CHECK: likewise
BEGIN;
CREATE DOMAIN short_key AS text CHECK (length(VALUE) <= 5);
ALTER TABLE idempotency.idempotency_key ALTER COLUMN key TYPE short_key;
SELECT outcome FROM idempotency.begin('12345678');
SELECT idempotency.complete('12345678', '{}');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- status varchar(3): 0.3.0 stored 'completed'
BEGIN;
ALTER TABLE idempotency.idempotency_key ALTER COLUMN status TYPE varchar(3);
SELECT outcome FROM idempotency.begin('h-status');
SELECT idempotency.complete('h-status', '{}');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- scope as name: 0.3.0 stored garbage, and the next begin() answered new
BEGIN;
ALTER TABLE idempotency.idempotency_key ALTER COLUMN scope TYPE name;
SELECT outcome FROM idempotency.begin('h-name', scope => 'orders');
SELECT idempotency.complete('h-name', '{"r": 1}', 'orders');
SELECT outcome, response FROM idempotency.begin('h-name', scope => 'orders');
SELECT scope, key FROM idempotency.idempotency_key WHERE key = 'h-name';
ROLLBACK;

-- expires_at as date: 0.3.0 stored year 5880797
BEGIN;
ALTER TABLE idempotency.idempotency_key ALTER COLUMN expires_at TYPE date;
SELECT outcome FROM idempotency.begin('h-date', ttl => '3 days');
SELECT idempotency.complete('h-date', '{}');
SELECT expires_at = (now() + interval '3 days')::date AS three_days_ahead
  FROM idempotency.idempotency_key WHERE key = 'h-date';
ROLLBACK;

-- created_at as timestamp: 0.3.0 stored UTC unconverted
BEGIN;
SET LOCAL timezone = 'America/New_York';
ALTER TABLE idempotency.idempotency_key ALTER COLUMN created_at TYPE timestamp;
SELECT outcome FROM idempotency.begin('h-local');
SELECT idempotency.complete('h-local', '{}');
SELECT created_at = now()::timestamp AS local_time
  FROM idempotency.idempotency_key WHERE key = 'h-local';
ROLLBACK;

-- request_hash as text: 0.3.0 stored invalid UTF-8; now the hex text,
-- which still compares as the same fingerprint
BEGIN;
ALTER TABLE idempotency.idempotency_key ALTER COLUMN request_hash TYPE text;
SELECT outcome FROM idempotency.begin('h-hash', '{"a": 1}');
SELECT idempotency.complete('h-hash', '{}');
SELECT request_hash = encode(idempotency.fingerprint('{"a": 1}'), 'hex') AS hex_text
  FROM (SELECT substr(request_hash, 3) AS request_hash FROM idempotency.idempotency_key
         WHERE key = 'h-hash') h;
SELECT outcome FROM idempotency.begin('h-hash', '{"a": 1}');
SELECT outcome FROM idempotency.begin('h-hash', '{"a": 2}');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- a column the extension needs is gone: a clear error naming the table
BEGIN;
ALTER TABLE idempotency.idempotency_key DROP COLUMN locked_until;
SELECT outcome FROM idempotency.begin('h-dropped');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- a DBA's CHECK constraint and trigger hold for the extension's rows
BEGIN;
ALTER TABLE idempotency.idempotency_key ADD CONSTRAINT short_keys CHECK (length(key) < 10);
SELECT outcome FROM idempotency.begin('0123456789');
\set VERBOSITY terse
SELECT idempotency.complete('0123456789', '{}');
\set VERBOSITY default
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
BEGIN;
CREATE TABLE hardening_audit (key text, status text);
CREATE FUNCTION hardening_audit_key() RETURNS trigger LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.hardening_audit VALUES (NEW.key, NEW.status); RETURN NEW; END$$;
CREATE TRIGGER audit AFTER INSERT ON idempotency.idempotency_key
  FOR EACH ROW EXECUTE FUNCTION hardening_audit_key();
SELECT outcome FROM idempotency.begin('h-audited');
SELECT idempotency.complete('h-audited', '{}');
SELECT * FROM hardening_audit;
ROLLBACK;
-- a trigger that skips the row: complete() fails rather than lose the key
BEGIN;
CREATE FUNCTION skip_row() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$;
CREATE TRIGGER skip BEFORE INSERT ON idempotency.idempotency_key
  FOR EACH ROW EXECUTE FUNCTION skip_row();
SELECT outcome FROM idempotency.begin('h-skipped');
SELECT idempotency.complete('h-skipped', '{}');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
-- a trigger that skips the delete: forget() fails (09000) rather than say
-- false, which means there was no key; the key stands and is replayed
BEGIN;
SELECT outcome FROM idempotency.begin('h-kept');
SELECT idempotency.complete('h-kept', '{"kept": true}');
COMMIT;
BEGIN;
CREATE FUNCTION skip_delete() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$;
CREATE TRIGGER skip_delete BEFORE DELETE ON idempotency.idempotency_key
  FOR EACH ROW EXECUTE FUNCTION skip_delete();
SELECT idempotency.forget('h-kept');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
SELECT outcome, response FROM idempotency.begin('h-kept');

-- tokens: the token returned is the one stored, whatever the column type;
-- a trigger that skips the row is an error, not a token that does not exist
BEGIN;
ALTER TABLE idempotency.token ALTER COLUMN token TYPE text;
SELECT idempotency.issue_token() AS t \gset
SELECT token = :'t' AS returned_is_stored FROM idempotency.token;
ROLLBACK;
BEGIN;
CREATE FUNCTION skip_token() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$;
CREATE TRIGGER skip BEFORE INSERT ON idempotency.token
  FOR EACH ROW EXECUTE FUNCTION skip_token();
SELECT idempotency.issue_token();
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- read-only transactions: begin() of new work is refused with the key
-- named, and nothing is written (0.3.0 committed key rows here)
BEGIN READ ONLY;
SELECT outcome FROM idempotency.begin('h-ro');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
BEGIN READ ONLY;
SELECT outcome FROM idempotency.begin('h-ro-lease', lease => '1 minute');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
SET default_transaction_read_only = on;
BEGIN;
SELECT outcome FROM idempotency.begin('h-ro-default');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
RESET default_transaction_read_only;
SELECT count(*) AS written FROM idempotency.idempotency_key WHERE key LIKE 'h-ro%';
-- a replay needs no write: it works in a read-only transaction
BEGIN;
SELECT outcome FROM idempotency.begin('h-done');
SELECT idempotency.complete('h-done', '"done"');
COMMIT;
BEGIN READ ONLY;
SELECT outcome, response FROM idempotency.begin('h-done');
COMMIT;

-- parallel workers: a PARALLEL SAFE wrapper could escape the commit check
CREATE FUNCTION parallel_begin(k text) RETURNS text LANGUAGE sql PARALLEL SAFE
  AS $$ SELECT outcome FROM idempotency.begin(k) $$;
-- (force_parallel_mode is named debug_parallel_query since 16: set whichever exists)
SELECT name IS NOT NULL AS forced, set_config(name, 'on', false) AS parallel
  FROM pg_catalog.pg_settings WHERE name IN ('force_parallel_mode', 'debug_parallel_query');
SET parallel_leader_participation = off;
SELECT parallel_begin('h-parallel');
\echo :LAST_ERROR_SQLSTATE
SELECT set_config(name, 'off', false) AS parallel
  FROM pg_catalog.pg_settings WHERE name IN ('force_parallel_mode', 'debug_parallel_query');
RESET parallel_leader_participation;
SELECT count(*) AS written FROM idempotency.idempotency_key WHERE key = 'h-parallel';
DROP FUNCTION parallel_begin(text);
DELETE FROM idempotency.idempotency_key WHERE key LIKE 'h-%';

-- found in review: lookup() read columns in the types it expects (an enum
-- status crashed it, a numeric attempts came back as a pointer)
BEGIN;
SELECT outcome FROM idempotency.begin('h-lookup');
SELECT idempotency.complete('h-lookup', '"done"');
CREATE TYPE idempotency_status AS ENUM ('in_progress', 'completed', 'failed');
ALTER TABLE idempotency.idempotency_key
  ALTER COLUMN status TYPE idempotency_status USING status::idempotency_status,
  ALTER COLUMN attempts TYPE numeric;
SELECT status, attempts, retry_after FROM idempotency.lookup('h-lookup');
SELECT outcome, response FROM idempotency.begin('h-lookup');
ROLLBACK;

-- found in review: a null status (NOT NULL dropped by a DBA) is a clear
-- error, not a crash of the fast path
BEGIN;
ALTER TABLE idempotency.idempotency_key ALTER COLUMN status DROP NOT NULL;
INSERT INTO idempotency.idempotency_key (owner, scope, key, status, expires_at)
  VALUES (current_user::regrole, '', 'h-null', NULL, now() + interval '1 hour');
SELECT outcome FROM idempotency.begin('h-null');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
BEGIN;
ALTER TABLE idempotency.idempotency_key ALTER COLUMN status DROP NOT NULL;
INSERT INTO idempotency.idempotency_key (owner, scope, key, status, expires_at)
  VALUES (current_user::regrole, '', 'h-null', NULL, now() + interval '1 hour');
SELECT * FROM idempotency.lookup('h-null');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- found in review: once() decides an untyped argument's type under the
-- search_path of the call, not of the first call (49.90 went into an
-- integer column of another schema as 50)
CREATE SCHEMA h_s1;
CREATE SCHEMA h_s2;
CREATE TABLE h_s1.t (v numeric);
CREATE TABLE h_s2.t (v integer);
SET search_path = h_s1;
SELECT outcome, response FROM idempotency.once('h-path-1', NULL, 'INSERT INTO t VALUES ($1) RETURNING v', '49.90');
SET search_path = h_s2;
SELECT outcome, response FROM idempotency.once('h-path-2', NULL, 'INSERT INTO t VALUES ($1) RETURNING v', '49.90');
\echo :LAST_ERROR_SQLSTATE
RESET search_path;
SELECT (SELECT count(*) FROM h_s1.t) AS in_s1, (SELECT count(*) FROM h_s2.t) AS in_s2;
DROP SCHEMA h_s1 CASCADE;
DROP SCHEMA h_s2 CASCADE;
DELETE FROM idempotency.idempotency_key WHERE key LIKE 'h-%';
