/* idempotency--0.4.0--0.5.0.sql: update from 0.4.0 to 0.5.0 */

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.5.0'" to load this file. \quit

-- Each feature keeps its own section below, in the order of the 0.5.0
-- install script's additions.

-- == review fixes (issue 21) ==

-- == recovery points (issue 19) ==

-- == outbox (issue 18) ==

-- == Citus (issue 17) ==
-- One set-up step on a Citus coordinator (README "Scaling out with
-- Citus"): the key table and seen_message distributed by key and message
-- id in one co-location group (a business table distributed by the same
-- key, text COLLATE "C", joins it), tokens distributed by token, the state
-- machines a reference table; once() delegated to the node of its key.
-- The C code detects the distribution
-- (src/keystore.c) and serialises each key on its shard.  Without Citus it
-- only raises 55000.  SECURITY INVOKER: distributing needs the tables'
-- owner, as create_distributed_table() does.
CREATE FUNCTION idempotency.distribute()
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension AS e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'idempotency.distribute() needs the citus extension'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'The citus extension is not installed in this database, so there is nothing to distribute the idempotency tables over.',
                  HINT = 'On a Citus coordinator: CREATE EXTENSION citus; then call idempotency.distribute() again. A single server needs no set-up.';
    END IF;
    FOR t IN
        SELECT v.tab, v.col, v.colocate
          FROM (VALUES (1, 'idempotency.idempotency_key', 'key', 'default'),
                       (2, 'idempotency.seen_message', 'message_id', 'idempotency.idempotency_key'),
                       (3, 'idempotency.token', 'token', 'default'),
                       (4, 'idempotency.state_machine', NULL, NULL))
               AS v(n, tab, col, colocate)
         ORDER BY v.n
    LOOP
        -- a table Citus knows already stays as it is (a second call is harmless)
        CONTINUE WHEN EXISTS (
            SELECT FROM pg_catalog.pg_dist_partition AS p
             WHERE p.logicalrelid OPERATOR(pg_catalog.=) t.tab::pg_catalog.regclass);
        IF t.col IS NULL THEN
            PERFORM pg_catalog.create_reference_table(t.tab::pg_catalog.regclass);
        ELSE
            PERFORM pg_catalog.create_distributed_table(t.tab::pg_catalog.regclass, t.col,
                                                        colocate_with => t.colocate);
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
    -- On Citus a transaction's writes to a group of co-located shards go
    -- through one connection per role, and the caller's own work writes
    -- there too: so the functions write keys, tokens and messages as the
    -- caller (src/runas.c), and each role may write only its own rows.
    FOR t IN SELECT v.tab FROM (VALUES ('idempotency_key'), ('token'), ('seen_message')) AS v(tab)
    LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_policy AS p
                        WHERE p.polrelid OPERATOR(pg_catalog.=)
                              ('idempotency.' OPERATOR(pg_catalog.||) t.tab)::pg_catalog.regclass
                          AND p.polname OPERATOR(pg_catalog.=) (t.tab OPERATOR(pg_catalog.||) '_own_rows_write')) THEN
            EXECUTE pg_catalog.format(
                'CREATE POLICY %I ON idempotency.%I FOR ALL'
                ' USING (owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER)))'
                ' WITH CHECK (owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER)))',
                t.tab OPERATOR(pg_catalog.||) '_own_rows_write', t.tab);
        END IF;
        EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency.%I TO PUBLIC', t.tab);
    END LOOP;
END
$$;
COMMENT ON FUNCTION idempotency.distribute() IS
'Citus coordinator: distribute the key table, seen messages and tokens, make state machines a reference table, delegate once() to the node of its key; 55000 without Citus';
REVOKE ALL ON FUNCTION idempotency.distribute() FROM PUBLIC;
