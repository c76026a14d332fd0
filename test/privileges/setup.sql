-- test/privileges/setup.sql: the extension, the harness and the rows the
-- matrix probes.  Run by the cluster's superuser in database privileges
-- (made by run), after roles.sql.  psql -v from=VERSION: install VERSION,
-- then update to the default version; -v renamed=1: see the end;
-- -v portable=1: the portable edition, which run installed (PRIV_PORTABLE).
--
-- The extension is created by priv_owner, which then loses SUPERUSER: its
-- column of expect.tsv shows what owning the objects gives, and priv_super's
-- what superuser gives.  Every row below is made by its role through the
-- extension's functions (SET ROLE), as an application would.
\set ON_ERROR_STOP 1
SET search_path = pg_catalog;
SET client_min_messages = warning;

\if :{?portable}
-- the portable edition (run -v portable=1): installed by run with psql -f
-- as priv_owner, which owns the database and is no superuser; its members
-- are the objects of schema idempotency (matrix.members())
\else
SET ROLE priv_owner;
\if :{?from}
-- the updated database: an older release, then ALTER EXTENSION UPDATE
CREATE EXTENSION idempotency VERSION :'from';
ALTER EXTENSION idempotency UPDATE;
\else
CREATE EXTENSION idempotency;
\endif
RESET ROLE;
\endif
-- what this install has (the portable edition has not every function yet;
-- the rows below are made only through what it has)
SELECT to_regprocedure('idempotency.stats_reset()') IS NOT NULL AS has_stats,
       to_regprocedure('idempotency.create_machine(text,jsonb)') IS NOT NULL AS has_machine,
       to_regprocedure('idempotency.create_topic(text,integer,interval,interval,interval,boolean)') IS NOT NULL AS has_outbox
\gset
\if :{?citus}
-- on a Citus coordinator (test/citus/run): the set-up step, as the README
-- says, by a superuser
SELECT idempotency.distribute();
\endif
-- idempotency.stats is the cluster's: start from no entries, so that none
-- the probes count is evicted at idempotency.stats_max by entries of
-- earlier runs (a database and its roles gone, their entries stay)
\if :has_stats
SELECT idempotency.stats_reset();
\endif
ALTER ROLE priv_owner NOSUPERUSER;
-- a probe that waits fails instead of stopping the run
ALTER DATABASE privileges SET statement_timeout = '20s';

