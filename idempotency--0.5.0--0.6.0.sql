/* idempotency--0.5.0--0.6.0.sql: update from 0.5.0 to 0.6.0 */

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.6.0'" to load this file. \quit

-- One section per concern below.

-- == outbox ==
-- (the message and grant policies are made again with the owner columns'
-- change to idempotency.roleref, below)
-- redrive() gives a message a new id behind its key's others (the other
-- outbox fixes of 0.6.0 are in src/outbox_topics.c and src/outbox_relay.c
-- only)
COMMENT ON COLUMN idempotency.outbox_message.id IS 'taken after the message key''s lock: per key, id order is commit order; redrive() gives a message a new one';
COMMENT ON FUNCTION idempotency.redrive(pg_catalog.text, pg_catalog.int8[]) IS
'Send dead messages of a topic again (all of them, or those ids) with their attempts reset, each behind the other messages of its key (a new id, the same message_id); returns how many';


-- == purge ==
-- No SQL change: the purge's statements are in src/lifecycle.c, the launcher's
-- bound per database in src/worker.c (setting idempotency.purge_timeout).

-- == identity ==
-- derive_key() derives from a per-key seed (see the install script).  Keys
-- stored before the update keep the key 0.5.0 derived for them: their seed
-- is version 0, the row's created_at (8 bytes, as timestamptz_send gives
-- it), the tag of the secret 0.5.0 used (its oldest row; the first 8 bytes
-- of its SHA-256) and the owner's name as it is now, frozen, so a request
-- in flight across the update (and a rename after it, and a restore of a
-- dump into a database that has a secret of its own) sends the same key
-- downstream; new work over such a row once it expired (another
-- created_at) derives new keys from a new seed.  On Citus the owner column holds the name already
-- (distribute()); keys of a dropped role get an empty name (nobody can
-- call derive_key() as a dropped role).  The column has no DEFAULT and may
-- be NULL: a row restored later from a dump of 0.5.0 has none, and derives
-- with the secret restored from that dump (derive_secret.restored_050,
-- true by default, false for the secrets here, whose rows the tag ties).
DO $$
DECLARE
    enc pg_catalog.name := pg_catalog.getdatabaseencoding();
    fill pg_catalog.bool := true;
    tag pg_catalog.bytea;
