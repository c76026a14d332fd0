-- portable_outbox: what only the portable edition's outbox has — the
-- per-key locks (entries of outbox_key_lock's primary key whose rows never
-- commit, no advisory lock, unwritable by every other role), the NOTIFY
-- queue whose rows never commit (not at COMMIT, not at PREPARE
-- TRANSACTION), the foreign key that makes a topic's drop see every
-- message, wait_for()'s snapshot cursor, the acked counts (ack() deletes
-- the message and writes a row of outbox_acked); each error path with its SQLSTATE
-- and that nothing was written.
\set VERBOSITY default
CREATE FUNCTION po_key_rows() RETURNS bigint LANGUAGE sql SECURITY DEFINER
  AS 'SELECT count(*) FROM idempotency.outbox_key_lock';

SET ROLE regress_alice;
SELECT idempotency.create_topic('po') > 0 AS created;
SELECT idempotency.create_topic('po_n', notify => true) > 0 AS created;

-- ---- a keyed publish holds its key without a committed row, no advisory lock
BEGIN;
SELECT idempotency.publish('po', '{"n": 1}', 'k1') IS NOT NULL AS published;
-- the same key again in the same transaction: its own entry is no conflict
SELECT idempotency.publish('po', '{"n": 2}', 'k1') IS NOT NULL AS published;
SELECT count(*) AS advisory_locks FROM pg_locks
 WHERE locktype = 'advisory' AND pid = pg_backend_pid();
COMMIT;
-- a key published in a rolled-back savepoint is free again in the transaction
BEGIN;
SAVEPOINT s;
SELECT idempotency.publish('po', '{"n": 3}', 'k2') IS NOT NULL AS published;
ROLLBACK TO SAVEPOINT s;
SELECT idempotency.publish('po', '{"n": 4}', 'k2') IS NOT NULL AS published;
COMMIT;
RESET ROLE;
SELECT po_key_rows() AS key_rows;
SELECT payload->>'n' AS n, message_key FROM idempotency.outbox_message ORDER BY id;
-- no other role reads, locks or writes the table
SET ROLE regress_bob;
SELECT count(*) FROM idempotency.outbox_key_lock;
\echo :LAST_ERROR_SQLSTATE
SELECT 1 FROM idempotency.outbox_key_lock FOR UPDATE;
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idempotency.outbox_key_lock VALUES (1, 'k1');
\echo :LAST_ERROR_SQLSTATE
DELETE FROM idempotency.outbox_key_lock;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT po_key_rows() AS key_rows_after_bob;
SET ROLE regress_alice;
SELECT count(idempotency.ack(claim, ARRAY[id])) AS acked FROM idempotency.claim('po', 10);
SELECT count(idempotency.ack(claim, ARRAY[id])) AS acked FROM idempotency.claim('po', 10);
SELECT idempotency.purge() >= 0 AS purged;
RESET ROLE;

-- ---- a notifying topic: PREPARE TRANSACTION works; the queue rows never commit
SET ROLE regress_alice;
BEGIN;
SELECT idempotency.publish('po_n', '{"n": 1}') IS NOT NULL AS published;
SELECT idempotency.publish('po_n', '{"n": 2}') IS NOT NULL AS published;
COMMIT;
BEGIN;
SELECT idempotency.publish('po_n', '{"n": 3}') IS NOT NULL AS published;
PREPARE TRANSACTION 'po_notify';
RESET ROLE;
COMMIT PREPARED 'po_notify';
SELECT count(*) AS queue_rows FROM idempotency.outbox_notify;
SET ROLE regress_alice;
SELECT count(*) AS messages FROM idempotency.outbox_message
 WHERE topic_id = (SELECT id FROM idempotency.outbox_topic WHERE name = 'po_n');
-- no other role writes the queue
SET ROLE regress_bob;
INSERT INTO idempotency.outbox_notify VALUES ('po_n');
\echo :LAST_ERROR_SQLSTATE
SET ROLE regress_alice;

-- ---- a message belongs to an existing topic --------------------------------
RESET ROLE;
SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
 WHERE conrelid = 'idempotency.outbox_message'::regclass AND contype = 'f';
SET ROLE regress_alice;

