-- schema: a role with CREATE on the database
-- can create schema idempotency before the extension; CREATE EXTENSION
-- would take that schema (it uses an existing schema named in the control
-- file as it is), and its owner could drop our objects and create its own
-- beside them.  The install and update scripts refuse a schema owned by a
-- role that is not a superuser, on which such a role may create, or that
-- holds objects of such a role (42P06), and nothing is left behind.  The
-- key statements run as the extension's owner (pg_extension.extowner),
-- never as the schema's owner.
SELECT current_database() AS regress_db \gset
CREATE DATABASE schema;
CREATE ROLE regress_squatter NOLOGIN;
GRANT CREATE ON DATABASE schema TO regress_squatter;
\c schema
-- the refusals' CONTEXT (PostgreSQL 18 prints the script's DO block and its
-- line number in the install script, which moves with every edit of it)
\set SHOW_CONTEXT never
SET ROLE regress_squatter;
CREATE SCHEMA idempotency;
RESET ROLE;
CREATE EXTENSION idempotency;
\echo :LAST_ERROR_SQLSTATE
-- nothing left behind: no extension, and the squatter's schema is empty
SELECT count(*) AS extensions FROM pg_extension WHERE extname = 'idempotency';
SELECT (SELECT count(*) FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace) AS relations,
       (SELECT count(*) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace) AS functions,
       (SELECT count(*) FROM pg_type WHERE typnamespace = 'idempotency'::regnamespace) AS types;
-- a superuser's schema on which another role may create is refused too
ALTER SCHEMA idempotency OWNER TO CURRENT_USER;
GRANT CREATE ON SCHEMA idempotency TO regress_squatter;
CREATE EXTENSION idempotency;
\echo :LAST_ERROR_SQLSTATE
-- the squatter put an overload of begin() there while it could: after the
-- REVOKE the schema is the superuser's, but the function is still its own
-- ("begin" quoted: psql reads CREATE FUNCTION ... BEGIN as a BEGIN ATOMIC body)
SET ROLE regress_squatter;
CREATE FUNCTION idempotency."begin"(key int) RETURNS text LANGUAGE sql AS $$ SELECT 'mine' $$;
RESET ROLE;
REVOKE CREATE ON SCHEMA idempotency FROM regress_squatter;
CREATE EXTENSION idempotency;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS extensions FROM pg_extension WHERE extname = 'idempotency';
DROP FUNCTION idempotency."begin"(int);
-- a superuser's schema is taken (what a pg_dump restore does: CREATE SCHEMA,
-- then CREATE EXTENSION), and so is the one DROP EXTENSION leaves behind
CREATE EXTENSION idempotency;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';

-- keys work as the extension's owner even when the schema changes hands
-- (as a 0.4.0 installed into another role's schema has it)
ALTER SCHEMA idempotency OWNER TO regress_squatter;
BEGIN;
SELECT outcome FROM idempotency.begin('review-schema-key');
SELECT idempotency.complete('review-schema-key', '{"ok": true}');
COMMIT;
SELECT outcome, response FROM idempotency.begin('review-schema-key');
SELECT key, status FROM idempotency.idempotency_key;

-- the update to 0.5.0 refuses such a schema, and stays at 0.4.0
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency VERSION '0.4.0';
ALTER EXTENSION idempotency UPDATE TO '0.5.0';
\echo :LAST_ERROR_SQLSTATE
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
ALTER SCHEMA idempotency OWNER TO CURRENT_USER;
ALTER EXTENSION idempotency UPDATE TO '0.5.0';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';

\c :regress_db
DROP DATABASE schema;
DROP ROLE regress_squatter;
