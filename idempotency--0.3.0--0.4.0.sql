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
-- sessions hold the same key: don't, or restart every session after.
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

-- ---------------------------------------------------------------------
-- Write helpers
-- ---------------------------------------------------------------------

-- ---------------------------------------------------------------------
-- One round trip: once(), lookup(), HTTP responses
-- ---------------------------------------------------------------------
