/* idempotency--0.6.0.sql: install script of version 0.6.0 */

\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

-- ---------------------------------------------------------------------
-- The key table.  One row per (owner role, scope, key).  In single-
-- transaction mode the row is written by complete()/fail(); until then the
-- key is held by a transaction-level lock (pg_locks: advisory, objsubid
-- 18756), so other transactions wait for the holder instead of seeing a row.
-- ---------------------------------------------------------------------
CREATE TABLE idempotency.idempotency_key (
    owner        pg_catalog.regrole     NOT NULL,
    scope        pg_catalog.text        COLLATE "C" NOT NULL DEFAULT '',
    key          pg_catalog.text        COLLATE "C" NOT NULL,
    status       pg_catalog.text        NOT NULL,
    request_hash pg_catalog.bytea,
    response     pg_catalog.jsonb,
    retryable    pg_catalog.bool,
    attempts     pg_catalog.int4        NOT NULL DEFAULT 1,
    created_at   pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    updated_at   pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    expires_at   pg_catalog.timestamptz NOT NULL,
    locked_until pg_catalog.timestamptz,
    -- key first: keys differ, while owner and scope repeat across most
    -- rows, so a comparison in the index usually ends at the first column
    -- (18k fewer instructions per guarded request than (owner, scope, key);
    -- bench/instructions.sh)
    CONSTRAINT idempotency_key_pkey PRIMARY KEY (key, scope, owner)
);
-- No CHECK constraints: only this extension's functions write the table
-- (plain roles cannot), and they write status in ('in_progress',
-- 'completed', 'failed'), 32-byte request hashes, attempts >= 1 and
-- retryable exactly for failed rows.  PostgreSQL re-reads and prepares every
-- CHECK expression on each INSERT; the four cost 27% of a guarded request's
-- server time (bench/instructions.sh).

COMMENT ON TABLE idempotency.idempotency_key IS
'Idempotency keys: one row per (owner role, scope, key); written only by the idempotency functions';
COMMENT ON COLUMN idempotency.idempotency_key.owner IS 'role that created the key; other roles never see it';
COMMENT ON COLUMN idempotency.idempotency_key.scope IS 'caller-chosen namespace (endpoint, tenant, consumer group)';
COMMENT ON COLUMN idempotency.idempotency_key.key IS 'the client''s idempotency key';
COMMENT ON COLUMN idempotency.idempotency_key.status IS 'in_progress, completed or failed';
COMMENT ON COLUMN idempotency.idempotency_key.request_hash IS 'idempotency.fingerprint() of the request, or NULL';
COMMENT ON COLUMN idempotency.idempotency_key.response IS 'result stored by complete(), or error stored by fail(); replayed to duplicates';
COMMENT ON COLUMN idempotency.idempotency_key.retryable IS 'for failed keys: whether the next begin() retries (true) or replays the failure (false)';
COMMENT ON COLUMN idempotency.idempotency_key.attempts IS 'how many times the work was started under this key';
COMMENT ON COLUMN idempotency.idempotency_key.expires_at IS 'after this the key behaves as absent';
COMMENT ON COLUMN idempotency.idempotency_key.locked_until IS 'lease end (lease mode only)';

-- purge() finds expired rows through this index
CREATE INDEX idempotency_key_expires_at_idx ON idempotency.idempotency_key (expires_at);

-- Rows belong to roles.  The functions reach the table as its owner and
-- always filter on the caller's role; plain roles may read their own rows
-- and nothing else, and may not write it directly.
ALTER TABLE idempotency.idempotency_key ENABLE ROW LEVEL SECURITY;
CREATE POLICY idempotency_key_own_rows ON idempotency.idempotency_key
    FOR SELECT
    USING (owner OPERATOR(pg_catalog.=)
           pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER)));
REVOKE ALL ON idempotency.idempotency_key FROM PUBLIC;
GRANT SELECT ON idempotency.idempotency_key TO PUBLIC;
GRANT USAGE ON SCHEMA idempotency TO PUBLIC;

-- pg_dump keeps the rows.
-- Dumped with the database, but only the rows of roles that exist: a
-- dropped role's rows (DROP ROLE leaves them; nothing ties a row to its
-- role in pg_shdepend) would dump its oid as a bare number, which a
-- restore into another cluster reads as whatever role has that oid there.
-- The same filter for every table whose rows belong to roles.
SELECT pg_catalog.pg_extension_config_dump('idempotency.idempotency_key',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) idempotency_key.owner::pg_catalog.oid)');

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
-- row security and no policy: a role that may SELECT the table without
-- owning it (pg_read_all_data, a grant by name) sees no row; its owner,
-- superusers and BYPASSRLS roles read it
ALTER TABLE idempotency.lock_secret ENABLE ROW LEVEL SECURITY;
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
-- Functions.  All SECURITY INVOKER; see src/keystore.c for how they reach
-- the table.  VOLATILE and PARALLEL UNSAFE: they take locks and write.
-- ---------------------------------------------------------------------
-- begin() returns a named row type rather than OUT parameters: the row
-- descriptor then comes from the type cache instead of being rebuilt from
-- pg_proc at every execution (40% of a replay's cost over a plain SELECT;
-- bench/instructions.sh).
CREATE TYPE idempotency.begin_result AS (
    outcome    pg_catalog.text,
    status     pg_catalog.text,
    response   pg_catalog.jsonb,
    attempts   pg_catalog.int4,
    created_at pg_catalog.timestamptz
);

CREATE FUNCTION idempotency.begin(
    key        pg_catalog.text,
    request    pg_catalog.jsonb    DEFAULT NULL,
    scope      pg_catalog.text     DEFAULT '',
    ttl        pg_catalog.interval DEFAULT NULL,
    lease      pg_catalog.interval DEFAULT NULL)
RETURNS idempotency.begin_result
AS 'MODULE_PATHNAME', 'idempotency_begin'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.begin(pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, pg_catalog.interval, pg_catalog.interval) IS
'Start guarded work under an idempotency key: outcome new (do the work), retry (do it again) or replay (return response)';

CREATE FUNCTION idempotency.complete(
    key      pg_catalog.text,
    response pg_catalog.jsonb,
    scope    pg_catalog.text DEFAULT '',
    attempt  pg_catalog.int4 DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idempotency_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.complete(pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, pg_catalog.int4) IS
'Store the response of a key this transaction began (or, with attempt, of a lease begun earlier); duplicates get it back as a replay';

CREATE FUNCTION idempotency.fail(
    key       pg_catalog.text,
    error     pg_catalog.jsonb,
    scope     pg_catalog.text DEFAULT '',
    retryable pg_catalog.bool DEFAULT true,
    attempt   pg_catalog.int4 DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idempotency_fail'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.fail(pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, pg_catalog.bool, pg_catalog.int4) IS
'Store the failure of a key this transaction began (or, with attempt, of a lease begun earlier): retryable failures are retried, others replayed';

CREATE FUNCTION idempotency.fingerprint(request pg_catalog.jsonb)
RETURNS pg_catalog.bytea
AS 'MODULE_PATHNAME', 'idempotency_fingerprint'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION idempotency.fingerprint(pg_catalog.jsonb) IS
'sha256 (32 bytes) of a jsonb value; equal jsonb values give equal fingerprints';

-- ---------------------------------------------------------------------
-- One-time tokens ("issue a token with the form, accept the submit once")
-- ---------------------------------------------------------------------
CREATE TABLE idempotency.token (
    token      pg_catalog.uuid        NOT NULL,
    owner      pg_catalog.regrole     NOT NULL,
    scope      pg_catalog.text        COLLATE "C" NOT NULL DEFAULT '',
    created_at pg_catalog.timestamptz NOT NULL,
    expires_at pg_catalog.timestamptz NOT NULL,
    CONSTRAINT token_pkey PRIMARY KEY (token)
);
CREATE INDEX token_expires_at_idx ON idempotency.token (expires_at);
COMMENT ON TABLE idempotency.token IS
'One-time tokens: issue_token() adds one, consume_token() removes it, once';

ALTER TABLE idempotency.token ENABLE ROW LEVEL SECURITY;
CREATE POLICY token_own_rows ON idempotency.token
    FOR SELECT
    USING (owner OPERATOR(pg_catalog.=)
           pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER)));
REVOKE ALL ON idempotency.token FROM PUBLIC;
GRANT SELECT ON idempotency.token TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('idempotency.token',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) token.owner::pg_catalog.oid)');

-- ---------------------------------------------------------------------
-- Consumer deduplication: message ids seen per (role, scope)
-- ---------------------------------------------------------------------
CREATE TABLE idempotency.seen_message (
    owner         pg_catalog.regrole     NOT NULL,
    scope         pg_catalog.text        COLLATE "C" NOT NULL,
    message_id    pg_catalog.text        COLLATE "C" NOT NULL,
    first_seen_at pg_catalog.timestamptz NOT NULL,
    expires_at    pg_catalog.timestamptz NOT NULL,
    CONSTRAINT seen_message_pkey PRIMARY KEY (message_id, scope, owner)
);
CREATE INDEX seen_message_expires_at_idx ON idempotency.seen_message (expires_at);
COMMENT ON TABLE idempotency.seen_message IS
'Message ids seen by first_seen(), per (owner role, scope), until they expire';

ALTER TABLE idempotency.seen_message ENABLE ROW LEVEL SECURITY;
CREATE POLICY seen_message_own_rows ON idempotency.seen_message
    FOR SELECT
    USING (owner OPERATOR(pg_catalog.=)
           pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER)));
REVOKE ALL ON idempotency.seen_message FROM PUBLIC;
GRANT SELECT ON idempotency.seen_message TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('idempotency.seen_message',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) seen_message.owner::pg_catalog.oid)');

