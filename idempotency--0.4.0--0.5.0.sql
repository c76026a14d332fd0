/* idempotency--0.4.0--0.5.0.sql: update from 0.4.0 to 0.5.0 */

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.5.0'" to load this file. \quit

-- Each feature keeps its own section below, in the order of the 0.5.0
-- install script's additions.

-- == review fixes (issue 21) ==

-- == recovery points (issue 19) ==
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

-- == outbox (issue 18) ==

-- == Citus (issue 17) ==