-- ---------------------------------------------------------------------
-- The harness: schema matrix (the cluster superuser's).
-- ---------------------------------------------------------------------
CREATE SCHEMA matrix;
GRANT USAGE ON SCHEMA matrix TO PUBLIC;

-- values the probes need (a token, a claim), readable by every caller
CREATE TABLE matrix.fixture (name text PRIMARY KEY, value text NOT NULL);
GRANT SELECT ON matrix.fixture TO PUBLIC;

-- the role a caller logs in as, where it is not priv_<caller>
CREATE TABLE matrix.login (caller text PRIMARY KEY, role name NOT NULL);

-- what the callers got: one row per (caller, object, action)
CREATE TABLE matrix.result (
    caller  text NOT NULL,
    object  text NOT NULL,
    action  text NOT NULL,
    outcome text NOT NULL,
    PRIMARY KEY (caller, object, action)
);
GRANT INSERT ON matrix.result TO PUBLIC;

-- try(probe): run one probe as the current role and undo it; returns its
-- outcome: the first column of a query's first row as text ('null' if
-- NULL), 'ok' for CREATE, TRUNCATE and LOCK, the row count of any other
-- statement, or the SQLSTATE of its error.
CREATE FUNCTION matrix.try(probe text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v text;
    n bigint;
BEGIN
    BEGIN
        IF probe ~* '^\s*(select|with|values)\M' THEN
            EXECUTE probe INTO v;
            v := coalesce(v, 'null');
        ELSIF probe ~* '^\s*(create|truncate|lock)\M' THEN
            EXECUTE probe;
            v := 'ok';
        ELSE
            EXECUTE probe;
            GET DIAGNOSTICS n = ROW_COUNT;
            v := n::text;
        END IF;
        -- undo the probe's writes: the block's subtransaction rolls back
        RAISE EXCEPTION USING ERRCODE = 'MXUND', MESSAGE = v;
    EXCEPTION
        WHEN SQLSTATE 'MXUND' THEN
            RETURN SQLERRM;
        WHEN OTHERS THEN
            RETURN SQLSTATE;
    END;
END
$$;
GRANT EXECUTE ON FUNCTION matrix.try(text) TO PUBLIC;

-- the extension's members, named as expect.tsv names them
-- (pg_describe_object under search_path pg_catalog: "table
-- idempotency.token", "function idempotency.ack(uuid,bigint[])")
CREATE FUNCTION matrix.members()
RETURNS TABLE (object text, kind text, classid oid, objid oid)
LANGUAGE sql STABLE SET search_path = pg_catalog AS $$
    SELECT pg_describe_object(d.classid, d.objid, 0), (pg_identify_object(d.classid, d.objid, 0)).type,
           d.classid, d.objid
      FROM pg_depend AS d
      JOIN pg_extension AS e ON e.oid = d.refobjid
     WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
       AND e.extname = 'idempotency'
       -- a table's or view's row type and any array type come with their
       -- object (PostgreSQL 17 and later record them as members too): they
       -- have no privileges of their own to decide
       AND NOT EXISTS (SELECT FROM pg_type AS t
                        WHERE d.classid = 'pg_type'::regclass AND t.oid = d.objid
                          AND (t.typcategory = 'A'
                               OR (t.typrelid <> 0
                                   AND (SELECT c.relkind FROM pg_class AS c
                                         WHERE c.oid = t.typrelid) <> 'c')))
    UNION ALL
    -- a plain install (the portable edition by psql -f) has no extension:
    -- its members are the objects of schema idempotency, the same kinds
    SELECT pg_describe_object(o.classid, o.objid, 0), (pg_identify_object(o.classid, o.objid, 0)).type,
           o.classid, o.objid
      FROM (SELECT 'pg_class'::regclass AS classid, c.oid AS objid
              FROM pg_class AS c
             WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
            UNION ALL
            SELECT 'pg_proc'::regclass, p.oid FROM pg_proc AS p
             WHERE p.pronamespace = 'idempotency'::regnamespace
            UNION ALL
            SELECT 'pg_type'::regclass, t.oid FROM pg_type AS t
             WHERE t.typnamespace = 'idempotency'::regnamespace AND t.typcategory <> 'A'
               AND (t.typrelid = 0 OR (SELECT c.relkind FROM pg_class AS c WHERE c.oid = t.typrelid) = 'c')
            UNION ALL
            SELECT 'pg_operator'::regclass, op.oid FROM pg_operator AS op
             WHERE op.oprnamespace = 'idempotency'::regnamespace) AS o
     WHERE NOT EXISTS (SELECT FROM pg_extension AS e WHERE e.extname = 'idempotency')
$$;

-- try_revoked(object, probe): REVOKE ALL ON object FROM PUBLIC (and from
-- priv_revoked), run the probe as priv_revoked, undo both
CREATE FUNCTION matrix.try_revoked(object text, probe text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    m record;
    v text;
BEGIN
    SELECT * INTO STRICT m FROM matrix.members() AS x WHERE x.object = try_revoked.object;
    BEGIN
        -- (regprocedure, regclass and regtype print quoted names)
        EXECUTE CASE m.kind
                WHEN 'function' THEN format('REVOKE ALL ON FUNCTION %s FROM PUBLIC, priv_revoked', m.objid::regprocedure)
                WHEN 'sequence' THEN format('REVOKE ALL ON SEQUENCE %s FROM PUBLIC, priv_revoked', m.objid::regclass)
                WHEN 'type' THEN format('REVOKE ALL ON TYPE %s FROM PUBLIC, priv_revoked', m.objid::regtype)
                WHEN 'composite type' THEN format('REVOKE ALL ON TYPE %s FROM PUBLIC, priv_revoked', m.objid::regtype)
                ELSE format('REVOKE ALL ON TABLE %s FROM PUBLIC, priv_revoked', m.objid::regclass) END;
        PERFORM set_config('role', 'priv_revoked', true);
        v := matrix.try(probe);
        RAISE EXCEPTION USING ERRCODE = 'MXUND', MESSAGE = v;
    EXCEPTION
        WHEN SQLSTATE 'MXUND' THEN
            RETURN SQLERRM;
    END;
END
$$;

-- ---------------------------------------------------------------------
-- priv_granted: granted by name what PUBLIC is not (reads and EXECUTE;
-- never a write: the matrix checks that no role but the owner has one)
-- ---------------------------------------------------------------------
GRANT SELECT ON ALL TABLES IN SCHEMA idempotency TO priv_granted;
GRANT SELECT ON ALL SEQUENCES IN SCHEMA idempotency TO priv_granted;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA idempotency TO priv_granted;

-- ---------------------------------------------------------------------
-- priv_app's business tables, for the write helpers and once(); row
-- security lets any role with the privileges read a row, and only
-- priv_app (their owner) change one
-- ---------------------------------------------------------------------
CREATE SCHEMA app AUTHORIZATION priv_app;
SET ROLE priv_app;
GRANT USAGE ON SCHEMA app TO PUBLIC;
CREATE TABLE app.orders (id int PRIMARY KEY, status text NOT NULL);
INSERT INTO app.orders VALUES (1, 'a');
CREATE TABLE app.docs (id int PRIMARY KEY, version bigint NOT NULL, body text);
INSERT INTO app.docs VALUES (1, 1, 'x');
ALTER TABLE app.orders ENABLE ROW LEVEL SECURITY;
ALTER TABLE app.docs ENABLE ROW LEVEL SECURITY;
CREATE POLICY orders_read ON app.orders FOR SELECT USING (true);
CREATE POLICY docs_read ON app.docs FOR SELECT USING (true);
GRANT SELECT, INSERT, UPDATE ON app.orders, app.docs TO priv_granted;
\if :{?citus}
-- on Citus every node reads them (once() runs on the node of its key)
RESET ROLE;
SELECT create_reference_table('app.orders'), create_reference_table('app.docs');
SELECT truncate_local_data_after_distributing_table('app.orders'),
       truncate_local_data_after_distributing_table('app.docs');
SET ROLE priv_app;
\endif
\if :has_machine
SELECT idempotency.create_machine('app_machine', '{"a": ["b"], "b": []}');
-- a machine a caller could hope to move its key rows along
SELECT idempotency.create_machine('key_states', '{"in_progress": ["completed"]}');
\endif

-- keys: completed, held under a lease (attempt 1), expired, once()'s
BEGIN;
SELECT outcome FROM idempotency.begin('app-done', '{}', 'priv');
SELECT idempotency.complete('app-done', '{"answer": "app"}', 'priv');
COMMIT;
SELECT outcome FROM idempotency.begin('app-lease', '{}', 'priv', lease => '1 hour');
SELECT idempotency.derive_key('app-lease', 'charge', 'priv') AS app_derived \gset
BEGIN;
SELECT outcome FROM idempotency.begin('app-old', '{}', 'tally', ttl => '1 millisecond');
SELECT idempotency.complete('app-old', '{}', 'tally');
COMMIT;
SELECT outcome FROM idempotency.once('app-once', '{}', 'SELECT count(*) FROM app.orders', VARIADIC '{}'::text[]);

-- tokens, seen messages
SELECT idempotency.issue_token('priv', '1 day') AS app_token \gset
SELECT idempotency.issue_token('priv', '1 day') FROM generate_series(1, 2);
SELECT idempotency.first_seen('priv', 'm' || i, '1 day') FROM generate_series(1, 3) AS i;

\if :has_outbox
-- a topic with one dead message, one in flight (its claim in matrix.fixture)
-- and two ready, one of them published by priv_publisher
SELECT idempotency.create_topic('app_topic', max_attempts => 1);
SELECT idempotency.grant_topic('app_topic', 'priv_publisher', publish => true, consume => false);
SELECT idempotency.grant_topic('app_topic', 'priv_consumer', publish => false, consume => true);
SELECT idempotency.grant_topic('app_topic', 'priv_unconsumer');
SELECT idempotency.revoke_topic('app_topic', 'priv_unconsumer');
SELECT idempotency.publish('app_topic', '{"n": 1}') FROM generate_series(1, 3);
SET ROLE priv_publisher;
SELECT idempotency.publish('app_topic', '{"n": 4}');
SET ROLE priv_app;
SELECT idempotency.nack(c.claim, ARRAY[c.id]) FROM idempotency.claim('app_topic', 1) AS c;
SELECT c.claim AS app_claim, c.id AS app_claimed_id FROM idempotency.claim('app_topic', 1, '1 hour') AS c \gset
RESET ROLE;
-- a topic whose owner role was dropped, granted to priv_publisher and
-- priv_consumer, with one message: it belongs to no role (lines "gone":
-- nobody may use it, create_topic() takes its name over; the table lines:
-- only the callers that bypass row security see its rows)
CREATE ROLE priv_gone;
SET ROLE priv_gone;
SELECT idempotency.create_topic('gone_topic');
SELECT idempotency.grant_topic('gone_topic', 'priv_publisher', publish => true, consume => false);
SELECT idempotency.grant_topic('gone_topic', 'priv_consumer', publish => false, consume => true);
SELECT idempotency.publish('gone_topic', '{"n": 1}');
RESET ROLE;
DROP ROLE priv_gone;
INSERT INTO matrix.fixture VALUES ('app_claim', :'app_claim'), ('app_claimed_id', :'app_claimed_id'),
    ('app_topic_id', (SELECT id::text FROM idempotency.outbox_topic WHERE name = 'app_topic'));
\if :{?portable}
-- a row in the portable edition's outbox_key_lock (publish() commits none:
-- its key locks are rows it deletes at once), for the lines of that
-- table: who may read or lock a row
INSERT INTO idempotency.outbox_key_lock (topic_id, message_key)
SELECT id, 'app-key' FROM idempotency.outbox_topic WHERE name = 'app_topic';
\endif
\endif
RESET ROLE;
INSERT INTO matrix.fixture VALUES ('app_token', :'app_token'), ('app_derived', :'app_derived');

-- ---------------------------------------------------------------------
-- priv_other: fewer of each, so a count tells whose rows a caller sees
-- ---------------------------------------------------------------------
SET ROLE priv_other;
\if :has_machine
SELECT idempotency.create_machine('other_machine', '{"a": ["b"]}');
\endif
BEGIN;
SELECT outcome FROM idempotency.begin('other-done', '{}', 'priv');
SELECT idempotency.complete('other-done', '{"answer": "other"}', 'priv');
COMMIT;
BEGIN;
SELECT outcome FROM idempotency.begin('other-old', '{}', 'tally', ttl => '1 millisecond');
SELECT idempotency.complete('other-old', '{}', 'tally');
COMMIT;
SELECT idempotency.issue_token('priv', '1 day') FROM generate_series(1, 2);
SELECT idempotency.first_seen('priv', 'o' || i, '1 day') FROM generate_series(1, 2) AS i;
\if :has_outbox
SELECT idempotency.create_topic('other_topic', max_attempts => 1);
SELECT idempotency.publish('other_topic', '{"n": 1}') FROM generate_series(1, 2);
SELECT idempotency.nack(c.claim, ARRAY[c.id]) FROM idempotency.claim('other_topic', 1) AS c;
\endif
RESET ROLE;
\if :{?portable}
-- the portable edition's acked counts (ack() deletes a delivered message
-- and writes a count into outbox_acked): one row per topic, app's, other's
-- and the dropped owner's, for the lines of that table and _outbox_counts()
INSERT INTO idempotency.outbox_acked (topic_id, delivered, retried)
SELECT id, 1, 0 FROM idempotency.outbox_topic WHERE name IN ('app_topic', 'other_topic', 'gone_topic');
\endif

-- the keys made with a 1 ms lifetime have expired
SELECT pg_sleep(0.01);

-- psql -v renamed=1: priv_app is renamed after making its rows, and a new
-- role takes its old name (the caller newcomer); neither may change any
-- outcome (SPEC section 12: a rename moves nothing, a name passes nothing on)
\if :{?renamed}
ALTER ROLE priv_app RENAME TO priv_app_renamed;
CREATE ROLE priv_app LOGIN;
INSERT INTO matrix.login VALUES ('app', 'priv_app_renamed'), ('newcomer', 'priv_app');
\endif
