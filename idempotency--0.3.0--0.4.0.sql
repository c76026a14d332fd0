/* idempotency--0.3.0--0.4.0.sql: update from 0.3.0 to 0.4.0 */

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.4.0'" to load this file. \quit

-- ---------------------------------------------------------------------
-- The key guard: writes under the executor's rules, the lock namespace
-- ---------------------------------------------------------------------
-- The key lock's secret.  The lock of a key (pg_locks: advisory, objsubid
-- 18756) is named by a keyed hash (SipHash-2-4) of (role, scope, key) with
-- this per-database secret, so no role can craft a key whose lock collides
-- with another role's key, or recognise another role's key in pg_locks.
-- Only the extension's owner can read it; it is not dumped (a restored
-- database gets a new one).  Changing it while keys are in flight lets two
-- sessions hold the same key until they finish it: change it (UPDATE, a
-- trigger tells every session) only while no keys are in flight.
CREATE TABLE idempotency.lock_secret (
    secret pg_catalog.bytea NOT NULL
        CONSTRAINT lock_secret_length CHECK (pg_catalog.length(secret) OPERATOR(pg_catalog.=) 16)
);
CREATE UNIQUE INDEX lock_secret_one_row ON idempotency.lock_secret ((true));
COMMENT ON TABLE idempotency.lock_secret IS
'Secret key of the hash that names key locks; readable by the extension owner only';
REVOKE ALL ON idempotency.lock_secret FROM PUBLIC;
INSERT INTO idempotency.lock_secret (secret)
SELECT pg_catalog.substr(pg_catalog.sha256(
           pg_catalog.uuid_send(pg_catalog.gen_random_uuid()) OPERATOR(pg_catalog.||)
           pg_catalog.uuid_send(pg_catalog.gen_random_uuid())), 1, 16);
-- a changed secret reaches every backend at its next transaction
CREATE FUNCTION idempotency.lock_secret_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idempotency_lock_secret_changed'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.lock_secret_changed() IS
'Trigger: makes every session read idempotency.lock_secret again at its next transaction';
REVOKE ALL ON FUNCTION idempotency.lock_secret_changed() FROM PUBLIC;
CREATE TRIGGER lock_secret_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.lock_secret
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.lock_secret_changed();

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

-- ---------------------------------------------------------------------
-- Observability
-- ---------------------------------------------------------------------
-- Counters per database, role and scope, kept in shared memory when the
-- library is preloaded (src/stats.c).  Column order is the C order.
CREATE FUNCTION idempotency.stats(
    OUT dbid              pg_catalog.oid,
    OUT userid            pg_catalog.oid,
    OUT scope             pg_catalog.text,
    OUT begin_new         pg_catalog.int8,
    OUT begin_retry       pg_catalog.int8,
    OUT begin_replay      pg_catalog.int8,
    OUT completed         pg_catalog.int8,
    OUT failed_retryable  pg_catalog.int8,
    OUT failed_final      pg_catalog.int8,
    OUT ik001_reused      pg_catalog.int8,
    OUT ik002_in_progress pg_catalog.int8,
    OUT ik004_not_held    pg_catalog.int8,
    OUT waits             pg_catalog.int8,
    OUT lease_takeovers   pg_catalog.int8,
    OUT zombies_refused   pg_catalog.int8,
    OUT purged            pg_catalog.int8,
    OUT forgotten         pg_catalog.int8,
    OUT renewed           pg_catalog.int8,
    OUT wait_total_ms     pg_catalog.float8,
    OUT wait_max_ms       pg_catalog.float8,
    OUT stats_since       pg_catalog.timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idempotency_stats'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

COMMENT ON FUNCTION idempotency.stats() IS
'Counters of the key guard per database, role and scope (the rows the caller may see); use the view idempotency.stats';

CREATE VIEW idempotency.stats AS
SELECT s.dbid, d.datname AS database, s.userid, r.rolname AS role, s.scope,
       s.begin_new, s.begin_retry, s.begin_replay,
       s.completed, s.failed_retryable, s.failed_final,
       s.ik001_reused, s.ik002_in_progress, s.ik004_not_held,
       s.waits, s.wait_total_ms, s.wait_max_ms,
       s.lease_takeovers, s.zombies_refused, s.purged, s.forgotten, s.renewed,
       s.stats_since
  FROM idempotency.stats() AS s
  LEFT JOIN pg_catalog.pg_database AS d ON d.oid OPERATOR(pg_catalog.=) s.dbid
  LEFT JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) s.userid;

