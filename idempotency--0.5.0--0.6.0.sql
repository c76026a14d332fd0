/* idempotency--0.5.0--0.6.0.sql: update from 0.5.0 to 0.6.0 */

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.6.0'" to load this file. \quit

-- Each concern of the second review (issue 25) keeps its own section below,
-- so that work on one does not touch the lines of another.

-- == outbox (issue 25, findings 1-3, 7, 8) ==
-- Finding 1: the message policy's subquery compared g.topic_id with itself
-- (a bare topic_id binds to the nearest FROM, g), so a consumer of any
-- topic read every topic's messages.  Every column qualified now.
ALTER POLICY outbox_message_own_rows ON idempotency.outbox_message
    USING (outbox_message.owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))
           OR EXISTS (SELECT 1 FROM idempotency.outbox_grant AS g
                       WHERE g.topic_id OPERATOR(pg_catalog.=) outbox_message.topic_id
                         AND g.grantee OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))
                         AND g.can_consume));
-- Finding 3: redrive() gives a message a new id behind its key's others
-- (findings 2, 7, 8 and the smaller two are in src/outbox.c only)
COMMENT ON COLUMN idempotency.outbox_message.id IS 'taken after the message key''s lock: per key, id order is commit order; redrive() gives a message a new one';
COMMENT ON FUNCTION idempotency.redrive(pg_catalog.text, pg_catalog.int8[]) IS
'Send dead messages of a topic again (all of them, or those ids) with their attempts reset, each behind the other messages of its key (a new id, the same message_id); returns how many';


-- == purge (issue 25, findings 6, 9) ==
-- No SQL change: the purge's statements are in src/lifecycle.c, the launcher's
-- bound per database in src/worker.c (setting idempotency.purge_timeout).

-- == identity (issue 25, findings 4, 5) ==
-- derive_key() derives from a per-key seed (see the install script).  Keys
-- stored before the update keep the key 0.5.0 derived for them: their seed
-- is version 0 followed by the owner's name as it is now, frozen, so a
-- request in flight across the update (and a rename after it) sends the
-- same key downstream.  On Citus the owner column holds the name already
-- (distribute()); keys of a dropped role get an empty name (nobody can
-- call derive_key() as a dropped role).
ALTER TABLE idempotency.idempotency_key
    ADD COLUMN derive_seed pg_catalog.bytea;
DO $$
DECLARE
    enc pg_catalog.name := pg_catalog.getdatabaseencoding();
BEGIN
    IF (SELECT a.atttypid FROM pg_catalog.pg_attribute AS a
         WHERE a.attrelid OPERATOR(pg_catalog.=) 'idempotency.idempotency_key'::pg_catalog.regclass
           AND a.attname OPERATOR(pg_catalog.=) 'owner')
       OPERATOR(pg_catalog.=) 'pg_catalog.regrole'::pg_catalog.regtype THEN
        UPDATE idempotency.idempotency_key AS k
           SET derive_seed = '\x00'::pg_catalog.bytea OPERATOR(pg_catalog.||)
                             pg_catalog.convert_to(r.rolname::pg_catalog.text, enc)
          FROM pg_catalog.pg_roles AS r
         WHERE r.oid OPERATOR(pg_catalog.=) k.owner::pg_catalog.oid;
    ELSE
        UPDATE idempotency.idempotency_key AS k
           SET derive_seed = '\x00'::pg_catalog.bytea OPERATOR(pg_catalog.||)
                             pg_catalog.convert_to(k.owner::pg_catalog.text, enc);
    END IF;
    UPDATE idempotency.idempotency_key AS k
       SET derive_seed = '\x00'::pg_catalog.bytea
     WHERE k.derive_seed IS NULL;
END
$$;
ALTER TABLE idempotency.idempotency_key
    ALTER COLUMN derive_seed SET DEFAULT
        ('\x01'::pg_catalog.bytea OPERATOR(pg_catalog.||) pg_catalog.uuid_send(pg_catalog.gen_random_uuid())),
    ALTER COLUMN derive_seed SET NOT NULL;
COMMENT ON COLUMN idempotency.idempotency_key.derive_seed IS
'derive_key()''s per-key seed: version byte 1 and 16 random bytes drawn when the row was first written (version 0: the role''s name, for keys stored before 0.6.0)';
