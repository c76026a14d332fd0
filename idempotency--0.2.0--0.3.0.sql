/* idempotency--0.2.0--0.3.0.sql: primary keys lead with the key */

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3.0'" to load this file. \quit

-- The primary keys put the column that differs first.  Owner and scope
-- repeat across most rows, so with (owner, scope, key) every comparison in
-- the index compared all three columns; with the key first it usually ends
-- at the first.  Same uniqueness, same rows; the library reads the column
-- order from the catalog, so it works before and after this script.
--
-- Rebuilding a primary key holds an ACCESS EXCLUSIVE lock on the table for
-- as long as the index build takes (README, "Upgrading").
ALTER TABLE idempotency.idempotency_key
    DROP CONSTRAINT idempotency_key_pkey,
    ADD CONSTRAINT idempotency_key_pkey PRIMARY KEY (key, scope, owner);

ALTER TABLE idempotency.seen_message
    DROP CONSTRAINT seen_message_pkey,
    ADD CONSTRAINT seen_message_pkey PRIMARY KEY (message_id, scope, owner);