-- ---------------------------------------------------------------------
-- Citus: the routes of a call to the node of its shard (see
-- src/keystore.c).  Always empty.  distribute() distributes key_route
-- co-located with the key table (and so with seen_message) and
-- token_route with the tokens, and lets PUBLIC UPDATE their column: a
-- function whose row lives on another node calls itself there through
-- a query whose modifying CTE updates nothing in one of them, so that
-- no role but the owner needs to write the key, token and seen-message
-- tables.  On a single server nobody but the owner may touch them.
-- ---------------------------------------------------------------------
-- (a primary key for a replica identity: without one, Citus's default
-- shard transfer mode refuses to move the keys' and tokens' shard groups,
-- and a carried call's UPDATE of a shard being moved by force_logical fails)
CREATE TABLE idempotency.key_route (k pg_catalog.text COLLATE "C" PRIMARY KEY);
COMMENT ON TABLE idempotency.key_route IS
'Citus: always empty; routes a key''s or message id''s call to the node of its shard (distribute())';
CREATE TABLE idempotency.token_route (t pg_catalog.uuid PRIMARY KEY);
COMMENT ON TABLE idempotency.token_route IS
'Citus: always empty; routes a token''s call to the node of its shard (distribute())';
REVOKE ALL ON idempotency.key_route, idempotency.token_route FROM PUBLIC;

-- ---------------------------------------------------------------------
-- Lifecycle functions
-- ---------------------------------------------------------------------
CREATE FUNCTION idempotency.purge(batch_size pg_catalog.int4 DEFAULT 10000)
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'idempotency_purge'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.purge(pg_catalog.int4) IS
'Delete up to batch_size of the calling role''s expired keys, tokens and messages per table; returns how many';

CREATE FUNCTION idempotency.issue_token(
    scope pg_catalog.text     DEFAULT '',
    ttl   pg_catalog.interval DEFAULT '1 hour')
RETURNS pg_catalog.uuid
AS 'MODULE_PATHNAME', 'idempotency_issue_token'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.issue_token(pg_catalog.text, pg_catalog.interval) IS
'Issue a one-time token that consume_token() accepts exactly once before it expires';

CREATE FUNCTION idempotency.consume_token(
    token pg_catalog.uuid,
    scope pg_catalog.text DEFAULT '')
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'idempotency_consume_token'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.consume_token(pg_catalog.uuid, pg_catalog.text) IS
'true exactly once for a token issued to this role and scope; false when used, expired or unknown';

CREATE FUNCTION idempotency.first_seen(
    scope      pg_catalog.text,
    message_id pg_catalog.text,
    ttl        pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'idempotency_first_seen'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.first_seen(pg_catalog.text, pg_catalog.text, pg_catalog.interval) IS
'true the first time a message id is seen in a scope, false for a redelivery; rolls back with the transaction';

-- ---------------------------------------------------------------------
-- Write helpers (SECURITY INVOKER: they run as the caller on the target)
-- ---------------------------------------------------------------------
CREATE TABLE idempotency.state_machine (
    machine     pg_catalog.text        NOT NULL,
    transitions pg_catalog.jsonb       NOT NULL,
    owner       pg_catalog.regrole     NOT NULL,
    updated_at  pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT state_machine_pkey PRIMARY KEY (machine)
);
COMMENT ON TABLE idempotency.state_machine IS
'State machines for transition(): from each state, the states it may move to';
-- transition() reads it as the caller; only create_machine() writes it
REVOKE ALL ON idempotency.state_machine FROM PUBLIC;
GRANT SELECT ON idempotency.state_machine TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('idempotency.state_machine',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) state_machine.owner::pg_catalog.oid)');

CREATE FUNCTION idempotency.create_machine(
    machine     pg_catalog.text,
    transitions pg_catalog.jsonb)
RETURNS void
AS 'MODULE_PATHNAME', 'idempotency_create_machine'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.create_machine(pg_catalog.text, pg_catalog.jsonb) IS
'Define or redefine a state machine: {"state": ["next state", ...], ...}';

CREATE FUNCTION idempotency.transition(
    target       pg_catalog.regclass,
    id           anyelement,
    to_state     pg_catalog.text,
    machine      pg_catalog.text,
    state_column pg_catalog.name DEFAULT 'status',
    id_column    pg_catalog.name DEFAULT 'id')
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idempotency_transition'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.transition(pg_catalog.regclass, anyelement, pg_catalog.text, pg_catalog.text, pg_catalog.name, pg_catalog.name) IS
'Move a row to to_state if the machine allows it: applied, or already when it is there; IK005 otherwise';

CREATE FUNCTION idempotency.update_versioned(
    target           pg_catalog.regclass,
    id               anyelement,
    expected_version pg_catalog.int8,
    changes          pg_catalog.jsonb,
    version_column   pg_catalog.name DEFAULT 'version',
    id_column        pg_catalog.name DEFAULT 'id')
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'idempotency_update_versioned'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.update_versioned(pg_catalog.regclass, anyelement, pg_catalog.int8, pg_catalog.jsonb, pg_catalog.name, pg_catalog.name) IS
'Apply changes and bump the version if the row is still at expected_version; returns the new version, IK006 if stale';

CREATE TYPE idempotency.insert_once_result AS (
    inserted pg_catalog.bool,
    "row"    pg_catalog.jsonb
);

CREATE FUNCTION idempotency.insert_once(
    target           pg_catalog.regclass,
    "row"            pg_catalog.jsonb,
    conflict_columns pg_catalog.name[] DEFAULT NULL)
RETURNS idempotency.insert_once_result
AS 'MODULE_PATHNAME', 'idempotency_insert_once'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.insert_once(pg_catalog.regclass, pg_catalog.jsonb, pg_catalog.name[]) IS
'Insert a row unless its key exists; returns (inserted, the new or the existing row)';

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

-- ---------------------------------------------------------------------
-- 0.5.0 additions.  Each feature keeps its own section below (the upgrade
-- script idempotency--0.4.0--0.5.0.sql has the same sections, same order).
-- ---------------------------------------------------------------------

-- == hardening ==

-- Schema idempotency must be ours.  CREATE EXTENSION uses an existing schema
-- named in the control file as it finds it, so a role with CREATE on the
-- database could have created it first: as its owner that role could drop
-- the extension's objects and put its own beside them.  Refuse a schema
-- owned by a role that is not a superuser, on which such a role (or
-- PUBLIC) may create objects, or holding objects such a role owns; a
-- schema a superuser created (a pg_dump
-- restore creates it before CREATE EXTENSION) or that DROP EXTENSION left
-- behind is taken.  An update from 0.4.0 checks the same.
DO $$
DECLARE
    bad pg_catalog.text;
BEGIN
    SELECT pg_catalog.format('it belongs to role %I', r.rolname) INTO bad
      FROM pg_catalog.pg_namespace AS n
      JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) n.nspowner
     WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency' AND NOT r.rolsuper;
    IF bad IS NULL THEN
        SELECT pg_catalog.format('role %s may create objects in it',
                                 CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                      ELSE pg_catalog.quote_ident(r.rolname) END) INTO bad
          FROM pg_catalog.pg_namespace AS n,
               pg_catalog.aclexplode(n.nspacl) AS a
          LEFT JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency'
           AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
           AND NOT coalesce(r.rolsuper, false)
         LIMIT 1;
    END IF;
    IF bad IS NULL THEN
        -- objects another role put there while it could (an overload of
        -- one of our functions would catch calls meant for ours)
        SELECT pg_catalog.format('role %I owns %s', r.rolname,
                                 pg_catalog.pg_describe_object(o.classid, o.objid, 0)) INTO bad
          FROM (SELECT 'pg_catalog.pg_class'::pg_catalog.regclass AS classid, c.oid AS objid,
                       c.relowner AS owner, c.relnamespace AS nsp FROM pg_catalog.pg_class AS c
                UNION ALL
                SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, p.oid, p.proowner, p.pronamespace
                  FROM pg_catalog.pg_proc AS p
                UNION ALL
                SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, t.oid, t.typowner, t.typnamespace
                  FROM pg_catalog.pg_type AS t
                UNION ALL
                SELECT 'pg_catalog.pg_operator'::pg_catalog.regclass, op.oid, op.oprowner, op.oprnamespace
                  FROM pg_catalog.pg_operator AS op
                UNION ALL
                SELECT 'pg_catalog.pg_collation'::pg_catalog.regclass, co.oid, co.collowner, co.collnamespace
                  FROM pg_catalog.pg_collation AS co
                UNION ALL
                SELECT 'pg_catalog.pg_conversion'::pg_catalog.regclass, cv.oid, cv.conowner, cv.connamespace
                  FROM pg_catalog.pg_conversion AS cv
                UNION ALL
                SELECT 'pg_catalog.pg_opclass'::pg_catalog.regclass, oc.oid, oc.opcowner, oc.opcnamespace
                  FROM pg_catalog.pg_opclass AS oc
                UNION ALL
                SELECT 'pg_catalog.pg_opfamily'::pg_catalog.regclass, f.oid, f.opfowner, f.opfnamespace
                  FROM pg_catalog.pg_opfamily AS f
                UNION ALL
                SELECT 'pg_catalog.pg_ts_config'::pg_catalog.regclass, tc.oid, tc.cfgowner, tc.cfgnamespace
                  FROM pg_catalog.pg_ts_config AS tc
                UNION ALL
                SELECT 'pg_catalog.pg_ts_dict'::pg_catalog.regclass, td.oid, td.dictowner, td.dictnamespace
                  FROM pg_catalog.pg_ts_dict AS td
                UNION ALL
                SELECT 'pg_catalog.pg_statistic_ext'::pg_catalog.regclass, se.oid, se.stxowner, se.stxnamespace
                  FROM pg_catalog.pg_statistic_ext AS se) AS o
          JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) o.owner
         WHERE o.nsp OPERATOR(pg_catalog.=) (SELECT n.oid FROM pg_catalog.pg_namespace AS n
                                              WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency')
           AND NOT r.rolsuper
         LIMIT 1;
    END IF;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'schema idempotency is not safe for the extension: %', bad
            USING ERRCODE = 'duplicate_schema',
                  DETAIL = 'The extension''s schema and everything in it must belong to superusers, and no other role may create objects in it: such a role could drop the extension''s tables or put its own objects beside them.',
                  HINT = 'Check what the schema holds, then drop it, or give it to a superuser (ALTER SCHEMA idempotency OWNER TO ...), revoke CREATE on it and drop the objects of other roles, and run the command again.';
    END IF;
END
$$;

-- == recovery points ==
-- A request that calls other systems runs in phases under one lease-mode
-- key.  Each phase commits its business writes together with
-- checkpoint(), which records the key's recovery point (a name) and state
-- (jsonb the handler chooses, e.g. the charge id) in the same transaction;
-- a retry's begin() and lookup() return them, so it resumes where the
-- last committed phase ended.  derive_key() gives the stable key to send
-- to another system's API.  Added with ALTER, here as in the update
-- script, so a fresh and an updated database have the same column order.
ALTER TABLE idempotency.idempotency_key
    ADD COLUMN recovery_point pg_catalog.text,
    ADD COLUMN recovery_state pg_catalog.jsonb;
COMMENT ON COLUMN idempotency.idempotency_key.recovery_point IS
'last recovery point checkpoint() recorded for the key (lease mode), or NULL';
COMMENT ON COLUMN idempotency.idempotency_key.recovery_state IS
'state recorded with the recovery point (jsonb the handler chooses), or NULL';

ALTER TYPE idempotency.begin_result
    ADD ATTRIBUTE recovery_point pg_catalog.text,
    ADD ATTRIBUTE recovery_state pg_catalog.jsonb;
ALTER TYPE idempotency.lookup_result
    ADD ATTRIBUTE recovery_point pg_catalog.text,
    ADD ATTRIBUTE recovery_state pg_catalog.jsonb;

CREATE FUNCTION idempotency.checkpoint(
    key     pg_catalog.text,
    point   pg_catalog.text,
    state   pg_catalog.jsonb,
    attempt pg_catalog.int4,
    scope   pg_catalog.text DEFAULT '')
RETURNS void
AS 'MODULE_PATHNAME', 'idempotency_checkpoint'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.checkpoint(pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.int4, pg_catalog.text) IS
'Record the recovery point and state of the caller''s lease attempt in this transaction (commits with the phase''s writes); a retry''s begin() returns them; IK004 if taken over or finished';

-- The secret of derive_key(): HMAC-SHA256 key, per database, readable by
-- the extension's owner only.  Separate from lock_secret on purpose: the
-- lock secret may be changed while no keys are in flight, but a changed
-- derive secret would change the downstream keys of requests still to be
-- retried (a second charge), so this one is never changed.  It is dumped
-- (pg_extension_config_dump) so that keys restored in progress derive the
-- same downstream keys; a restore adds the dumped row beside the one
-- CREATE EXTENSION made, and the oldest row is the secret.
CREATE TABLE idempotency.derive_secret (
    secret     pg_catalog.bytea       NOT NULL
        CONSTRAINT derive_secret_length CHECK (pg_catalog.length(secret) OPERATOR(pg_catalog.=) 32),
    created_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE idempotency.derive_secret IS
'Secret key of derive_key() (its oldest row); readable by the extension owner only; never change it';
REVOKE ALL ON idempotency.derive_secret FROM PUBLIC;
-- row security and no policy, as lock_secret
ALTER TABLE idempotency.derive_secret ENABLE ROW LEVEL SECURITY;
SELECT pg_catalog.pg_extension_config_dump('idempotency.derive_secret', '');
INSERT INTO idempotency.derive_secret (secret)
SELECT pg_catalog.sha256(
           pg_catalog.uuid_send(pg_catalog.gen_random_uuid()) OPERATOR(pg_catalog.||)
           pg_catalog.uuid_send(pg_catalog.gen_random_uuid()));

-- STABLE: the result depends on the secret table; PARALLEL RESTRICTED: it
-- reads that table as the extension's owner.
CREATE FUNCTION idempotency.derive_key(
    key   pg_catalog.text,
    step  pg_catalog.text,
    scope pg_catalog.text DEFAULT '')
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idempotency_derive_key'
LANGUAGE C STABLE PARALLEL RESTRICTED;

COMMENT ON FUNCTION idempotency.derive_key(pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
'Idempotency key for step of the caller''s key to send to another system: the same for every attempt, different per step, role and scope, unguessable without the database''s secret (idk_ + 26 base32 characters)';

-- checkpoint() refuses like complete() and renew(), counted with them
COMMENT ON COLUMN idempotency.stats.ik004_not_held IS 'IK004 raised: complete(), fail(), renew() or checkpoint() of a key not held';
COMMENT ON COLUMN idempotency.stats.zombies_refused IS 'complete(), fail(), renew() or checkpoint() of an attempt whose key was taken over (IK004, counted there too)';

-- idempotency.roleref: whose row this is, on every server and on Citus.  A
-- role's oid on disk, like regrole, read and printed as regrole reads and
-- prints it (the role's name), except that an oid naming no role prints
-- as "-" (nobody: regrole's bare number would name whatever role has that
-- oid on another node or cluster), and with
-- no binary send/receive functions: every copy between nodes (a shard
-- move, logical replication, a reference table copied to a node added
-- later, a value Citus sends to a worker) carries the name, and each node
-- stores its own oid of that role.  Stable across ALTER ROLE ... RENAME
-- (Citus renames the role on every node, oids stay), never passed to a
-- role created later under an old name.  It casts to oid implicitly and
-- without a function (as regrole does), so owner = $1 is oid equality and
-- the primary key's oid_ops serves it.  The owner columns of keys,
-- tokens, seen messages and state machines are of this type (below; on
-- Citus distribute() converts them on every node), and the owner and
-- grantee columns of the outbox's topics, grants and messages.
CREATE TYPE idempotency.roleref;
CREATE FUNCTION idempotency.roleref_in(pg_catalog.cstring)
RETURNS idempotency.roleref
AS 'regrolein' LANGUAGE internal STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idempotency.roleref_out(idempotency.roleref)
RETURNS pg_catalog.cstring
AS 'MODULE_PATHNAME', 'idempotency_roleref_out' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE TYPE idempotency.roleref (
    INPUT = idempotency.roleref_in,
    OUTPUT = idempotency.roleref_out,
    LIKE = pg_catalog.oid);
COMMENT ON FUNCTION idempotency.roleref_in(pg_catalog.cstring) IS
'Input of idempotency.roleref: a role''s name (or oid), as regrole reads it';
COMMENT ON FUNCTION idempotency.roleref_out(idempotency.roleref) IS
'Output of idempotency.roleref: the role''s name, as regrole prints it; - for an oid that names no role (a dropped role''s rows belong to nobody on another node or after a restore)';
COMMENT ON TYPE idempotency.roleref IS
'A role, stored as its oid, copied between nodes and clusters by name (no binary I/O): the owner columns of keys, tokens, seen messages, state machines and the outbox''s topics, grants and messages';
CREATE CAST (idempotency.roleref AS pg_catalog.oid) WITHOUT FUNCTION AS IMPLICIT;
CREATE CAST (pg_catalog.oid AS idempotency.roleref) WITHOUT FUNCTION;
CREATE CAST (pg_catalog.regrole AS idempotency.roleref) WITHOUT FUNCTION AS ASSIGNMENT;
CREATE CAST (idempotency.roleref AS pg_catalog.regrole) WITHOUT FUNCTION;
-- owner = role on Citus: a roleref column against a regrole value.  With
-- pg_catalog.= both sides would be relabelled to oid, and Citus, which
-- evaluates the parameters of an UPDATE or DELETE on the coordinator and
-- sends them as constants, would send the coordinator's oid; this operator
-- keeps the value a regrole, which Citus sends by name.  Named ===, not =,
-- so that the parser never picks it for a user's own `'name' = regrole`
-- comparison or infers an untyped parameter as roleref.
CREATE FUNCTION idempotency.roleref_eq(idempotency.roleref, pg_catalog.regrole)
RETURNS pg_catalog.bool
AS 'oideq' LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE LEAKPROOF;
COMMENT ON FUNCTION idempotency.roleref_eq(idempotency.roleref, pg_catalog.regrole) IS
'Operator idempotency.===: whether a roleref and a regrole name the same role';
CREATE OPERATOR idempotency.=== (
    LEFTARG = idempotency.roleref,
    RIGHTARG = pg_catalog.regrole,
    FUNCTION = idempotency.roleref_eq);

-- == outbox ==
-- Messages published in the caller's transaction (publish()), delivered by
-- relays that claim them with a visibility timeout and ack or nack them
-- (src/README.md, "The outbox", holds the design, the ordering proof and the
-- locking).
-- Topics belong to roles; grant_topic() shares one with another role.
CREATE TABLE idempotency.outbox_topic (
    id           pg_catalog.int4        NOT NULL,
    name         pg_catalog.text        COLLATE "C" NOT NULL,
    owner        pg_catalog.regrole     NOT NULL,
    max_attempts pg_catalog.int4        NOT NULL,
    backoff_base pg_catalog.interval    NOT NULL,
    backoff_max  pg_catalog.interval    NOT NULL,
    retention    pg_catalog.interval    NOT NULL,
    notify       pg_catalog.bool        NOT NULL DEFAULT false,
    created_at   pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    -- counts of purged messages, so outbox_stats keeps counting after purge
    purged_delivered pg_catalog.int8    NOT NULL DEFAULT 0,
    purged_retries   pg_catalog.int8    NOT NULL DEFAULT 0,
    CONSTRAINT outbox_topic_pkey PRIMARY KEY (id),
    CONSTRAINT outbox_topic_name_key UNIQUE (name),
    -- the NOTIFY channel is 'idempotency.outbox.' || name: at most 63 bytes
    CONSTRAINT outbox_topic_name_check CHECK (name OPERATOR(pg_catalog.~) '^[A-Za-z0-9_.:-]{1,40}$'),
    CONSTRAINT outbox_topic_max_attempts_check CHECK (max_attempts OPERATOR(pg_catalog.>=) 1)
);
CREATE SEQUENCE idempotency.outbox_topic_id_seq AS pg_catalog.int4 OWNED BY idempotency.outbox_topic.id;
ALTER TABLE idempotency.outbox_topic
    ALTER COLUMN id SET DEFAULT pg_catalog.nextval('idempotency.outbox_topic_id_seq'::pg_catalog.regclass);
COMMENT ON TABLE idempotency.outbox_topic IS
'Outbox topics: one row per topic, owned by the role that created it (create_topic)';
COMMENT ON COLUMN idempotency.outbox_topic.notify IS 'publish() also NOTIFYs "idempotency.outbox.<topic>" at commit, for clients that LISTEN (PostgreSQL serialises the commits of notifying transactions; relays use wait_for(), which needs no NOTIFY)';

CREATE TABLE idempotency.outbox_grant (
    topic_id    pg_catalog.int4    NOT NULL,
    grantee     pg_catalog.regrole NOT NULL,
    topic_owner pg_catalog.regrole NOT NULL,
    can_publish pg_catalog.bool    NOT NULL,
    can_consume pg_catalog.bool    NOT NULL,
    CONSTRAINT outbox_grant_pkey PRIMARY KEY (topic_id, grantee),
    CONSTRAINT outbox_grant_topic_fkey FOREIGN KEY (topic_id)
        REFERENCES idempotency.outbox_topic (id) ON DELETE CASCADE
);
COMMENT ON TABLE idempotency.outbox_grant IS
'Roles a topic''s owner let publish to or consume from the topic (grant_topic, revoke_topic)';

CREATE SEQUENCE idempotency.outbox_message_id_seq AS pg_catalog.int8;
CREATE TABLE idempotency.outbox_message (
    id           pg_catalog.int8        NOT NULL,
    topic_id     pg_catalog.int4        NOT NULL,
    owner        pg_catalog.regrole     NOT NULL,
    message_id   pg_catalog.uuid        NOT NULL,
    message_key  pg_catalog.text        COLLATE "C",
    payload      pg_catalog.jsonb       NOT NULL,
    headers      pg_catalog.jsonb       NOT NULL,
    state        pg_catalog.text        COLLATE "C" NOT NULL,
    attempts     pg_catalog.int4        NOT NULL DEFAULT 0,
    available_at pg_catalog.timestamptz NOT NULL,
    claim        pg_catalog.uuid,
    published_at pg_catalog.timestamptz NOT NULL,
    published_by pg_catalog.regrole     NOT NULL,
    last_error   pg_catalog.jsonb,
    delivered_at pg_catalog.timestamptz,
    expires_at   pg_catalog.timestamptz,
    CONSTRAINT outbox_message_pkey PRIMARY KEY (id)
);
ALTER SEQUENCE idempotency.outbox_message_id_seq OWNED BY idempotency.outbox_message.id;
-- A queue table: every message leaves three dead row versions (claim, ack,
-- purge).  Vacuum it after a fixed number of them, not a fraction of a
-- table that is mostly empty, and without the cost delay.
ALTER TABLE idempotency.outbox_message SET (autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 10000, autovacuum_vacuum_cost_delay = 0);
COMMENT ON TABLE idempotency.outbox_message IS
'Outbox messages: written by publish() in the publisher''s transaction, claimed, acked and nacked by relays, purged after delivery';
COMMENT ON COLUMN idempotency.outbox_message.id IS 'taken after the message key''s lock: per key, id order is commit order; redrive() gives a message a new one';
COMMENT ON COLUMN idempotency.outbox_message.owner IS 'the topic''s owner (purge() by that role removes its delivered messages)';
COMMENT ON COLUMN idempotency.outbox_message.message_id IS 'stable id a relay sends downstream as Idempotency-Key';
COMMENT ON COLUMN idempotency.outbox_message.message_key IS 'messages of one key are delivered one at a time in commit order; NULL: no order';
COMMENT ON COLUMN idempotency.outbox_message.state IS 'pending (claimable or claimed), delivered, dead';
COMMENT ON COLUMN idempotency.outbox_message.attempts IS 'how many times the message was claimed';
COMMENT ON COLUMN idempotency.outbox_message.available_at IS 'pending: claimable from then (deliver_after, retry time, end of a claim''s visibility)';
COMMENT ON COLUMN idempotency.outbox_message.claim IS 'the current claim''s token; ack and nack must name it';
COMMENT ON COLUMN idempotency.outbox_message.expires_at IS 'delivered: purge removes the row after this; NULL otherwise';
-- claim(): ready messages of a topic in the order they became available
CREATE INDEX outbox_message_ready_idx ON idempotency.outbox_message (topic_id, available_at, id)
    WHERE state OPERATOR(pg_catalog.=) 'pending';
-- claim(), beyond its window: ready unkeyed messages
CREATE INDEX outbox_message_unkeyed_idx ON idempotency.outbox_message (topic_id, available_at, id)
    WHERE state OPERATOR(pg_catalog.=) 'pending' AND message_key IS NULL;
-- claim(): is an earlier message of the same key still undelivered?  And
-- each key's earliest pending message, key by key

CREATE INDEX outbox_message_key_idx ON idempotency.outbox_message (topic_id, message_key, id)
    WHERE state OPERATOR(pg_catalog.=) 'pending' AND message_key IS NOT NULL;
-- purge() finds delivered messages through this index
CREATE INDEX outbox_message_expires_at_idx ON idempotency.outbox_message (expires_at)
    WHERE expires_at IS NOT NULL;
-- the dead-letter view and redrive()
CREATE INDEX outbox_message_dead_idx ON idempotency.outbox_message (topic_id, id)
    WHERE state OPERATOR(pg_catalog.=) 'dead';

-- The owner and grantee columns are idempotency.roleref (see the type
-- above), as the key table's: a copy to another cluster (logical
-- replication with binary = true, a dump restored there) carries the
-- role's name, never an oid that names another role there.  ALTER, not
-- the CREATE TABLE: the portable edition, which has no roleref, keeps
-- them regrole.  published_by likewise: the message belongs to the topic's
-- owner and is dumped while that role exists, but its publisher may have
-- been dropped since, and a regrole would dump that oid as a bare number,
-- read back by a restore as whatever role has it there; a roleref prints
-- it as "-" (nobody, oid 0).
ALTER TABLE idempotency.outbox_topic ALTER COLUMN owner TYPE idempotency.roleref;
ALTER TABLE idempotency.outbox_grant ALTER COLUMN grantee TYPE idempotency.roleref,
    ALTER COLUMN topic_owner TYPE idempotency.roleref;
ALTER TABLE idempotency.outbox_message ALTER COLUMN owner TYPE idempotency.roleref,
    ALTER COLUMN published_by TYPE idempotency.roleref;
COMMENT ON COLUMN idempotency.outbox_message.published_by IS
'the role that published the message; - (oid 0) in a dump or restore once that role is dropped';

-- Row-level security: a role sees its own topics and those granted to it,
-- and the messages of the topics it owns or may consume.  Only the
-- functions write (as the extension's owner).
ALTER TABLE idempotency.outbox_grant ENABLE ROW LEVEL SECURITY;
-- (a grant counts only while the topic's owner exists: a dropped owner's
-- topic belongs to no role, and the topic and message policies below read
-- the grants through this one)
CREATE POLICY outbox_grant_own_rows ON idempotency.outbox_grant
    FOR SELECT
    USING (grantee OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))
           AND EXISTS (SELECT FROM pg_catalog.pg_roles AS r
                        WHERE r.oid OPERATOR(pg_catalog.=) outbox_grant.topic_owner::pg_catalog.oid)
           OR topic_owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER)));