BEGIN
    ALTER TABLE idempotency.idempotency_key
        ADD COLUMN IF NOT EXISTS derive_seed pg_catalog.bytea;
    ALTER TABLE idempotency.derive_secret
        ADD COLUMN IF NOT EXISTS restored_050 pg_catalog.bool NOT NULL DEFAULT true;
    -- On Citus (0.5.0's distribute()) the key table's rows live in shards,
    -- which the coordinator's UPDATE below reaches.  Two things beside
    -- them: the coordinator's own copy of the table keeps the rows it had
    -- when it was distributed (create_distributed_table() leaves them, and
    -- 0.5.0's distribute() did not remove them), which no query reads:
    -- removed, as Citus's
    -- truncate_local_data_after_distributing_table() removes them; and a
    -- worker, which runs this script too (Citus carries ALTER EXTENSION
    -- UPDATE to the workers), leaves the rows to the coordinator's UPDATE.
    IF EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname OPERATOR(pg_catalog.=) 'citus') THEN
        IF EXISTS (SELECT FROM pg_catalog.pg_dist_partition AS d
                    WHERE d.logicalrelid OPERATOR(pg_catalog.=) 'idempotency.idempotency_key'::pg_catalog.regclass) THEN
            IF NOT pg_catalog.citus_is_coordinator() THEN
                fill := false;
            ELSIF pg_catalog.pg_relation_size('idempotency.idempotency_key'::pg_catalog.regclass)
               OPERATOR(pg_catalog.>) 0 THEN
                PERFORM pg_catalog.truncate_local_data_after_distributing_table(
                    'idempotency.idempotency_key'::pg_catalog.regclass);
            END IF;
        END IF;
    END IF;
    -- the tag of 0.5.0's secret (its oldest row), where the rows are filled
    -- (a Citus worker reads no reference table from here)
    IF fill THEN
        SELECT pg_catalog.substr(pg_catalog.sha256(s.secret), 1, 8) INTO tag
          FROM idempotency.derive_secret AS s
         ORDER BY s.created_at, s.secret LIMIT 1;
        tag := COALESCE(tag, '\x0000000000000000'::pg_catalog.bytea);
    END IF;
    IF NOT fill THEN
        NULL;
    ELSIF (SELECT a.atttypid FROM pg_catalog.pg_attribute AS a
         WHERE a.attrelid OPERATOR(pg_catalog.=) 'idempotency.idempotency_key'::pg_catalog.regclass
           AND a.attname OPERATOR(pg_catalog.=) 'owner')
       OPERATOR(pg_catalog.=) 'pg_catalog.regrole'::pg_catalog.regtype THEN
        UPDATE idempotency.idempotency_key AS k
           SET derive_seed = '\x00'::pg_catalog.bytea OPERATOR(pg_catalog.||)
                             pg_catalog.timestamptz_send(k.created_at) OPERATOR(pg_catalog.||)
                             tag OPERATOR(pg_catalog.||)
                             pg_catalog.convert_to(r.rolname::pg_catalog.text, enc)
          FROM pg_catalog.pg_roles AS r
         WHERE r.oid OPERATOR(pg_catalog.=) k.owner::pg_catalog.oid;
    ELSE
        -- Citus, owner names (0.5.0's distribute()): regrole's output,
        -- quoted where the name needs it ("Pay-Role"), but 0.5.0's
        -- derive_key() hashed the name itself: unquote (quote_ident's
        -- inverse), then the name's bytes in the database's encoding, as
        -- convert_to() gives them, but by immutable functions only: Citus
        -- runs an UPDATE of a distributed table on its shards and refuses
        -- one that calls a STABLE function (convert_to) on a column.
        -- byteain's escape format copies every byte but a backslash, which
        -- replace() doubles.
        UPDATE idempotency.idempotency_key AS k
           SET derive_seed = '\x00'::pg_catalog.bytea OPERATOR(pg_catalog.||)
                             pg_catalog.timestamptz_send(k.created_at) OPERATOR(pg_catalog.||)
                             tag OPERATOR(pg_catalog.||)
                             pg_catalog.byteain(pg_catalog.textout(pg_catalog.replace(
                                 CASE WHEN pg_catalog.left(k.owner::pg_catalog.text, 1) OPERATOR(pg_catalog.=) '"'
                                      THEN pg_catalog.replace(pg_catalog.substr(k.owner::pg_catalog.text, 2,
                                               pg_catalog.length(k.owner::pg_catalog.text) OPERATOR(pg_catalog.-) 2),
                                           '""', '"')
                                      ELSE k.owner::pg_catalog.text END,
                                 E'\\', E'\\\\')));
    END IF;
    IF fill THEN
        UPDATE idempotency.idempotency_key AS k
           SET derive_seed = '\x00'::pg_catalog.bytea OPERATOR(pg_catalog.||)
                             pg_catalog.timestamptz_send(k.created_at) OPERATOR(pg_catalog.||) tag
         WHERE k.derive_seed IS NULL;
        UPDATE idempotency.derive_secret SET restored_050 = false;
    END IF;
    COMMENT ON COLUMN idempotency.idempotency_key.derive_seed IS
    'derive_key()''s per-key seed: version byte 2, the tag of its derive secret and 16 random bytes drawn when the row was first written (version 0: for keys stored before 0.6.0, the tag of 0.5.0''s secret and the role''s name; NULL: restored from a dump of 0.5.0)';
    COMMENT ON COLUMN idempotency.derive_secret.restored_050 IS
    'true for a secret restored from a dump of 0.5.0: the oldest such serves that dump''s key rows, which have no derive_seed';
END
$$;

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

-- The outbox's owner and grantee columns are idempotency.roleref too: a
-- copy to another cluster (logical replication with binary = true, a dump
-- restored there) carries the role's name, never an oid that names
-- another role there.  published_by likewise: the message belongs to the
-- topic's owner and is dumped while that role exists, but its publisher
-- may have been dropped since, and a regrole would dump that oid as a bare
-- number, read back by a restore as whatever role has it there; a roleref
-- prints it as "-" (nobody, oid 0).  The three policies and outbox_stats
-- read these columns: they are dropped and made again around the change
-- (outbox_stats further down, with its new columns).
DROP POLICY outbox_grant_own_rows ON idempotency.outbox_grant;
DROP POLICY outbox_topic_own_rows ON idempotency.outbox_topic;
DROP POLICY outbox_message_own_rows ON idempotency.outbox_message;
DROP VIEW idempotency.outbox_stats;
ALTER TABLE idempotency.outbox_topic ALTER COLUMN owner TYPE idempotency.roleref;
ALTER TABLE idempotency.outbox_grant ALTER COLUMN grantee TYPE idempotency.roleref,
    ALTER COLUMN topic_owner TYPE idempotency.roleref;
ALTER TABLE idempotency.outbox_message ALTER COLUMN owner TYPE idempotency.roleref,
    ALTER COLUMN published_by TYPE idempotency.roleref;
COMMENT ON COLUMN idempotency.outbox_message.published_by IS
'the role that published the message; - (oid 0) in a dump or restore once that role is dropped';
-- A topic whose owner was dropped belongs to no role: a grant counts only
-- while the topic's owner exists (the topic and message policies read the
-- grants through this one; outbox_stats checks it itself).
CREATE POLICY outbox_grant_own_rows ON idempotency.outbox_grant
    FOR SELECT
    USING (grantee OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))
           AND EXISTS (SELECT FROM pg_catalog.pg_roles AS r
                        WHERE r.oid OPERATOR(pg_catalog.=) outbox_grant.topic_owner::pg_catalog.oid)
           OR topic_owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER)));
