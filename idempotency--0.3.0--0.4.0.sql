/* idempotency--0.3.0--0.4.0.sql: update from 0.3.0 to 0.4.0 */

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.4.0'" to load this file. \quit

-- ---------------------------------------------------------------------
-- The key guard: writes under the executor's rules, the lock namespace
-- ---------------------------------------------------------------------

-- ---------------------------------------------------------------------
-- Write helpers
-- ---------------------------------------------------------------------

-- ---------------------------------------------------------------------
-- One round trip: once(), lookup(), HTTP responses
-- ---------------------------------------------------------------------
-- once(): begin(), the work and complete() in one statement (src/once.c).
-- Two forms: VARIADIC text[] takes untyped bind parameters (node-postgres
-- sends all of its parameters so, psycopg its strings); VARIADIC "any"
-- takes typed ones.  A string argument gets the type the statement decides.
-- SECURITY INVOKER: the work runs with the caller's privileges, row-level
-- security and search_path.
CREATE TYPE idempotency.once_result AS (
    outcome  pg_catalog.text,
    response pg_catalog.jsonb
);

CREATE FUNCTION idempotency.once(
    key     pg_catalog.text,
    request pg_catalog.jsonb,
    sql     pg_catalog.text,
    VARIADIC args pg_catalog.text[] DEFAULT '{}')
RETURNS idempotency.once_result
AS 'MODULE_PATHNAME', 'idempotency_once_text'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.once(pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, pg_catalog.text[]) IS
'Guarded request in one statement: run sql with args as the caller and store its result (new/retry), or return the stored result (replay); string arguments take the type the statement gives them';

CREATE FUNCTION idempotency.once(
    key     pg_catalog.text,
    request pg_catalog.jsonb,
    sql     pg_catalog.text,
    VARIADIC args "any")
RETURNS idempotency.once_result
AS 'MODULE_PATHNAME', 'idempotency_once_any'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.once(pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, "any") IS
'Guarded request in one statement, typed arguments: run sql with args as the caller and store its result (new/retry), or return the stored result (replay)';

-- lookup(): what a program needs to decide when to retry; reads only.
CREATE TYPE idempotency.lookup_result AS (
    status       pg_catalog.text,
    attempts     pg_catalog.int4,
    created_at   pg_catalog.timestamptz,
    updated_at   pg_catalog.timestamptz,
    expires_at   pg_catalog.timestamptz,
    locked_until pg_catalog.timestamptz,
    retry_after  pg_catalog.int4
);

CREATE FUNCTION idempotency.lookup(
    key   pg_catalog.text,
    scope pg_catalog.text DEFAULT '')
RETURNS SETOF idempotency.lookup_result
AS 'MODULE_PATHNAME', 'idempotency_lookup'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION idempotency.lookup(pg_catalog.text, pg_catalog.text) IS
'The caller''s key, if live: status, attempts, timestamps and retry_after (seconds until a retry makes sense; NULL when finished); no lock, no write';

-- http_response(): the byte-exact HTTP replay convention on top of response
CREATE FUNCTION idempotency.http_response(
    status  pg_catalog.int4,
    body    pg_catalog.text,
    headers pg_catalog.jsonb DEFAULT '{}')
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idempotency_http_response'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION idempotency.http_response(pg_catalog.int4, pg_catalog.text, pg_catalog.jsonb) IS
'{"status": s, "headers": {...}, "body": "exact text"}: a response to replay byte for byte (response->>''body'' is the body as given)';

CREATE FUNCTION idempotency.http_response(
    status  pg_catalog.int4,
    body    pg_catalog.bytea,
    headers pg_catalog.jsonb DEFAULT '{}')
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idempotency_http_response_bytea'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION idempotency.http_response(pg_catalog.int4, pg_catalog.bytea, pg_catalog.jsonb) IS
'Like http_response(int, text, jsonb) for a binary body: "body" when it is valid text without NUL, else "body_base64"';