ALTER TABLE idempotency.outbox_topic ENABLE ROW LEVEL SECURITY;
CREATE POLICY outbox_topic_own_rows ON idempotency.outbox_topic
    FOR SELECT
    USING (owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))
           OR EXISTS (SELECT 1 FROM idempotency.outbox_grant AS g
                       WHERE g.topic_id OPERATOR(pg_catalog.=) id
                         AND g.grantee OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))));
ALTER TABLE idempotency.outbox_message ENABLE ROW LEVEL SECURITY;
-- (every column qualified: a bare topic_id in the subquery is g's)
CREATE POLICY outbox_message_own_rows ON idempotency.outbox_message
    FOR SELECT
    USING (outbox_message.owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))
           OR EXISTS (SELECT 1 FROM idempotency.outbox_grant AS g
                       WHERE g.topic_id OPERATOR(pg_catalog.=) outbox_message.topic_id
                         AND g.grantee OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))
                         AND g.can_consume));
REVOKE ALL ON idempotency.outbox_topic, idempotency.outbox_grant, idempotency.outbox_message FROM PUBLIC;
GRANT SELECT ON idempotency.outbox_topic, idempotency.outbox_grant, idempotency.outbox_message TO PUBLIC;
REVOKE ALL ON SEQUENCE idempotency.outbox_topic_id_seq, idempotency.outbox_message_id_seq FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_topic',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) outbox_topic.owner::pg_catalog.oid)');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_topic_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_grant',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) outbox_grant.topic_owner::pg_catalog.oid) AND EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) outbox_grant.grantee::pg_catalog.oid)');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_message',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) outbox_message.owner::pg_catalog.oid)');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_message_id_seq', '');