CREATE POLICY outbox_topic_own_rows ON idempotency.outbox_topic
    FOR SELECT
    USING (owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))
           OR EXISTS (SELECT 1 FROM idempotency.outbox_grant AS g
                       WHERE g.topic_id OPERATOR(pg_catalog.=) id
                         AND g.grantee OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))));
-- The message policy's subquery compared g.topic_id with itself
-- (a bare topic_id binds to the nearest FROM, g), so a consumer of any
-- topic read every topic's messages.  Every column qualified now.
CREATE POLICY outbox_message_own_rows ON idempotency.outbox_message
    FOR SELECT
    USING (outbox_message.owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))
           OR EXISTS (SELECT 1 FROM idempotency.outbox_grant AS g
                       WHERE g.topic_id OPERATOR(pg_catalog.=) outbox_message.topic_id
                         AND g.grantee OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))
                         AND g.can_consume));

-- distribute() turns owner columns into idempotency.roleref (0.5.0 made
-- them text names: a renamed role's retry paid twice on Citus).  On a
-- Citus cluster distributed by 0.5.0, run SELECT idempotency.distribute()
-- on the coordinator once after this update: it converts the columns of
-- every node (the library refuses a text owner column until then, 55000).
CREATE OR REPLACE FUNCTION idempotency.distribute()
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

-- Dumps carry only the rows of roles that exist: a dropped
-- role's rows dumped its oid as a bare number, which a restore into
-- another cluster read as whatever role had that oid there.
SELECT pg_catalog.pg_extension_config_dump('idempotency.idempotency_key',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) idempotency_key.owner::pg_catalog.oid)');
SELECT pg_catalog.pg_extension_config_dump('idempotency.token',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) token.owner::pg_catalog.oid)');
SELECT pg_catalog.pg_extension_config_dump('idempotency.seen_message',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) seen_message.owner::pg_catalog.oid)');
SELECT pg_catalog.pg_extension_config_dump('idempotency.state_machine',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) state_machine.owner::pg_catalog.oid)');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_topic',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) outbox_topic.owner::pg_catalog.oid)');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_grant',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) outbox_grant.topic_owner::pg_catalog.oid) AND EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) outbox_grant.grantee::pg_catalog.oid)');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_message',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) outbox_message.owner::pg_catalog.oid)');

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
-- outbox_stats adds the counts in shared memory (dropped above)
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

