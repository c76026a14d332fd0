/* idempotency--0.1.0--0.2.0.sql: lease mode, purge, one-time tokens, consumer dedup, write helpers */

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.2.0'" to load this file. \quit

-- No CHECK constraints on the key table: only the extension writes it, and
-- PostgreSQL re-reads each CHECK expression on every INSERT (27% of a
-- guarded request's server time, bench/instructions.sh; the current
-- version's install script says what keeps the rows valid without them).
ALTER TABLE idempotency.idempotency_key
    DROP CONSTRAINT idempotency_key_status_check,
    DROP CONSTRAINT idempotency_key_request_hash_check,
    DROP CONSTRAINT idempotency_key_attempts_check,
    DROP CONSTRAINT idempotency_key_retryable_check;

-- purge() finds expired rows through this index
CREATE INDEX idempotency_key_expires_at_idx ON idempotency.idempotency_key (expires_at);

DROP FUNCTION idempotency.begin(pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, pg_catalog.interval, pg_catalog.interval);
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

-- complete() and fail() take the attempt a lease holder proves itself with.
-- The C functions accept both argument lists (and begin() both result
-- forms), so nothing breaks between installing the new library and running
-- this script.
DROP FUNCTION idempotency.complete(pg_catalog.text, pg_catalog.jsonb, pg_catalog.text);
DROP FUNCTION idempotency.fail(pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, pg_catalog.bool);

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
SELECT pg_catalog.pg_extension_config_dump('idempotency.token', '');

-- ---------------------------------------------------------------------
-- Consumer deduplication: message ids seen per (role, scope)
-- ---------------------------------------------------------------------
CREATE TABLE idempotency.seen_message (
    owner         pg_catalog.regrole     NOT NULL,
    scope         pg_catalog.text        COLLATE "C" NOT NULL,
    message_id    pg_catalog.text        COLLATE "C" NOT NULL,
    first_seen_at pg_catalog.timestamptz NOT NULL,
    expires_at    pg_catalog.timestamptz NOT NULL,
    CONSTRAINT seen_message_pkey PRIMARY KEY (owner, scope, message_id)
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
SELECT pg_catalog.pg_extension_config_dump('idempotency.seen_message', '');

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
SELECT pg_catalog.pg_extension_config_dump('idempotency.state_machine', '');

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
