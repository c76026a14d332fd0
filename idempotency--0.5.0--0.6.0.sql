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

-- == identity (issue 25, findings 4, 5) ==