-- NOTIFY off by default for new topics (topics that exist keep theirs:
-- alter_topic(topic, notify => false) turns it off once no client LISTENs)
ALTER TABLE idempotency.outbox_topic ALTER COLUMN notify SET DEFAULT false;
COMMENT ON COLUMN idempotency.outbox_topic.notify IS 'publish() also NOTIFYs "idempotency.outbox.<topic>" at commit, for clients that LISTEN (PostgreSQL serialises the commits of notifying transactions; relays use wait_for(), which needs no NOTIFY)';
CREATE OR REPLACE FUNCTION idempotency.create_topic(
    topic        pg_catalog.text,
    max_attempts pg_catalog.int4     DEFAULT 10,
    backoff_base pg_catalog.interval DEFAULT '1 second',
    backoff_max  pg_catalog.interval DEFAULT '1 hour',
    retention    pg_catalog.interval DEFAULT '1 hour',
    notify       pg_catalog.bool     DEFAULT false)
RETURNS pg_catalog.int4
AS 'MODULE_PATHNAME', 'idempotency_create_topic'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- == no direct writes on Citus ==
-- The routes of a call to the node of its shard (src/keystore.c; see the
-- install script), and 0.5.0's distribute() grants gone: INSERT, UPDATE,
-- DELETE on the key, token and seen-message tables to PUBLIC under
-- own-row write policies, which let a role rewrite its own keys with plain
-- SQL (fencing bypassed) and a BYPASSRLS role every role's.  From one DO
-- block, as the key table's DDL above (each statement goes to the shards
-- and workers with its own text).  distribute(), which a Citus cluster
-- runs after this update, distributes the route tables.
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
DO $$
DECLARE
    t pg_catalog.text;
BEGIN
    FOREACH t IN ARRAY ARRAY['idempotency_key', 'token', 'seen_message'] LOOP
        IF EXISTS (SELECT FROM pg_catalog.pg_policy AS p
                    WHERE p.polrelid OPERATOR(pg_catalog.=) ('idempotency.' OPERATOR(pg_catalog.||) t)::pg_catalog.regclass
                      AND p.polname OPERATOR(pg_catalog.=) (t OPERATOR(pg_catalog.||) '_own_rows_write')) THEN
            EXECUTE pg_catalog.format('DROP POLICY %I ON idempotency.%I', t OPERATOR(pg_catalog.||) '_own_rows_write', t);
        END IF;
        EXECUTE pg_catalog.format('REVOKE INSERT, UPDATE, DELETE ON idempotency.%I FROM PUBLIC', t);
    END LOOP;
END
$$;

-- The secret tables: row security and no policy, so a role that may SELECT
-- them without owning them (pg_read_all_data, a grant by name) sees no row;
-- their owner, superusers and BYPASSRLS roles read them.  From a DO block:
-- derive_secret is a reference table on Citus, and Citus carries an ALTER
-- TABLE of a distributed table to the workers with its statement's text,
-- which in an extension script is the whole script.
DO $$
BEGIN
    ALTER TABLE idempotency.lock_secret ENABLE ROW LEVEL SECURITY;
    ALTER TABLE idempotency.derive_secret ENABLE ROW LEVEL SECURITY;
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