CREATE FUNCTION idempotency.create_topic(
    topic        pg_catalog.text,
    max_attempts pg_catalog.int4     DEFAULT 10,
    backoff_base pg_catalog.interval DEFAULT '1 second',
    backoff_max  pg_catalog.interval DEFAULT '1 hour',
    retention    pg_catalog.interval DEFAULT '1 hour',
    notify       pg_catalog.bool     DEFAULT false)
RETURNS pg_catalog.int4
AS 'MODULE_PATHNAME', 'idempotency_create_topic'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.create_topic(pg_catalog.text, pg_catalog.int4, pg_catalog.interval, pg_catalog.interval, pg_catalog.interval, pg_catalog.bool) IS
'Create an outbox topic owned by the calling role; returns its id';

CREATE FUNCTION idempotency.alter_topic(
    topic        pg_catalog.text,
    max_attempts pg_catalog.int4     DEFAULT NULL,
    backoff_base pg_catalog.interval DEFAULT NULL,
    backoff_max  pg_catalog.interval DEFAULT NULL,
    retention    pg_catalog.interval DEFAULT NULL,
    notify       pg_catalog.bool     DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idempotency_alter_topic'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.alter_topic(pg_catalog.text, pg_catalog.int4, pg_catalog.interval, pg_catalog.interval, pg_catalog.interval, pg_catalog.bool) IS
'Change the settings of one of the caller''s topics (NULL keeps a setting)';

CREATE FUNCTION idempotency.drop_topic(
    topic pg_catalog.text,
    force pg_catalog.bool DEFAULT false)
RETURNS void
AS 'MODULE_PATHNAME', 'idempotency_drop_topic'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.drop_topic(pg_catalog.text, pg_catalog.bool) IS
'Drop one of the caller''s topics with its grants and messages; refuses while messages are undelivered unless force';

CREATE FUNCTION idempotency.grant_topic(
    topic   pg_catalog.text,
    grantee pg_catalog.regrole,
    publish pg_catalog.bool DEFAULT true,
    consume pg_catalog.bool DEFAULT true)
RETURNS void
AS 'MODULE_PATHNAME', 'idempotency_grant_topic'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.grant_topic(pg_catalog.text, pg_catalog.regrole, pg_catalog.bool, pg_catalog.bool) IS
'Let another role publish to and/or consume from one of the caller''s topics (replaces an earlier grant)';

CREATE FUNCTION idempotency.revoke_topic(
    topic   pg_catalog.text,
    grantee pg_catalog.regrole)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'idempotency_revoke_topic'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.revoke_topic(pg_catalog.text, pg_catalog.regrole) IS
'Take back what grant_topic() gave a role on one of the caller''s topics; false if it had nothing';

CREATE FUNCTION idempotency.publish(
    topic         pg_catalog.text,
    payload       pg_catalog.jsonb,
    message_key   pg_catalog.text     DEFAULT NULL,
    headers       pg_catalog.jsonb    DEFAULT '{}',
    deliver_after pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.uuid
AS 'MODULE_PATHNAME', 'idempotency_publish'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.publish(pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, pg_catalog.jsonb, pg_catalog.interval) IS
'Record a message in the caller''s transaction (delivered after commit, gone on rollback); returns its message id';

CREATE TYPE idempotency.outbox_claim AS (
    id           pg_catalog.int8,
    message_id   pg_catalog.uuid,
    topic        pg_catalog.text,
    message_key  pg_catalog.text,
    payload      pg_catalog.jsonb,
    headers      pg_catalog.jsonb,
    attempt      pg_catalog.int4,
    published_at pg_catalog.timestamptz,
    claim        pg_catalog.uuid,
    claimed_until pg_catalog.timestamptz
);

CREATE FUNCTION idempotency.claim(
    topic      pg_catalog.text,
    batch_size pg_catalog.int4     DEFAULT 10,
    visibility pg_catalog.interval DEFAULT '30 seconds')
RETURNS SETOF idempotency.outbox_claim
AS 'MODULE_PATHNAME', 'idempotency_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 10;
COMMENT ON FUNCTION idempotency.claim(pg_catalog.text, pg_catalog.int4, pg_catalog.interval) IS
'Claim up to batch_size ready messages of a topic for visibility (no other relay gets them meanwhile); one per message key, in commit order';

-- == wake-ups without NOTIFY ==
-- A relay blocks in wait_for() until a transaction that published to one of
-- its topics has committed, woken through the extension's shared memory
-- (src/wakeup.c); publishers take no lock for it.  NOTIFY is off by default.
CREATE FUNCTION idempotency.wait_for(
    topics  pg_catalog.text[],
    timeout pg_catalog.interval DEFAULT '30 seconds',
    since   pg_catalog.int8[]   DEFAULT NULL,
    OUT woken  pg_catalog.text[],
    OUT cursor pg_catalog.int8[])
RETURNS record
AS 'MODULE_PATHNAME', 'idempotency_wait_for'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.wait_for(pg_catalog.text[], pg_catalog.interval, pg_catalog.int8[]) IS
'Wait until a transaction that published to one of topics (each one the caller may consume) has committed since the cursor since (default: since the call began), or timeout; returns the topics woken and the cursor to pass next time (needs the library in shared_preload_libraries)';

-- == claims in shared memory ==
-- With the library preloaded a claim writes no row version: its token, end
-- and attempt live in the extension's shared memory (src/outbox_claims.c),
-- ack() deletes the message and counts it there until the purge adds the
-- counts to its topic's purged_* columns.  These three are read by the
-- extension's own statements (run as its owner) and by outbox_stats.
CREATE FUNCTION idempotency._outbox_claimed(id pg_catalog.int8)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'idempotency_outbox_claimed'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency._outbox_claimed(pg_catalog.int8) IS
'Internal: is the message claimed in shared memory, its claim not lapsed?';
CREATE FUNCTION idempotency._outbox_attempt(id pg_catalog.int8, claim pg_catalog.uuid)
RETURNS pg_catalog.int4
AS 'MODULE_PATHNAME', 'idempotency_outbox_attempt'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency._outbox_attempt(pg_catalog.int8, pg_catalog.uuid) IS
'Internal: the attempt of the claim in shared memory that holds the message, NULL if that claim does not hold it';
CREATE FUNCTION idempotency._outbox_counts(topic_id pg_catalog.int4,
    OUT delivered pg_catalog.int8, OUT retried pg_catalog.int8)
RETURNS record
AS 'MODULE_PATHNAME', 'idempotency_outbox_counts'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency._outbox_counts(pg_catalog.int4) IS
'Internal: messages of the topic acked (and their retries) since the purge last added them to the topic''s row, from shared memory';
CREATE FUNCTION idempotency._outbox_claim(id pg_catalog.int8,
    OUT claim pg_catalog.uuid, OUT claimed_until pg_catalog.timestamptz, OUT attempt pg_catalog.int4)
RETURNS record
AS 'MODULE_PATHNAME', 'idempotency_outbox_claim'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency._outbox_claim(pg_catalog.int8) IS
'Internal: the claim in shared memory that holds the message (lapsed or not), for outbox_in_flight';
REVOKE ALL ON FUNCTION idempotency._outbox_attempt(pg_catalog.int8, pg_catalog.uuid) FROM PUBLIC;
-- outbox_stats (owner's rights on tables, the caller's on functions) and
-- outbox_in_flight (security_invoker) call these three: _outbox_counts shows
-- a topic's counts only to whom outbox_stats shows them, and a claim token
-- lets nobody ack without the right to consume the topic
GRANT EXECUTE ON FUNCTION idempotency._outbox_counts(pg_catalog.int4),
    idempotency._outbox_claim(pg_catalog.int8),
    idempotency._outbox_claimed(pg_catalog.int8) TO PUBLIC;

-- the messages claimed now (or whose claim lapsed and was not taken over)
CREATE VIEW idempotency.outbox_in_flight WITH (security_invoker = true) AS
SELECT m.id, m.message_id, t.name AS topic, m.message_key,
       COALESCE(m.claim, c.claim) AS claim,
       CASE WHEN m.claim IS NOT NULL THEN m.available_at ELSE c.claimed_until END AS claimed_until,
       CASE WHEN m.claim IS NOT NULL THEN m.attempts ELSE c.attempt END AS attempt
  FROM idempotency.outbox_message AS m
  JOIN idempotency.outbox_topic AS t ON t.id OPERATOR(pg_catalog.=) m.topic_id
  CROSS JOIN LATERAL idempotency._outbox_claim(m.id) AS c
 WHERE m.state OPERATOR(pg_catalog.=) 'pending'
   AND (m.claim IS NOT NULL OR c.claim IS NOT NULL);
COMMENT ON VIEW idempotency.outbox_in_flight IS
'Claimed messages of the topics the caller owns or consumes: the claim (in shared memory, or in the row when claimed without the library preloaded or by 0.5.0), until when, and its attempt';
GRANT SELECT ON idempotency.outbox_in_flight TO PUBLIC;

CREATE FUNCTION idempotency.ack(
    claim pg_catalog.uuid,
    ids   pg_catalog.int8[])
RETURNS pg_catalog.int4
AS 'MODULE_PATHNAME', 'idempotency_ack'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.ack(pg_catalog.uuid, pg_catalog.int8[]) IS
'Mark messages of a claim delivered; returns how many (a message claimed again since is not acked)';

CREATE FUNCTION idempotency.nack(
    claim    pg_catalog.uuid,
    ids      pg_catalog.int8[],
    error    pg_catalog.jsonb    DEFAULT NULL,
    retry_in pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.int4
AS 'MODULE_PATHNAME', 'idempotency_nack'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.nack(pg_catalog.uuid, pg_catalog.int8[], pg_catalog.jsonb, pg_catalog.interval) IS
'Give messages of a claim back after a failed delivery: retried after retry_in (default: capped exponential backoff), dead after max_attempts';

CREATE FUNCTION idempotency.release(
    claim pg_catalog.uuid,
    ids   pg_catalog.int8[])
RETURNS pg_catalog.int4
AS 'MODULE_PATHNAME', 'idempotency_release'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.release(pg_catalog.uuid, pg_catalog.int8[]) IS
'Give messages of a claim back unattempted (a relay stopping): claimable at once, the attempt not counted';

CREATE FUNCTION idempotency.redrive(
    topic pg_catalog.text,
    ids   pg_catalog.int8[] DEFAULT NULL)
RETURNS pg_catalog.int4
AS 'MODULE_PATHNAME', 'idempotency_redrive'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.redrive(pg_catalog.text, pg_catalog.int8[]) IS
'Send dead messages of a topic again (all of them, or those ids) with their attempts reset, each behind the other messages of its key (a new id, the same message_id); returns how many';

CREATE VIEW idempotency.outbox_dead WITH (security_invoker = true) AS
SELECT m.id, m.message_id, t.name AS topic, m.message_key, m.payload, m.headers,
       m.attempts, m.last_error, m.published_at
  FROM idempotency.outbox_message AS m
  JOIN idempotency.outbox_topic AS t ON t.id OPERATOR(pg_catalog.=) m.topic_id
 WHERE m.state OPERATOR(pg_catalog.=) 'dead';
COMMENT ON VIEW idempotency.outbox_dead IS
'Dead letters: messages that failed max_attempts times, of the topics the caller owns or consumes; redrive() sends them again';
GRANT SELECT ON idempotency.outbox_dead TO PUBLIC;

-- Not security_invoker: it shows only counts, so roles in pg_read_all_stats
-- (a monitoring role, postgres_exporter) see every topic; other roles see
-- the topics they own or are granted.
CREATE VIEW idempotency.outbox_stats AS
SELECT t.name AS topic, t.owner,
       t.purged_delivered OPERATOR(pg_catalog.+) c.delivered OPERATOR(pg_catalog.+) pg_catalog.count(m.id) AS published,
       t.purged_delivered OPERATOR(pg_catalog.+) c.delivered OPERATOR(pg_catalog.+)
           pg_catalog.count(m.id) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'delivered') AS delivered,
       t.purged_retries OPERATOR(pg_catalog.+) c.retried OPERATOR(pg_catalog.+)
           COALESCE(pg_catalog.sum(GREATEST(m.attempts OPERATOR(pg_catalog.-) 1, 0)), 0) AS retried,
       pg_catalog.count(m.id) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'dead') AS dead,
       pg_catalog.count(m.id) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'pending'
                                        AND (m.claim IS NOT NULL
                                             AND m.available_at OPERATOR(pg_catalog.>) pg_catalog.now()
                                             OR idempotency._outbox_claimed(m.id))) AS in_flight,
       pg_catalog.count(m.id) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'pending') AS undelivered,
       pg_catalog.now() OPERATOR(pg_catalog.-)
           pg_catalog.min(m.published_at) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'pending') AS oldest_undelivered_age
  FROM idempotency.outbox_topic AS t
  CROSS JOIN LATERAL idempotency._outbox_counts(t.id) AS c
  LEFT JOIN idempotency.outbox_message AS m ON m.topic_id OPERATOR(pg_catalog.=) t.id
 WHERE t.owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))
    OR EXISTS (SELECT 1 FROM idempotency.outbox_grant AS g
                WHERE g.topic_id OPERATOR(pg_catalog.=) t.id
                  AND g.grantee OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER)))
       AND EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) t.owner::pg_catalog.oid)
    OR pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE')
 GROUP BY t.id, c.delivered, c.retried;