-- ---- wait_for(): the snapshot cursor ---------------------------------------
SELECT cursor AS c0 FROM idempotency.wait_for('{po}', '0') \gset
-- this transaction's own uncommitted message wakes nobody
BEGIN;
SELECT idempotency.publish('po', '{"n": "own"}') IS NOT NULL AS published;
SELECT woken FROM idempotency.wait_for('{po}', '0', :'c0');
COMMIT;
-- once committed, it wakes; the cursor returned is past it
SELECT woken, cursor AS c1 FROM idempotency.wait_for('{po}', '0', :'c0') \gset
SELECT :'woken' AS woken;
SELECT woken FROM idempotency.wait_for('{po}', '0', :'c1');
-- a claimed message wakes nobody; a released one does
SELECT claim AS rc, id AS rid FROM idempotency.claim('po', 1) \gset
SELECT cursor AS c2 FROM idempotency.wait_for('{po}', '0') \gset
SELECT woken FROM idempotency.wait_for('{po}', '0', :'c2');
SELECT idempotency.release(:'rc', ARRAY[:rid]::bigint[]) AS released;
SELECT woken FROM idempotency.wait_for('{po}', '0', :'c2');
-- a rollback, a rolled-back savepoint and an exception block wake nobody
SELECT cursor AS c4 FROM idempotency.wait_for('{po}', '0') \gset
BEGIN;
SELECT idempotency.publish('po', '{"n": "rolled back"}') IS NOT NULL AS published;
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT idempotency.publish('po', '{"n": "savepoint"}') IS NOT NULL AS published;
ROLLBACK TO SAVEPOINT s;
COMMIT;
DO $$ BEGIN
  PERFORM idempotency.publish('po', '{"n": "exception block"}');
  RAISE EXCEPTION 'undo';