COMMENT ON VIEW idempotency.stats IS
'How the key guard is used, per database, role and scope: outcomes, errors, waits, takeovers, purges (needs shared_preload_libraries; a role sees its own rows, pg_read_all_stats all)';
COMMENT ON COLUMN idempotency.stats.scope IS 'the scope, clipped to 64 bytes (entries are kept by a hash of the whole scope)';
COMMENT ON COLUMN idempotency.stats.begin_new IS 'begin() outcomes new: first time, the work was started';
COMMENT ON COLUMN idempotency.stats.begin_retry IS 'begin() outcomes retry: after a retryable failure or a lapsed lease';
COMMENT ON COLUMN idempotency.stats.begin_replay IS 'begin() outcomes replay: the stored response was returned, nothing was done';
COMMENT ON COLUMN idempotency.stats.completed IS 'complete() calls that stored a response';
COMMENT ON COLUMN idempotency.stats.failed_retryable IS 'fail(retryable => true) calls that stored a failure';
COMMENT ON COLUMN idempotency.stats.failed_final IS 'fail(retryable => false) calls that stored a failure';
COMMENT ON COLUMN idempotency.stats.ik001_reused IS 'IK001 raised: a key reused with a different request';
COMMENT ON COLUMN idempotency.stats.ik002_in_progress IS 'IK002 raised: a key in progress elsewhere (lock wait over, live lease, forget() of a key in flight)';
COMMENT ON COLUMN idempotency.stats.ik004_not_held IS 'IK004 raised: complete(), fail() or renew() of a key not held';
COMMENT ON COLUMN idempotency.stats.waits IS 'waits for a key lock another transaction held (ended by taking it or by IK002)';
COMMENT ON COLUMN idempotency.stats.wait_total_ms IS 'total time of those waits, milliseconds';
COMMENT ON COLUMN idempotency.stats.wait_max_ms IS 'longest of those waits, milliseconds';
COMMENT ON COLUMN idempotency.stats.lease_takeovers IS 'begin() calls that took over a key whose lease had lapsed';
COMMENT ON COLUMN idempotency.stats.zombies_refused IS 'complete(), fail() or renew() of an attempt whose key was taken over (IK004, counted there too)';
COMMENT ON COLUMN idempotency.stats.purged IS 'expired rows deleted by purge() (the caller''s, scope '''') or the worker (its role, scope '''')';
COMMENT ON COLUMN idempotency.stats.forgotten IS 'keys deleted by forget()';
COMMENT ON COLUMN idempotency.stats.renewed IS 'leases extended by renew()';
COMMENT ON COLUMN idempotency.stats.stats_since IS 'when this entry was created (counters start at zero then)';
GRANT SELECT ON idempotency.stats TO PUBLIC;

CREATE FUNCTION idempotency.stats_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'idempotency_stats_reset'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

COMMENT ON FUNCTION idempotency.stats_reset() IS
'Discard every counter of idempotency.stats (superuser only unless granted)';
REVOKE ALL ON FUNCTION idempotency.stats_reset() FROM PUBLIC;

CREATE FUNCTION idempotency.forget(
    key   pg_catalog.text,
    scope pg_catalog.text DEFAULT '')
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'idempotency_forget'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.forget(pg_catalog.text, pg_catalog.text) IS
'Delete one of the caller''s own keys so the next begin() is new; false if there is none; IK002 while it is in flight';

CREATE FUNCTION idempotency.renew(
    key     pg_catalog.text,
    lease   pg_catalog.interval,
    attempt pg_catalog.int4,
    scope   pg_catalog.text DEFAULT '')
RETURNS pg_catalog.timestamptz
AS 'MODULE_PATHNAME', 'idempotency_renew'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.renew(pg_catalog.text, pg_catalog.interval, pg_catalog.int4, pg_catalog.text) IS
'Extend the lease of the caller''s attempt to now + lease; returns the new locked_until; IK004 if taken over or finished';
