-- wakeup: wait_for() (src/wakeup.c), the relays' wake-up through shared
-- memory: what wakes it (a commit that published, released or redrove; not
-- a rollback, a rolled-back savepoint or a prepared transaction), its
-- cursor, its timeout and cancel, who may wait on which topic, hostile
-- input with its SQLSTATE.  NOTIFY is off by default.  (The waits of one
-- session on another's commit: test/specs/wakeup.spec.)
\i sql/include/roles.sql
\set VERBOSITY default
CREATE ROLE regress_wake_carol NOLOGIN;
-- the change of each topic's count since the cursor in wake_cursor
CREATE TABLE wake_cursor (c int8[]);
GRANT ALL ON wake_cursor TO PUBLIC;
CREATE FUNCTION wake_base(topics text[]) RETURNS void LANGUAGE sql AS $$
  DELETE FROM wake_cursor;
  INSERT INTO wake_cursor SELECT cursor FROM idempotency.wait_for(topics, '0');
$$;
CREATE FUNCTION wake_now(topics text[]) RETURNS text LANGUAGE sql AS $$
  SELECT w.woken::text || ' ' || (SELECT array_agg(w.cursor[i] - c.c[i] ORDER BY i)
                                   FROM generate_subscripts(w.cursor, 1) AS i)::text
    FROM wake_cursor AS c, idempotency.wait_for(topics, '0', c.c) AS w;
$$;

SET ROLE regress_alice;
SELECT idempotency.create_topic('wake_a') > 0 AS a, idempotency.create_topic('wake_b') > 0 AS b,
       idempotency.create_topic('wake_n', notify => true) > 0 AS n;
-- NOTIFY is off unless asked for
SELECT name, notify FROM idempotency.outbox_topic WHERE name LIKE 'wake_%' ORDER BY name;

-- ---- what wakes a relay ---------------------------------------------------
-- timeout 0: the cursor now, nobody woken
SELECT woken, cardinality(cursor) AS n FROM idempotency.wait_for('{wake_a,wake_b}', '0');
SELECT wake_base('{wake_a,wake_b}');
SELECT wake_now('{wake_a,wake_b}') AS nothing_yet;
-- a commit that published: once per transaction and topic
BEGIN;
SELECT idempotency.publish('wake_a', '{"n": 1}') IS NOT NULL AS p;
SELECT idempotency.publish('wake_a', '{"n": 2}') IS NOT NULL AS p;
-- not before the commit
SELECT wake_now('{wake_a,wake_b}') AS before_commit;
COMMIT;
SELECT wake_now('{wake_a,wake_b}') AS after_commit;
-- the cursor returned is the one to pass next: nothing since
SELECT wake_base('{wake_a,wake_b}');
SELECT woken FROM wake_cursor AS c, idempotency.wait_for('{wake_a,wake_b}', '0', c.c);
-- a rollback wakes nobody
BEGIN;
SELECT idempotency.publish('wake_a', '{"n": 3}') IS NOT NULL AS p;
ROLLBACK;
SELECT wake_now('{wake_a,wake_b}') AS after_rollback;
-- a rolled-back savepoint takes its topic with it; a released one keeps it
BEGIN;
SELECT idempotency.publish('wake_a', '{"n": 4}') IS NOT NULL AS p;
SAVEPOINT s;
SELECT idempotency.publish('wake_b', '{"n": 5}') IS NOT NULL AS p;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT wake_now('{wake_a,wake_b}') AS a_only;
SELECT wake_base('{wake_a,wake_b}');
BEGIN;
SAVEPOINT s;
SELECT idempotency.publish('wake_b', '{"n": 6}') IS NOT NULL AS p;
RELEASE SAVEPOINT s;
COMMIT;
SELECT wake_now('{wake_a,wake_b}') AS b_kept;
-- a PL/pgSQL exception block is a savepoint too
SELECT wake_base('{wake_a,wake_b}');
DO $$
BEGIN
  PERFORM idempotency.publish('wake_a', '{"n": 7}');
  RAISE EXCEPTION 'undo';
EXCEPTION WHEN raise_exception THEN NULL;
END $$;
SELECT wake_now('{wake_a,wake_b}') AS none_after_exception_block;
-- a prepared transaction wakes nobody, at PREPARE or at COMMIT PREPARED:
-- relays find its message at their timeout
BEGIN;
SELECT idempotency.publish('wake_b', '{"n": 8}') IS NOT NULL AS p;
PREPARE TRANSACTION 'regress_wake';
SELECT wake_now('{wake_a,wake_b}') AS none_at_prepare;
RESET ROLE;
COMMIT PREPARED 'regress_wake';
SET ROLE regress_alice;
SELECT wake_now('{wake_a,wake_b}') AS none_at_commit_prepared;
-- release() and redrive() hand messages back: they wake relays
SELECT wake_base('{wake_a,wake_b}');
SELECT count(*) AS claimed FROM (SELECT idempotency.release(c.claim, ARRAY[c.id])
                                  FROM idempotency.claim('wake_a', 1) AS c) AS r;
SELECT wake_now('{wake_a,wake_b}') AS woken_by_release;
SELECT idempotency.alter_topic('wake_b', max_attempts => 1);
SELECT wake_base('{wake_a,wake_b}');
SELECT count(*) AS nacked FROM (SELECT idempotency.nack(c.claim, ARRAY[c.id])
                                 FROM idempotency.claim('wake_b', 10) AS c) AS r;
SELECT wake_now('{wake_a,wake_b}') AS nack_wakes_nobody;
SELECT idempotency.redrive('wake_b') AS redriven;
SELECT wake_now('{wake_a,wake_b}') AS woken_by_redrive;
-- a topic with notify => true still NOTIFYs, and wakes wait_for() too
SELECT wake_base('{wake_n}');
SELECT idempotency.publish('wake_n', '{}') IS NOT NULL AS p;
SELECT wake_now('{wake_n}') AS woken_with_notify;

-- a topic dropped and created again under its name (a new id) while a relay
-- holds a cursor of the old one: a commit after the relay's last claim
-- still wakes it at once (the counts of two ids never compare equal)
SELECT idempotency.create_topic('wake_r') > 0 AS r;
SELECT wake_base('{wake_r}');
SELECT idempotency.drop_topic('wake_r', force => true);
SELECT idempotency.create_topic('wake_r') > 0 AS r_again;
SELECT idempotency.publish('wake_r', '{}') IS NOT NULL AS p;
SELECT woken FROM wake_cursor AS c, idempotency.wait_for('{wake_r}', '0', c.c);
SELECT idempotency.drop_topic('wake_r', force => true);

-- ---- the timeout, and a cancel -----------------------------------------------
SELECT wake_base('{wake_a}');
SELECT clock_timestamp() AS t0 \gset
SELECT woken FROM wake_cursor AS c, idempotency.wait_for('{wake_a}', '200 ms', c.c);
SELECT clock_timestamp() - :'t0'::timestamptz >= '200 ms' AS waited_the_timeout;
-- without since: the count when the call began
SELECT woken FROM idempotency.wait_for('{wake_a}', '10 ms');
-- a count that changed since returns at once, whatever the timeout
SELECT clock_timestamp() AS t0 \gset
SELECT woken FROM idempotency.wait_for('{wake_a,wake_b}', '1 hour', '{-1,-1}');
SELECT clock_timestamp() - :'t0'::timestamptz < '10 s' AS at_once;
-- statement_timeout (a cancel) ends the wait: 57014
SET statement_timeout = '150ms';
SELECT woken FROM idempotency.wait_for('{wake_a}', '1 hour');
\echo :LAST_ERROR_SQLSTATE
RESET statement_timeout;
-- the session waits again after a cancel
SELECT woken FROM idempotency.wait_for('{wake_a}', '0');

-- ---- hostile input: its SQLSTATE ------------------------------------------------
SELECT * FROM idempotency.wait_for(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.wait_for('{wake_a}', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.wait_for('{}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.wait_for(ARRAY['wake_a', NULL]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.wait_for(array_fill('wake_a'::text, ARRAY[101]));
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.wait_for('{{wake_a},{wake_b}}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.wait_for('{wake_a}', '-1 s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.wait_for('{wake_a}', '0', '{1,2}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.wait_for('{wake_a}', '0', ARRAY[NULL]::int8[]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.wait_for('{no_such_topic}', '0');
\echo :LAST_ERROR_SQLSTATE
-- duplicates are allowed, each answered
SELECT woken, cardinality(cursor) FROM idempotency.wait_for('{wake_a,wake_a}', '0', '{-1,-1}');
RESET ROLE;

-- ---- who may wait on a topic: its owner and the roles granted consume ----------
SET ROLE regress_bob;
SELECT * FROM idempotency.wait_for('{wake_a}', '0');
\echo :LAST_ERROR_SQLSTATE
-- one topic it may not consume refuses the whole call, before any wait
SELECT idempotency.create_topic('wake_bob') > 0 AS bobs;
SELECT * FROM idempotency.wait_for('{wake_bob,wake_a}', '1 hour');
\echo :LAST_ERROR_SQLSTATE
SET ROLE regress_alice;
SELECT idempotency.grant_topic('wake_a', 'regress_bob', publish => true, consume => false);
SELECT idempotency.grant_topic('wake_b', 'regress_wake_carol', publish => false, consume => true);
SET ROLE regress_bob;
-- publish alone is not enough
SELECT * FROM idempotency.wait_for('{wake_a}', '0');
\echo :LAST_ERROR_SQLSTATE
SET ROLE regress_wake_carol;
SELECT woken FROM idempotency.wait_for('{wake_b}', '1 hour', '{-1}');
SET ROLE regress_alice;
SELECT idempotency.revoke_topic('wake_b', 'regress_wake_carol');
SET ROLE regress_wake_carol;
SELECT * FROM idempotency.wait_for('{wake_b}', '0');
\echo :LAST_ERROR_SQLSTATE
-- a publisher granted publish wakes the owner's relay
SET ROLE regress_alice;
SELECT wake_base('{wake_a}');
SET ROLE regress_bob;
SELECT idempotency.publish('wake_a', '{"from": "bob"}') IS NOT NULL AS p;
SET ROLE regress_alice;
SELECT wake_now('{wake_a}') AS woken_by_bob;
RESET ROLE;

-- clean up
SET ROLE regress_bob;
SELECT idempotency.drop_topic('wake_bob', force => true);
SET ROLE regress_alice;
SELECT idempotency.drop_topic(t, force => true) FROM unnest('{wake_a,wake_b,wake_n}'::text[]) AS t;
RESET ROLE;
DROP FUNCTION wake_base(text[]);
DROP FUNCTION wake_now(text[]);
DROP TABLE wake_cursor;
DROP ROLE regress_wake_carol;

-- template clones: two databases cloned from one template hold a topic of
-- the same id; a commit that publishes to it in one wakes no relay of the
-- other (the entries are per database and topic, not per topic id; the
-- message ids differ too: sql/identity.sql)
SELECT current_database() AS regress_db \gset
CREATE DATABASE regress_wake_tpl;
\c regress_wake_tpl
CREATE EXTENSION idempotency;
SELECT idempotency.create_topic('cloned') > 0 AS cloned;
\c :regress_db
CREATE DATABASE regress_wake_a TEMPLATE regress_wake_tpl;
CREATE DATABASE regress_wake_b TEMPLATE regress_wake_tpl;
\c regress_wake_b
SELECT cursor AS b_cursor FROM idempotency.wait_for('{cloned}', '0') \gset
\c regress_wake_a
SELECT (SELECT id FROM idempotency.outbox_topic WHERE name = 'cloned') AS a_id \gset
SELECT idempotency.publish('cloned', '{"in": "a"}') IS NOT NULL AS published_in_a;
\c regress_wake_b
SELECT (SELECT id FROM idempotency.outbox_topic WHERE name = 'cloned') = :a_id AS same_topic_id;
SELECT woken AS b_after_a FROM idempotency.wait_for('{cloned}', '0', :'b_cursor');
SELECT idempotency.publish('cloned', '{"in": "b"}') IS NOT NULL AS published_in_b;
SELECT woken AS b_after_b FROM idempotency.wait_for('{cloned}', '0', :'b_cursor');
\c :regress_db
DROP DATABASE regress_wake_a;
DROP DATABASE regress_wake_b;
DROP DATABASE regress_wake_tpl;