EXCEPTION WHEN raise_exception THEN NULL;
END $$;
SELECT woken FROM idempotency.wait_for('{po}', '0', :'c4');
-- a redrive wakes, on the topic it was given among others
SELECT idempotency.create_topic('po_dead', max_attempts => 1) > 0 AS created;
SELECT idempotency.publish('po_dead', '{"n": "dead"}') IS NOT NULL AS published;
SELECT idempotency.nack(claim, ARRAY[id]) AS nacked FROM idempotency.claim('po_dead');
SELECT cursor AS c5 FROM idempotency.wait_for('{po,po_dead}', '0') \gset
SELECT woken FROM idempotency.wait_for('{po,po_dead}', '0', :'c5');
SELECT idempotency.redrive('po_dead') AS redriven;
SELECT woken FROM idempotency.wait_for('{po,po_dead}', '0', :'c5');
SELECT idempotency.drop_topic('po_dead', force => true);
-- another role's topic: 42501; no such topic: 42704; bad arguments
SET ROLE regress_bob;
SELECT * FROM idempotency.wait_for('{po}', '0');
\echo :LAST_ERROR_SQLSTATE
SET ROLE regress_alice;
SELECT * FROM idempotency.wait_for('{po_none}', '0');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.wait_for('{}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.wait_for('{po}', '-1 s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.wait_for('{po}', NULL);
\echo :LAST_ERROR_SQLSTATE
-- a wait that times out returns the cursor it was given
SELECT cursor AS c3 FROM idempotency.wait_for('{po}', '0') \gset
SELECT woken, cursor = :'c3' AS same_cursor FROM idempotency.wait_for('{po}', '20 ms', :'c3');
-- not a cursor: 22023; nulls: 22004
SELECT * FROM idempotency.wait_for('{po}', '0', '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.wait_for('{po}', '0', '{0}');
\echo :LAST_ERROR_SQLSTATE
-- a transaction id in the future, one in progress above xmax
SELECT * FROM idempotency.wait_for('{po}', '0', '{4000000000}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.wait_for('{po}', '0', '{5,7}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.wait_for('{po}', '0', '{1,NULL}');
\echo :LAST_ERROR_SQLSTATE

-- ---- ack() deletes what it delivers and counts it in outbox_acked
SELECT idempotency.create_topic('po_ack', retention => '1 day') > 0 AS created;
SELECT id AS po_ack_id FROM idempotency.outbox_topic WHERE name = 'po_ack' \gset
SELECT count(idempotency.publish('po_ack', jsonb_build_object('i', i))) AS published
  FROM generate_series(1, 3) AS i;
-- one claim nacked, so a retry is counted
SELECT idempotency.nack(claim, ARRAY[id], retry_in => '0') AS nacked
  FROM idempotency.claim('po_ack', 1);
SELECT a AS acked FROM (
  SELECT idempotency.ack(c.claim, array_agg(c.id)) FROM idempotency.claim('po_ack', 3) AS c
   GROUP BY c.claim) AS x(a);
SELECT count(idempotency.publish('po_ack', jsonb_build_object('i', i))) AS published
  FROM generate_series(4, 5) AS i;
-- the rows are gone (a topic's retention keeps none), one count row holds them
SELECT state, count(*) FROM idempotency.outbox_message AS m
  JOIN idempotency.outbox_topic AS t ON t.id = m.topic_id
 WHERE t.name = 'po_ack' GROUP BY state;
SELECT delivered, retried FROM idempotency.outbox_acked AS a
  JOIN idempotency.outbox_topic AS t ON t.id = a.topic_id WHERE t.name = 'po_ack';
SELECT published, delivered, retried, undelivered FROM idempotency.outbox_stats
 WHERE topic = 'po_ack';
SELECT delivered, retried FROM idempotency._outbox_counts(:po_ack_id);
-- an ack rolled back (to a savepoint) deletes and counts nothing
BEGIN;
SAVEPOINT s;
SELECT count(*) AS acked FROM (
  SELECT idempotency.ack(c.claim, array_agg(c.id)) FROM idempotency.claim('po_ack', 1) AS c
   GROUP BY c.claim) AS a;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT published, delivered, undelivered FROM idempotency.outbox_stats WHERE topic = 'po_ack';
-- another role sees no count of a topic it is not granted, and writes none
SET ROLE regress_bob;
SELECT count(*) AS rows_seen FROM idempotency.outbox_acked;
SELECT delivered, retried FROM idempotency._outbox_counts(:po_ack_id);
INSERT INTO idempotency.outbox_acked VALUES (1, 1, 0);
\echo :LAST_ERROR_SQLSTATE
DELETE FROM idempotency.outbox_acked;
\echo :LAST_ERROR_SQLSTATE
-- its purge leaves alice's counts where they are
SELECT idempotency.purge() AS purged;
SET ROLE regress_alice;
SELECT count(*) AS count_rows FROM idempotency.outbox_acked;
-- alice's purge adds them to the topic's row; outbox_stats counts the same
SELECT idempotency.purge() AS purged;
SELECT count(*) AS count_rows FROM idempotency.outbox_acked;
SELECT purged_delivered, purged_retries FROM idempotency.outbox_topic WHERE name = 'po_ack';
SELECT published, delivered, retried, undelivered FROM idempotency.outbox_stats
 WHERE topic = 'po_ack';
-- a topic's drop takes its counts with it
SELECT count(*) AS acked FROM (
  SELECT idempotency.ack(c.claim, array_agg(c.id)) FROM idempotency.claim('po_ack', 1) AS c
   GROUP BY c.claim) AS a;
SELECT count(*) AS count_rows FROM idempotency.outbox_acked;
SELECT idempotency.drop_topic('po_ack', force => true);
RESET ROLE;
SELECT count(*) AS count_rows_after_drop FROM idempotency.outbox_acked;
SET ROLE regress_alice;

SELECT idempotency.drop_topic('po', force => true);
SELECT idempotency.drop_topic('po_n', force => true);
RESET ROLE;
SELECT po_key_rows() AS key_rows_after_drop;
DROP FUNCTION po_key_rows();

-- ---- a publication of every table (logical replication: a blue/green
-- switch, a major upgrade by replication) publishes outbox_acked's
-- deletes: the table needs a replica identity, or purge() and
-- drop_topic() fail (55000) where they worked when ack() kept the rows
SET client_min_messages = error;
CREATE PUBLICATION po_every_table FOR ALL TABLES;
RESET client_min_messages;
SET ROLE regress_alice;
SELECT idempotency.create_topic('po_pub', retention => '0') > 0 AS created;
SELECT idempotency.publish('po_pub', '{"n": 1}') IS NOT NULL AS published;
SELECT a AS acked FROM (
  SELECT idempotency.ack(c.claim, array_agg(c.id)) FROM idempotency.claim('po_pub', 1) AS c
   GROUP BY c.claim) AS x(a);
SELECT idempotency.purge() >= 0 AS purged;
\echo :SQLSTATE
SELECT published, delivered FROM idempotency.outbox_stats WHERE topic = 'po_pub';
SELECT idempotency.drop_topic('po_pub');
\echo :SQLSTATE
RESET ROLE;
DROP PUBLICATION po_every_table;
SELECT count(*) AS topics_left FROM idempotency.outbox_topic WHERE name = 'po_pub';
-- (what a failed drop left)
DELETE FROM idempotency.outbox_acked AS a USING idempotency.outbox_topic AS t
 WHERE t.id = a.topic_id AND t.name = 'po_pub';
DELETE FROM idempotency.outbox_topic WHERE name = 'po_pub';

-- ---- drop_topic() under REPEATABLE READ leaves no count of its topic
-- behind: an ack committed after the dropping transaction's snapshot wrote
-- a count that snapshot cannot see, so the drop fails with 40001 (the count
-- row's foreign key finds it) and drops nothing; a retry drops the topic
-- with it (the other session through dblink, so the order is fixed)
CREATE EXTENSION dblink;
SELECT dblink_connect('po_other', pg_catalog.format('host=%s port=%s dbname=%s user=postgres',
       current_setting('unix_socket_directories'), current_setting('port'), current_database()));
SET ROLE regress_alice;
SELECT idempotency.create_topic('po_rr', retention => '0') > 0 AS created;
RESET ROLE;
SELECT dblink_exec('po_other', 'SET ROLE regress_alice');
SELECT dblink_exec('po_other', 'BEGIN ISOLATION LEVEL REPEATABLE READ');
SELECT * FROM dblink('po_other', 'SELECT count(*) FROM idempotency.outbox_topic WHERE name = ''po_rr''') AS t(topics bigint);
SET ROLE regress_alice;
SELECT idempotency.publish('po_rr', '{"n": 1}') IS NOT NULL AS published;
SELECT a AS acked FROM (
  SELECT idempotency.ack(c.claim, array_agg(c.id)) FROM idempotency.claim('po_rr', 1) AS c
   GROUP BY c.claim) AS x(a);
RESET ROLE;
SELECT * FROM dblink('po_other', 'SELECT ''dropped'' FROM idempotency.drop_topic(''po_rr'')') AS t(r text);
SELECT dblink_exec('po_other', 'COMMIT');
SELECT count(*) AS topics_left FROM idempotency.outbox_topic WHERE name = 'po_rr';
SELECT count(*) AS counts_left_behind FROM idempotency.outbox_acked AS a
 WHERE NOT EXISTS (SELECT FROM idempotency.outbox_topic AS t WHERE t.id = a.topic_id);
SELECT * FROM dblink('po_other', 'SELECT ''dropped'' FROM idempotency.drop_topic(''po_rr'')') AS t(r text);
SELECT count(*) AS topics_left FROM idempotency.outbox_topic WHERE name = 'po_rr';
SELECT count(*) AS counts_left FROM idempotency.outbox_acked;
SELECT dblink_disconnect('po_other');
DROP EXTENSION dblink;

-- ---- a dump keeps no count of a topic it leaves out: through pg_tle the
-- extension's dump conditions leave out a dropped owner's topic (as the C
-- edition's dump does), so its counts must go too, or the restored
-- database has count rows of a topic it does not have.  The rows pg_dump
-- writes, by the conditions it reads (a plain install has none: it dumps
-- every row of both tables)
CREATE ROLE regress_po_gone NOLOGIN;
SET ROLE regress_po_gone;
SELECT idempotency.create_topic('po_gone', retention => '0') > 0 AS created;
SELECT idempotency.publish('po_gone', '{"n": 1}') IS NOT NULL AS published;
SELECT a AS acked FROM (
  SELECT idempotency.ack(c.claim, array_agg(c.id)) FROM idempotency.claim('po_gone', 1) AS c
   GROUP BY c.claim) AS x(a);
RESET ROLE;
DROP ROLE regress_po_gone;
DO $$
DECLARE
    v_topic text := '';
    v_acked text := '';
    n bigint;
BEGIN
    SELECT COALESCE(max(c.cond) FILTER (WHERE c.rel = 'idempotency.outbox_topic'::regclass), ''),
           COALESCE(max(c.cond) FILTER (WHERE c.rel = 'idempotency.outbox_acked'::regclass), '')
      INTO v_topic, v_acked
      FROM pg_extension AS e, unnest(e.extconfig, e.extcondition) AS c(rel, cond)
     WHERE e.extname = 'idempotency';
    EXECUTE format('SELECT count(*) FROM (SELECT * FROM ONLY idempotency.outbox_acked %s) AS a
                     WHERE NOT EXISTS (SELECT FROM (SELECT * FROM ONLY idempotency.outbox_topic %s) AS t
                                        WHERE t.id = a.topic_id)', v_acked, v_topic) INTO n;
    RAISE NOTICE 'count rows dumped without their topic: %', n;
END $$;
-- (the dropped owner's topic, as a takeover would drop it)
DELETE FROM idempotency.outbox_acked AS a USING idempotency.outbox_topic AS t
 WHERE t.id = a.topic_id AND t.name = 'po_gone';
DELETE FROM idempotency.outbox_message AS m USING idempotency.outbox_topic AS t
 WHERE t.id = m.topic_id AND t.name = 'po_gone';
DELETE FROM idempotency.outbox_topic WHERE name = 'po_gone';