COMMENT ON VIEW idempotency.outbox_stats IS
'Per topic the caller owns or is granted (every topic for pg_read_all_stats): messages published, delivered, retried (claims after the first), dead, in flight, undelivered, and the age of the oldest undelivered (acked counts not yet added to the topic''s row by the purge live in shared memory: a crash loses them)';
GRANT SELECT ON idempotency.outbox_stats TO PUBLIC;

-- == Citus ==
-- One set-up step on a Citus coordinator (README "Scaling out with
-- Citus"): the key table and seen_message distributed by key and message
-- id in one co-location group (a business table distributed by the same
-- key, text COLLATE "C", joins it), tokens distributed by token, the state
-- machines and derive_key()'s secret reference tables; once() delegated
-- to the node of its key.
-- The C code detects the distribution
-- (src/keystore.c, src/keycitus.c) and serialises each key on its shard.  Without Citus it
-- only raises 55000.  SECURITY INVOKER: distributing needs the tables'
-- owner, as create_distributed_table() does.
CREATE FUNCTION idempotency.distribute()
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
    msgs pg_catalog.text;
    convert pg_catalog.text;
    shells pg_catalog.bool;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension AS e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'idempotency.distribute() needs the citus extension'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'The citus extension is not installed in this database, so there is nothing to distribute the idempotency tables over.',
                  HINT = 'On a Citus coordinator: CREATE EXTENSION citus; then call idempotency.distribute() again. A single server needs no set-up.';
    END IF;
    -- On Citus the owner columns are idempotency.roleref, not regrole:
    -- role oids differ from node to node, and Citus copies shards between
    -- nodes (a shard move, create_distributed_table over rows already
    -- there, a reference table copied to a node added later) in binary
    -- where it can, where a regrole is its oid, which on the other node is
    -- another role or none (a moved key would be claimed again: paid
    -- twice).  A roleref has no binary form, so every copy carries the
    -- role's name and each node stores its own oid of that role; unlike
    -- the role's name (0.5.0 stored it as text), the oid stays with the
    -- role through ALTER ROLE ... RENAME and is not passed to a new role of
    -- the old name.  A regrole column (not yet distributed, or distributed
    -- by hand) and 0.5.0's text column are converted; the role of a text
    -- name that no longer exists is lost (owner 0: nobody's row), and so is
    -- a dropped role's oid, which a regrole prints (and 0.5.0 stored as
    -- text) as bare digits: to_regrole() would read them as the name of
    -- whatever role is called that (a role's own all-digit name prints
    -- quoted), handing it the dropped role's rows.
    -- Every node's own copy of the tables, here first (with Citus's DDL
    -- propagation: a table distributed already converts its shards and
    -- its shells on the workers), then on each worker (their copies, which
    -- become the tables' shells there; run_command_on_workers runs one
    -- statement).  A worker added later (citus_add_node()) got the
    -- tables from the install script, regrole and no write policy, as
    -- shells of distributed tables whose rows (its shards) Citus creates
    -- from the coordinator's definition: when the coordinator's tables are
    -- converted already (shells true), a worker converts its own shells,
    -- without propagation, and gives them the write policy below.  When
    -- the coordinator converts a distributed table here, its ALTER
    -- converts the shells (and a worker's own ALTER would wait for it).
    shells := NOT EXISTS (
        SELECT FROM pg_catalog.pg_attribute AS a
         WHERE a.attrelid OPERATOR(pg_catalog.=) ANY (ARRAY['idempotency.idempotency_key', 'idempotency.token',
                                                            'idempotency.seen_message', 'idempotency.state_machine']::pg_catalog.regclass[])
           AND a.attname OPERATOR(pg_catalog.=) 'owner'
           AND a.atttypid OPERATOR(pg_catalog.<>) 'idempotency.roleref'::pg_catalog.regtype);
    convert := $do$
DO $conv$
DECLARE
    t pg_catalog.text;
    p pg_catalog.name;
    shell pg_catalog.bool;
BEGIN
    FOREACH t IN ARRAY ARRAY['idempotency_key', 'token', 'seen_message', 'state_machine'] LOOP
        CONTINUE WHEN (SELECT a.atttypid FROM pg_catalog.pg_attribute AS a
                        WHERE a.attrelid OPERATOR(pg_catalog.=)
                              ('idempotency.' OPERATOR(pg_catalog.||) t)::pg_catalog.regclass
                          AND a.attname OPERATOR(pg_catalog.=) 'owner')
                      OPERATOR(pg_catalog.=) 'idempotency.roleref'::pg_catalog.regtype;
        -- a worker's shell of a table distributed already
        shell := NOT pg_catalog.citus_is_coordinator()
                 AND EXISTS (SELECT FROM pg_catalog.pg_dist_partition AS d
                              WHERE d.logicalrelid OPERATOR(pg_catalog.=)
                                    ('idempotency.' OPERATOR(pg_catalog.||) t)::pg_catalog.regclass);
        CONTINUE WHEN shell AND NOT @SHELLS@;
        IF shell THEN
            PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true);
        END IF;
        FOR p IN SELECT y.polname FROM pg_catalog.pg_policy AS y
                  WHERE y.polrelid OPERATOR(pg_catalog.=)
                        ('idempotency.' OPERATOR(pg_catalog.||) t)::pg_catalog.regclass
        LOOP
            EXECUTE pg_catalog.format('DROP POLICY %I ON idempotency.%I', p, t);
        END LOOP;
        EXECUTE pg_catalog.format('ALTER TABLE idempotency.%I ALTER COLUMN owner TYPE idempotency.roleref'
                                  ' USING (CASE WHEN owner::pg_catalog.text OPERATOR(pg_catalog.!~) ''[^0-9]'''
                                  ' THEN 0::pg_catalog.oid::pg_catalog.regrole'
                                  ' ELSE COALESCE(pg_catalog.to_regrole(owner::pg_catalog.text),'
                                  ' 0::pg_catalog.oid::pg_catalog.regrole) END)::idempotency.roleref', t);
        CONTINUE WHEN t OPERATOR(pg_catalog.=) 'state_machine';	-- no row security there
        EXECUTE pg_catalog.format('CREATE POLICY %I ON idempotency.%I FOR SELECT'
                                  ' USING (owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER)))',
                                  t OPERATOR(pg_catalog.||) '_own_rows', t);
    END LOOP;
    -- a worker's own copies of the route tables (src/keystore.c): a call
    -- made there updates nothing in them as the caller (a worker added
    -- later got them from the install script, with no grant).  Column
    -- grants only: LOCK TABLE needs a table grant
    IF NOT pg_catalog.citus_is_coordinator() THEN
        PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true);
        REVOKE ALL ON idempotency.key_route, idempotency.token_route FROM PUBLIC;
        GRANT SELECT (k), UPDATE (k) ON idempotency.key_route TO PUBLIC;
        GRANT SELECT (t), UPDATE (t) ON idempotency.token_route TO PUBLIC;
    END IF;
END
$conv$
$do$;
    convert := pg_catalog.replace(convert, '@SHELLS@', CASE WHEN shells THEN 'true' ELSE 'false' END);
    EXECUTE convert;
    FOR t IN SELECT w.nodename, w.nodeport, w.result
               FROM pg_catalog.run_command_on_workers(convert) AS w
              WHERE NOT w.success
    LOOP
        RAISE EXCEPTION 'idempotency.distribute() could not convert the owner columns on worker %:%', t.nodename, t.nodeport
            USING ERRCODE = 'object_not_in_prerequisite_state', DETAIL = t.result;
    END LOOP;
    FOR t IN
        SELECT v.tab, v.col, v.colocate
          FROM (VALUES (1, 'idempotency.idempotency_key', 'key', 'default'),
                       (2, 'idempotency.seen_message', 'message_id', 'idempotency.idempotency_key'),
                       (3, 'idempotency.token', 'token', 'default'),
                       (4, 'idempotency.state_machine', NULL, NULL),
                       -- derive_key()'s secret: one for every node,
                       -- the coordinator's, so a retry through any node derives
                       -- the same downstream keys
                       (5, 'idempotency.derive_secret', NULL, NULL),
                       -- the routes of a call to its shard's node
                       -- (src/keystore.c): keys and seen messages, tokens
                       (6, 'idempotency.key_route', 'k', 'idempotency.idempotency_key'),
                       (7, 'idempotency.token_route', 't', 'idempotency.token'))
               AS v(n, tab, col, colocate)
         ORDER BY v.n
    LOOP
        -- a table Citus knows already stays as it is (a second call is harmless)
        IF NOT EXISTS (
            SELECT FROM pg_catalog.pg_dist_partition AS p
             WHERE p.logicalrelid OPERATOR(pg_catalog.=) t.tab::pg_catalog.regclass) THEN
            -- quietly (the notice about the rows copied and the local copy)
            msgs := pg_catalog.current_setting('client_min_messages');
            PERFORM pg_catalog.set_config('client_min_messages', 'warning', true);
            IF t.col IS NULL THEN
                PERFORM pg_catalog.create_reference_table(t.tab::pg_catalog.regclass);
            ELSE
                PERFORM pg_catalog.create_distributed_table(t.tab::pg_catalog.regclass, t.col,
                                                            colocate_with => t.colocate);
            END IF;
            PERFORM pg_catalog.set_config('client_min_messages', msgs, true);
        END IF;
        -- The rows the table had here are copied to its shards, and Citus
        -- leaves them in this node's own copy, which no query reads any
        -- more: removed (derive_key()'s secret is not left behind, keys and
        -- tokens are not kept out of the purge's reach, and an update's
        -- ALTER TABLE ... SET NOT NULL does not trip over them: 0.5.0's
        -- distribute() left them).  Once: the local copy is empty after.
        IF pg_catalog.pg_relation_size(t.tab::pg_catalog.regclass) OPERATOR(pg_catalog.>) 0 THEN
            PERFORM pg_catalog.truncate_local_data_after_distributing_table(t.tab::pg_catalog.regclass);
        END IF;
    END LOOP;
    -- once() in autocommit runs on the node of its key's shard, in one
    -- round trip: Citus delegates the call by its key argument (co-located
    -- with the keys).  Inside a transaction block it is not delegated, and
    -- its statements are routed one by one.
    FOR t IN
        SELECT v.fn::pg_catalog.regprocedure AS fn
          FROM (VALUES ('idempotency.once(pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, pg_catalog.text[])'),
                       ('idempotency.once(pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, "any")')) AS v(fn)
    LOOP
        CONTINUE WHEN EXISTS (
            SELECT FROM pg_catalog.pg_dist_object AS o
             WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
               AND o.objid OPERATOR(pg_catalog.=) t.fn::pg_catalog.oid
               AND o.distribution_argument_index IS NOT NULL);
        PERFORM pg_catalog.create_distributed_function(t.fn, 'key',
                                                       colocate_with => 'idempotency.idempotency_key');
    END LOOP;
    -- No role but the owner writes the key, token and seen-message tables,
    -- on Citus as on a single server: a function writes a row
    -- on the node of its shard, as the owner, and a call whose shard is on
    -- another node is carried there through a query on the caller's
    -- connection that updates nothing in a route table (src/keystore.c):
    -- PUBLIC may UPDATE their column, which is always empty.  0.5.0's
    -- distribute() granted PUBLIC the writes under own-row policies (the
    -- functions wrote as the caller), which let a role rewrite its own
    -- keys (and a BYPASSRLS role every role's) with plain SQL: removed here
    -- again (the update from 0.5.0 removes them too), on every node
    -- (Citus carries a table's GRANT, REVOKE and policies to its shells
    -- and shards).
    FOR t IN SELECT v.tab FROM (VALUES ('idempotency_key'), ('token'), ('seen_message')) AS v(tab)
    LOOP
        IF EXISTS (SELECT FROM pg_catalog.pg_policy AS p
                    WHERE p.polrelid OPERATOR(pg_catalog.=)
                          ('idempotency.' OPERATOR(pg_catalog.||) t.tab)::pg_catalog.regclass
                      AND p.polname OPERATOR(pg_catalog.=) (t.tab OPERATOR(pg_catalog.||) '_own_rows_write')) THEN
            EXECUTE pg_catalog.format('DROP POLICY %I ON idempotency.%I',
                                      t.tab OPERATOR(pg_catalog.||) '_own_rows_write', t.tab);
        END IF;
        EXECUTE pg_catalog.format('REVOKE INSERT, UPDATE, DELETE ON idempotency.%I FROM PUBLIC', t.tab);
    END LOOP;
    -- the route tables: PUBLIC may UPDATE their one column (always empty:
    -- nothing to update) and read it; a column grant, not a table grant,
    -- so that no role may LOCK TABLE them and hold up every other role's
    -- carried calls (LOCK TABLE checks table privileges only)
    REVOKE ALL ON idempotency.key_route, idempotency.token_route FROM PUBLIC;
    GRANT SELECT (k), UPDATE (k) ON idempotency.key_route TO PUBLIC;
    GRANT SELECT (t), UPDATE (t) ON idempotency.token_route TO PUBLIC;
END
$$;
COMMENT ON FUNCTION idempotency.distribute() IS
'Citus coordinator: distribute the key table, seen messages and tokens, make state machines and derive_key()''s secret reference tables, delegate once() to the node of its key; 55000 without Citus';
REVOKE ALL ON FUNCTION idempotency.distribute() FROM PUBLIC;

-- == identity ==
-- derive_key()'s seed: drawn by the library when a key's row is first
-- written (version byte 2, the tag of the derive secret it derives with,
-- 16 fresh bytes), kept by every later write of the row in the same life,
-- dumped and restored with it.  A derived key is a MAC, keyed with the
-- secret the seed's tag names, of the seed, the key's created_at, scope,
-- key and step, so it follows the row: not the role's name (a rename
-- changes nothing, a new role of an old name derives none of the old
-- role's keys), not the database's copied state (a template clone draws
-- other seeds), and not whichever secret is oldest (a restore into a
-- database that has keys of its own keeps both sets).  Rows stored before
-- 0.6.0 carry version 0: the row's created_at, the tag of 0.5.0's secret
-- and the role's name frozen by the update (see the update script).  No
-- DEFAULT and no NOT NULL: a row restored from a dump of 0.5.0 (whose COPY
-- does not name the column) has no seed, and derives as 0.5.0 did, with
-- the secret restored from the same dump (derive_secret.restored_050).
-- Added with ALTER, here as in the update script, so a fresh and an
-- updated database have the same column order.
ALTER TABLE idempotency.idempotency_key
    ADD COLUMN derive_seed pg_catalog.bytea;
COMMENT ON COLUMN idempotency.idempotency_key.derive_seed IS
'derive_key()''s per-key seed: version byte 2, the tag of its derive secret and 16 random bytes drawn when the row was first written (version 0: for keys stored before 0.6.0, the tag of 0.5.0''s secret and the role''s name; NULL: restored from a dump of 0.5.0)';
-- Which derive secret serves the key rows restored from a dump of 0.5.0
-- (no derive_seed): the rows that dump restores come without this column
-- and take its DEFAULT, true; the secrets of this install, and of 0.5.0
-- updated in place (whose keys the update tied to their secret), are false.
ALTER TABLE idempotency.derive_secret
    ADD COLUMN restored_050 pg_catalog.bool NOT NULL DEFAULT true;
UPDATE idempotency.derive_secret SET restored_050 = false;
COMMENT ON COLUMN idempotency.derive_secret.restored_050 IS
'true for a secret restored from a dump of 0.5.0: the oldest such serves that dump''s key rows, which have no derive_seed';

-- The owner columns of keys, tokens, seen messages and state machines are
-- idempotency.roleref on a single server too, as distribute() makes them on
-- Citus: logical replication to another cluster (a blue/green switch, a
-- major upgrade by replication) with binary = true copied a regrole as the
-- publisher's oid, which the subscriber read as whatever role has that oid
-- there (it replayed another role's stored answers), and a dropped role's
-- rows travelled as its bare oid even as text.  A roleref has no binary
-- form: every copy carries the role's name ("-", nobody, for a dropped
-- role), and each cluster stores its own oid of that role.  On disk and in
-- every comparison it is the oid, as regrole was (binary-coercible casts:
-- no rewrite, the primary key keeps oid_ops, the fast path is unchanged).
-- A table distributed by Citus (or holding 0.5.0's text owner names there)
-- is left to distribute().  The row security policy is dropped and made
-- again around the change (a policy's column cannot change type under it).
DO $$
DECLARE
    t pg_catalog.text;
    rel pg_catalog.regclass;
    citus pg_catalog.bool := EXISTS (SELECT FROM pg_catalog.pg_extension AS e
                                      WHERE e.extname OPERATOR(pg_catalog.=) 'citus');
BEGIN
    FOREACH t IN ARRAY ARRAY['idempotency_key', 'token', 'seen_message', 'state_machine'] LOOP
        rel := ('idempotency.' OPERATOR(pg_catalog.||) t)::pg_catalog.regclass;
        CONTINUE WHEN (SELECT a.atttypid FROM pg_catalog.pg_attribute AS a
                        WHERE a.attrelid OPERATOR(pg_catalog.=) rel
                          AND a.attname OPERATOR(pg_catalog.=) 'owner')
                      OPERATOR(pg_catalog.<>) 'pg_catalog.regrole'::pg_catalog.regtype;
        IF citus THEN
            CONTINUE WHEN EXISTS (SELECT FROM pg_catalog.pg_dist_partition AS d
                                   WHERE d.logicalrelid OPERATOR(pg_catalog.=) rel);
        END IF;
        IF t OPERATOR(pg_catalog.<>) 'state_machine' THEN
            EXECUTE pg_catalog.format('DROP POLICY %I ON idempotency.%I', t OPERATOR(pg_catalog.||) '_own_rows', t);
        END IF;
        EXECUTE pg_catalog.format('ALTER TABLE idempotency.%I ALTER COLUMN owner TYPE idempotency.roleref', t);
        IF t OPERATOR(pg_catalog.<>) 'state_machine' THEN
            EXECUTE pg_catalog.format('CREATE POLICY %I ON idempotency.%I FOR SELECT'
                                      ' USING (owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER)))',
                                      t OPERATOR(pg_catalog.||) '_own_rows', t);
        END IF;
    END LOOP;
END
$$;

-- == key health for monitoring roles ==
-- What an operator watches (docs/operations.md): per role and scope, the
-- keys by status, the oldest key in progress, leases past their end and the
-- purge backlog, as aggregates only: no key, request fingerprint or
-- response leaves the function.  SECURITY DEFINER because row security
-- shows every other role, a monitoring role included, none of a role's
-- rows; search_path pinned so that nothing of the caller's is found.  Not
-- PUBLIC: EXECUTE to pg_read_all_stats (and so to pg_monitor), as for the
-- other roles' rows of idempotency.stats; each application role reads its
-- own keys in the table.  One sequential scan of the key table (no index
-- serves counts by status); docs/operations.md gives its cost at 1 M keys.
CREATE FUNCTION idempotency.key_health(
    OUT userid                 pg_catalog.oid,
    OUT scope                  pg_catalog.text,
    OUT in_progress            pg_catalog.int8,
    OUT completed              pg_catalog.int8,
    OUT failed_retryable       pg_catalog.int8,
    OUT failed_final           pg_catalog.int8,
    OUT oldest_in_progress_age pg_catalog.interval,
    OUT lapsed_leases          pg_catalog.int8,
    OUT longest_lapse          pg_catalog.interval,
    OUT expired                pg_catalog.int8,
    OUT oldest_expired_age     pg_catalog.interval)
RETURNS SETOF record
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
SELECT k.owner::pg_catalog.oid, k.scope,
       pg_catalog.count(*) FILTER (WHERE k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
                                     AND k.status OPERATOR(pg_catalog.=) 'in_progress'),
       pg_catalog.count(*) FILTER (WHERE k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
                                     AND k.status OPERATOR(pg_catalog.=) 'completed'),
       pg_catalog.count(*) FILTER (WHERE k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
                                     AND k.status OPERATOR(pg_catalog.=) 'failed' AND k.retryable),
       pg_catalog.count(*) FILTER (WHERE k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
                                     AND k.status OPERATOR(pg_catalog.=) 'failed' AND NOT k.retryable),
       pg_catalog.now() OPERATOR(pg_catalog.-)
           pg_catalog.min(k.created_at) FILTER (WHERE k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
                                                  AND k.status OPERATOR(pg_catalog.=) 'in_progress'),
       pg_catalog.count(*) FILTER (WHERE k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
                                     AND k.status OPERATOR(pg_catalog.=) 'in_progress'
                                     AND k.locked_until OPERATOR(pg_catalog.<=) pg_catalog.now()),
       pg_catalog.now() OPERATOR(pg_catalog.-)
           pg_catalog.min(k.locked_until) FILTER (WHERE k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
                                                    AND k.status OPERATOR(pg_catalog.=) 'in_progress'
                                                    AND k.locked_until OPERATOR(pg_catalog.<=) pg_catalog.now()),
       pg_catalog.count(*) FILTER (WHERE k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()),
       pg_catalog.now() OPERATOR(pg_catalog.-)
           pg_catalog.min(k.expires_at) FILTER (WHERE k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now())
  FROM idempotency.idempotency_key AS k
 GROUP BY k.owner::pg_catalog.oid, k.scope
$$;
COMMENT ON FUNCTION idempotency.key_health() IS
'Counts and ages of every role''s keys per scope, no key or response (pg_read_all_stats, e.g. pg_monitor, only); use the view idempotency.key_health';
REVOKE ALL ON FUNCTION idempotency.key_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.key_health() TO pg_read_all_stats;

-- the role's name beside its oid (NULL for a dropped role's rows, which the
-- purge removes when they expire).  Read with the caller's right to EXECUTE
-- the function: another role given SELECT on the view needs EXECUTE too.
CREATE VIEW idempotency.key_health AS
SELECT h.userid, r.rolname AS role, h.scope,
       h.in_progress, h.completed, h.failed_retryable, h.failed_final,
       h.oldest_in_progress_age, h.lapsed_leases, h.longest_lapse,
       h.expired, h.oldest_expired_age
  FROM idempotency.key_health() AS h
  LEFT JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) h.userid;
COMMENT ON VIEW idempotency.key_health IS
'Key health per role and scope for monitoring (pg_read_all_stats, e.g. pg_monitor): keys by status, the oldest in progress, lapsed leases, the purge backlog; never a key, request or response';
COMMENT ON COLUMN idempotency.key_health.in_progress IS 'live keys in progress (lease mode: a single-transaction key has no row until it is finished)';
COMMENT ON COLUMN idempotency.key_health.completed IS 'live keys completed';
COMMENT ON COLUMN idempotency.key_health.failed_retryable IS 'live keys failed retryably (the next begin() retries)';
COMMENT ON COLUMN idempotency.key_health.failed_final IS 'live keys failed for good (replayed until they expire or forget())';
COMMENT ON COLUMN idempotency.key_health.oldest_in_progress_age IS 'now() minus created_at of the oldest live key in progress; NULL when none';
COMMENT ON COLUMN idempotency.key_health.lapsed_leases IS 'live keys in progress whose lease has ended and that no begin() has taken over yet';
COMMENT ON COLUMN idempotency.key_health.longest_lapse IS 'now() minus the earliest lease end among them; NULL when none';
COMMENT ON COLUMN idempotency.key_health.expired IS 'purge backlog: rows past expires_at that purge() or the purge worker has not deleted yet (they behave as absent)';
COMMENT ON COLUMN idempotency.key_health.oldest_expired_age IS 'now() minus the earliest expires_at among them; NULL when none';
REVOKE ALL ON idempotency.key_health FROM PUBLIC;
GRANT SELECT ON idempotency.key_health TO pg_read_all_stats;

-- == the parameters any role may set, before the library is loaded ==
-- idempotency.lock_wait, default_ttl and max_key_length are user-settable.
-- Until the library is loaded in a session, PostgreSQL knows them only as
-- placeholders and lets no role but a superuser store one with ALTER
-- FUNCTION, PROCEDURE, ROLE or DATABASE ... SET (42501), unless the role
-- holds SET on the parameter: without this grant, an application's own
-- procedure with SET idempotency.lock_wait (docs/procedures.md) could not
-- be created in a fresh session, nor restored from its dump, by the
-- application.  The grant is the cluster's (pg_parameter_acl), not this
-- database's: DROP EXTENSION leaves it, pg_dumpall keeps it, and once the
-- library is loaded it changes nothing.
GRANT SET ON PARAMETER idempotency.lock_wait, idempotency.default_ttl, idempotency.max_key_length TO PUBLIC;
