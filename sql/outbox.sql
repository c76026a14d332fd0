-- outbox: publish() in the caller's transaction; claim, ack, nack, release,
-- dead letters and redrive; order per message key; topics per role and
-- their grants; hostile input with its SQLSTATE and nothing written.
\i sql/include/roles.sql
\set VERBOSITY default
CREATE ROLE regress_outbox_carol NOLOGIN;
CREATE FUNCTION outbox_rows() RETURNS bigint LANGUAGE sql
  AS 'SELECT count(*) FROM idempotency.outbox_message';

-- ---- topics --------------------------------------------------------------
SET ROLE regress_alice;
SELECT idempotency.create_topic('payments', max_attempts => 3) AS payments_id \gset
SELECT :payments_id > 0 AS created;
SELECT name, owner, max_attempts, backoff_base, backoff_max, retention
  FROM idempotency.outbox_topic;
-- names are checked, and shared by every role
SELECT idempotency.create_topic('payments');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.create_topic('');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.create_topic('no spaces');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.create_topic(repeat('t', 41));
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.create_topic(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.create_topic('t', max_attempts => 0);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.create_topic('t', retention => '-1 s');
\echo :LAST_ERROR_SQLSTATE
SET ROLE regress_bob;
SELECT idempotency.create_topic('payments');
\echo :LAST_ERROR_SQLSTATE
-- bob sees no topic of alice's
SELECT count(*) AS topics_bob_sees FROM idempotency.outbox_topic;
-- plain roles cannot write the tables
INSERT INTO idempotency.outbox_topic (name, owner, max_attempts, backoff_base, backoff_max, retention)
VALUES ('x', 'regress_bob', 1, '1s', '1s', '1s');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

-- ---- publish: hostile input, nothing written ------------------------------
SET ROLE regress_alice;
SELECT idempotency.publish(NULL, '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.publish('payments', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.publish('nosuchtopic', '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.publish('payments', '{}', headers => '[1]');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.publish('payments', '{}', message_key => '');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.publish('payments', '{}', message_key => repeat('k', 256));
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.publish('payments', '{}', deliver_after => '-1 s');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idempotency.outbox_message (id, topic_id, owner, message_id, payload, headers, state,
                                        available_at, published_at, published_by)
VALUES (1, 1, 'regress_alice', gen_random_uuid(), '{}', '{}', 'pending', now(), now(), 'regress_alice');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT outbox_rows() AS rows_after_errors;
SET ROLE regress_bob;
SELECT idempotency.publish('payments', '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim('payments');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.redrive('payments');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT outbox_rows() AS rows_after_bob;

-- ---- publish in the caller's transaction ----------------------------------
SET ROLE regress_alice;
BEGIN;
SELECT idempotency.publish('payments', '{"n": "rolled back"}') IS NOT NULL AS published;
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT idempotency.publish('payments', '{"n": "savepoint"}', 'k') IS NOT NULL AS published;
ROLLBACK TO SAVEPOINT s;
SELECT idempotency.publish('payments', '{"n": 1}', headers => '{"x-a": "1"}') AS m1 \gset
COMMIT;
SELECT message_key, payload, headers, state, attempts, published_by,
       message_id = :'m1' AS same_id
  FROM idempotency.outbox_message;
-- the message comes back with its stable id; claims are exclusive
SELECT message_id = :'m1' AS same_id, topic, payload, headers, attempt,
       claimed_until > now() AS visible_later
  FROM idempotency.claim('payments', 10, '1 minute');
SELECT count(*) AS claimed_again FROM idempotency.claim('payments');
-- ack needs the claim's token
SELECT idempotency.ack(gen_random_uuid(), ARRAY[id]) AS acked_wrong_claim
  FROM idempotency.outbox_message;
-- the claim is in shared memory (the row is unchanged), shown by outbox_in_flight
SELECT state, attempts, claim IS NULL AS no_claim_in_row FROM idempotency.outbox_message;
SELECT attempt, claimed_until > now() AS visible_later FROM idempotency.outbox_in_flight;
SELECT idempotency.ack(claim, ARRAY[id]) AS acked FROM idempotency.outbox_in_flight;
-- ack deletes the message; outbox_stats counts it delivered
SELECT count(*) AS rows_left FROM idempotency.outbox_message;
SELECT count(*) AS in_flight_left FROM idempotency.outbox_in_flight;
SELECT published, delivered, in_flight FROM idempotency.outbox_stats WHERE topic = 'payments';
SELECT count(*) AS nothing_left FROM idempotency.claim('payments');
-- a claim whose transaction rolls back leaves nothing claimed
SELECT idempotency.publish('payments', '{"n": "rb"}') IS NOT NULL AS published;
BEGIN;
SELECT attempt FROM idempotency.claim('payments');
SELECT count(*) AS in_flight_inside FROM idempotency.outbox_in_flight;
ROLLBACK;
SELECT count(*) AS in_flight_after_rollback FROM idempotency.outbox_in_flight;
SELECT attempt, idempotency.ack(claim, ARRAY[id]) AS acked FROM idempotency.claim('payments');
-- a claim or an ack in a rolled-back savepoint (or exception block) is undone with it
SELECT idempotency.publish('payments', '{"n": "sp"}') IS NOT NULL AS published;
BEGIN;
SAVEPOINT s;
SELECT attempt FROM idempotency.claim('payments');
ROLLBACK TO SAVEPOINT s;
SELECT count(*) AS in_flight_after_savepoint FROM idempotency.outbox_in_flight;
COMMIT;
CREATE TEMP TABLE sp AS SELECT * FROM idempotency.claim('payments');
BEGIN;
SAVEPOINT s;
SELECT idempotency.ack(claim, ARRAY[id]) AS acked FROM sp;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT count(*) AS still_in_flight FROM idempotency.outbox_in_flight;
DO $$ BEGIN
  PERFORM idempotency.ack(claim, ARRAY[id]) FROM sp;
  RAISE EXCEPTION 'undo';
EXCEPTION WHEN raise_exception THEN NULL;
END $$;
SELECT count(*) AS still_in_flight FROM idempotency.outbox_in_flight;
SELECT idempotency.ack(claim, ARRAY[id]) AS acked FROM sp;
DROP TABLE sp;

-- inside once(): one guarded request, one message; a replay publishes nothing
CREATE TABLE outbox_payment (id serial PRIMARY KEY, amount int);
SELECT outcome FROM idempotency.once('pay-1', '{"amount": 5}',
  'WITH p AS (INSERT INTO outbox_payment (amount) VALUES ($1) RETURNING id)
   SELECT idempotency.publish(''payments'', jsonb_build_object(''payment'', p.id), ''customer-1'') IS NOT NULL AS published FROM p',
  '5');
SELECT outcome FROM idempotency.once('pay-1', '{"amount": 5}',
  'WITH p AS (INSERT INTO outbox_payment (amount) VALUES ($1) RETURNING id)
   SELECT idempotency.publish(''payments'', jsonb_build_object(''payment'', p.id), ''customer-1'') IS NOT NULL AS published FROM p',
  '5');
SELECT count(*) AS payments, (SELECT count(*) FROM idempotency.outbox_message
                               WHERE state = 'pending') AS messages
  FROM outbox_payment;
DROP TABLE outbox_payment;
-- in a trigger
CREATE TABLE outbox_order (id int PRIMARY KEY);
CREATE FUNCTION outbox_order_published() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM idempotency.publish('payments', jsonb_build_object('order', NEW.id), 'order-' || NEW.id);
  RETURN NEW;
END $$;
CREATE TRIGGER outbox_order_published AFTER INSERT ON outbox_order
  FOR EACH ROW EXECUTE FUNCTION outbox_order_published();
INSERT INTO outbox_order VALUES (7);
SELECT payload FROM idempotency.outbox_message WHERE message_key = 'order-7';
DROP TABLE outbox_order;
DROP FUNCTION outbox_order_published();
-- clean slate
SELECT count(*) FROM (SELECT idempotency.ack(claim, ARRAY[id])
                        FROM idempotency.claim('payments', 100)) AS a;

-- ---- order per key ---------------------------------------------------------
SELECT idempotency.publish('payments', '{"n": "a1"}', 'a') IS NOT NULL,
       idempotency.publish('payments', '{"n": "a2"}', 'a') IS NOT NULL,
       idempotency.publish('payments', '{"n": "b1"}', 'b') IS NOT NULL,
       idempotency.publish('payments', '{"n": "a3"}', 'a') IS NOT NULL,
       idempotency.publish('payments', '{"n": "none"}') IS NOT NULL;
-- one per key: a1, b1 and the unkeyed one
CREATE TEMP TABLE c1 AS SELECT * FROM idempotency.claim('payments', 100);
SELECT message_key, payload->>'n' AS n FROM c1 ORDER BY id;
SELECT count(*) AS while_a1_out FROM idempotency.claim('payments', 100);
-- a nack keeps a2 waiting: a1 is retried first (retry_in 0: at once)
SELECT idempotency.nack(claim, ARRAY[id], '{"error": "503"}', '0 s') AS nacked
  FROM c1 WHERE message_key = 'a';
SELECT message_key, payload->>'n' AS n, attempt FROM idempotency.claim('payments', 100) AS c
 \gset ca_
SELECT :'ca_n' AS retried, :ca_attempt AS attempt;
SELECT idempotency.ack(claim, ARRAY[id]) FROM idempotency.outbox_in_flight;
SELECT count(*) FROM (SELECT idempotency.ack(claim, array_agg(id)) FROM c1
                       WHERE message_key IS DISTINCT FROM 'a' GROUP BY claim) AS a;
-- then a2, then a3
SELECT payload->>'n' AS n FROM idempotency.claim('payments', 100) \gset c_
SELECT :'c_n' AS next;
SELECT idempotency.ack(claim, ARRAY[id]) FROM idempotency.outbox_in_flight;
SELECT payload->>'n' AS n FROM idempotency.claim('payments', 100);
SELECT idempotency.ack(claim, ARRAY[id]) FROM idempotency.outbox_in_flight;

-- ---- backoff, dead letters, redrive, release, visibility ------------------
SELECT idempotency.publish('payments', '{"n": "flaky"}', 'f') IS NOT NULL,
       idempotency.publish('payments', '{"n": "after flaky"}', 'f') IS NOT NULL;
-- default backoff: backoff_base * 2^(attempt - 1), capped at backoff_max
SELECT idempotency.nack(claim, ARRAY[id], '{"error": "timeout"}')
  FROM idempotency.claim('payments');
SELECT attempts, last_error, round(extract(epoch FROM available_at - now())) AS retry_in_s
  FROM idempotency.outbox_message WHERE state = 'pending' AND payload->>'n' = 'flaky';
SELECT count(*) AS before_backoff FROM idempotency.claim('payments');
UPDATE idempotency.outbox_message SET available_at = now();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
UPDATE idempotency.outbox_message SET available_at = now() WHERE state = 'pending';
SET ROLE regress_alice;
SELECT idempotency.nack(claim, ARRAY[id], '{"error": "timeout"}')
  FROM idempotency.claim('payments');
SELECT attempts, round(extract(epoch FROM available_at - now())) AS retry_in_s
  FROM idempotency.outbox_message WHERE state = 'pending' AND payload->>'n' = 'flaky';
RESET ROLE;
UPDATE idempotency.outbox_message SET available_at = now() WHERE state = 'pending';
SET ROLE regress_alice;
-- third failure of max_attempts 3: dead; its successor goes out
SELECT idempotency.nack(claim, ARRAY[id], '{"error": "gone"}')
  FROM idempotency.claim('payments');
SELECT topic, message_key, payload, attempts, last_error FROM idempotency.outbox_dead;
SELECT payload->>'n' AS n, attempt FROM idempotency.claim('payments') \gset s_
SELECT :'s_n' AS successor;
SELECT idempotency.ack(claim, ARRAY[id]) FROM idempotency.outbox_in_flight;
-- redrive: attempts start again
SELECT idempotency.redrive('payments') AS redriven;
SELECT count(*) AS dead FROM idempotency.outbox_dead;
-- release: back at once, the attempt not counted
SELECT idempotency.release(claim, ARRAY[id]) AS released FROM idempotency.claim('payments');
SELECT attempts, claim IS NULL AS free FROM idempotency.outbox_message WHERE state = 'pending';
-- visibility: a lapsed claim is handed out again; the old claim is fenced
SELECT claim AS old_claim, id AS mid FROM idempotency.claim('payments', 1, '10 ms') \gset
SELECT pg_sleep(0.05);
SELECT attempt, claim <> :'old_claim' AS new_claim FROM idempotency.claim('payments', 1, '1 minute');
SELECT idempotency.ack(:'old_claim', ARRAY[:mid]::bigint[]) AS old_claim_acked;
SELECT idempotency.nack(:'old_claim', ARRAY[:mid]::bigint[]) AS old_claim_nacked;
SELECT idempotency.ack(claim, ARRAY[id]) AS acked FROM idempotency.outbox_in_flight;
-- a claim that lapses at max_attempts makes the message dead
SELECT idempotency.publish('payments', '{"n": "lost"}') IS NOT NULL;
SELECT count(*) FROM idempotency.claim('payments', 1, '1 ms');
SELECT pg_sleep(0.01);
SELECT count(*) FROM idempotency.claim('payments', 1, '1 ms');
SELECT pg_sleep(0.01);
SELECT count(*) FROM idempotency.claim('payments', 1, '1 ms');
SELECT pg_sleep(0.01);
SELECT count(*) AS claimed FROM idempotency.claim('payments', 1, '1 ms');
SELECT payload, attempts, last_error FROM idempotency.outbox_dead WHERE payload->>'n' = 'lost';
-- relay arguments
SELECT * FROM idempotency.claim('payments', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim('payments', 10, '0 s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim('payments', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.ack(NULL, '{1}') IS NULL AS strict;
SELECT idempotency.nack(gen_random_uuid(), NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.nack(gen_random_uuid(), '{NULL}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.nack(gen_random_uuid(), '{1}', retry_in => '-1 s');
\echo :LAST_ERROR_SQLSTATE

-- ---- 1 MB payloads ---------------------------------------------------------
SELECT idempotency.publish('payments', jsonb_build_object('blob', repeat('x', 1024 * 1024))) IS NOT NULL;
SELECT length(payload->>'blob') AS blob_length, idempotency.ack(claim, ARRAY[id]) AS acked
  FROM idempotency.claim('payments');

-- ---- a key's backlog does not hold up other keys -----------------------------
-- 1100 messages of key deep fill the claim's first window (64 ready
-- messages); the claim still finds the other key's head and the unkeyed
-- message behind them, and only deep's earliest
SELECT count(idempotency.publish('payments', jsonb_build_object('n', 'deep-' || i), 'deep'))
  FROM generate_series(1, 1100) i;
SELECT idempotency.publish('payments', '{"n": "other-1"}', 'other') IS NOT NULL,
       idempotency.publish('payments', '{"n": "other-2"}', 'other') IS NOT NULL,
       idempotency.publish('payments', '{"n": "unkeyed"}') IS NOT NULL;
CREATE TEMP TABLE c2 AS SELECT * FROM idempotency.claim('payments', 10);
SELECT message_key, payload->>'n' AS n FROM c2 ORDER BY id;
SELECT count(*) FROM (SELECT idempotency.ack(claim, array_agg(id)) FROM c2 GROUP BY claim) a;
SELECT message_key, payload->>'n' AS n FROM idempotency.claim('payments', 10) ORDER BY id;
RESET ROLE;
DELETE FROM idempotency.outbox_message WHERE state = 'pending';
SET ROLE regress_alice;

-- ---- other roles -----------------------------------------------------------
SELECT idempotency.publish('payments', '{"n": "private"}') IS NOT NULL;
SELECT claim AS alice_claim, id AS alice_id FROM idempotency.claim('payments', 1) \gset
RESET ROLE;
SET ROLE regress_bob;
-- nothing read, acked, nacked, released or redriven across roles
SELECT count(*) AS bob_sees FROM idempotency.outbox_message;
SELECT count(*) AS bob_sees_dead FROM idempotency.outbox_dead;
SELECT count(*) AS bob_sees_stats FROM idempotency.outbox_stats;
-- nor the counts in shared memory behind it (a role sees only its topics')
SELECT delivered FROM idempotency._outbox_counts(:payments_id) AS bob_sees_counts;
-- nor alice's claim in shared memory: its token, end and attempt (the
-- view outbox_in_flight has row security; the function behind it, executable
-- by everyone, takes any message id)
SELECT count(*) AS bob_sees_in_flight FROM idempotency.outbox_in_flight;
SELECT claim IS NULL AS no_token, claimed_until IS NULL AS no_end, attempt IS NULL AS no_attempt
  FROM idempotency._outbox_claim(:alice_id);
SELECT count(*) AS bob_finds_tokens
  FROM generate_series(1, :alice_id) AS g(id), idempotency._outbox_claim(g.id) AS c
 WHERE c.claim IS NOT NULL;
SELECT idempotency.ack(:'alice_claim', ARRAY[:alice_id]::bigint[]) AS bob_acked;
SELECT idempotency.nack(:'alice_claim', ARRAY[:alice_id]::bigint[]) AS bob_nacked;
SELECT idempotency.release(:'alice_claim', ARRAY[:alice_id]::bigint[]) AS bob_released;
SELECT idempotency.grant_topic('payments', 'regress_bob');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.drop_topic('payments', true);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.alter_topic('payments', max_attempts => 100);
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT (SELECT state FROM idempotency.outbox_message WHERE id = :alice_id) AS state,
       (SELECT claim = :'alice_claim' FROM idempotency.outbox_in_flight WHERE id = :alice_id) AS still_alices;
-- grants: publish only, then consume too, then revoked
SET ROLE regress_alice;
SELECT idempotency.grant_topic('payments', 'regress_bob', publish => true, consume => false);
SELECT grantee, can_publish, can_consume FROM idempotency.outbox_grant;
SET ROLE regress_bob;
SELECT idempotency.publish('payments', '{"n": "from bob"}') IS NOT NULL AS bob_published;
SELECT count(*) AS bob_sees FROM idempotency.outbox_message;
SELECT * FROM idempotency.claim('payments');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.ack(:'alice_claim', ARRAY[:alice_id]::bigint[]) AS bob_acked;
SET ROLE regress_alice;
SELECT idempotency.grant_topic('payments', 'regress_bob', publish => false, consume => true);
SET ROLE regress_bob;
SELECT name FROM idempotency.outbox_topic;
SELECT payload FROM idempotency.claim('payments');
SELECT count(*) AS bob_sees FROM idempotency.outbox_message;
SELECT idempotency.publish('payments', '{}');
\echo :LAST_ERROR_SQLSTATE
SET ROLE regress_alice;
SELECT idempotency.revoke_topic('payments', 'regress_bob') AS revoked,
       idempotency.revoke_topic('payments', 'regress_bob') AS revoked_again;
SET ROLE regress_bob;
SELECT count(*) AS bob_sees FROM idempotency.outbox_message;
SELECT * FROM idempotency.claim('payments');
\echo :LAST_ERROR_SQLSTATE
-- carol may do nothing at all
SET ROLE regress_outbox_carol;
SELECT count(*) AS carol_sees FROM idempotency.outbox_message;
SELECT count(*) AS carol_sees_stats FROM idempotency.outbox_stats;
SELECT idempotency.publish('payments', '{}');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- a monitoring role (pg_read_all_stats) sees every topic's counts, no message
GRANT pg_read_all_stats TO regress_outbox_carol;
SET ROLE regress_outbox_carol;
SELECT topic, published FROM idempotency.outbox_stats;
SELECT count(*) AS carol_sees FROM idempotency.outbox_message;
RESET ROLE;
REVOKE pg_read_all_stats FROM regress_outbox_carol;

-- ---- stats, retention and purge ---------------------------------------------
SET ROLE regress_alice;
SELECT topic, published, delivered, retried, dead, in_flight, undelivered,
       oldest_undelivered_age > '0 s' AS has_oldest
  FROM idempotency.outbox_stats;
SELECT idempotency.alter_topic('payments', retention => '0 s');
SELECT count(*) FROM (SELECT idempotency.ack(claim, ARRAY[id]) FROM idempotency.claim('payments', 100)) a;
SELECT idempotency.ack(claim, ARRAY[id]) FROM idempotency.outbox_in_flight;
SELECT idempotency.publish('payments', '{"n": "purge me"}') IS NOT NULL;
SELECT idempotency.ack(claim, ARRAY[id]) FROM idempotency.claim('payments');
-- ack deleted the delivered rows (claims in shared memory): nothing for
-- purge() to delete; it writes the acked counts into the topic's row, and
-- outbox_stats counts every message once, before and after
SELECT topic, published, delivered, retried, dead, in_flight, undelivered
  FROM idempotency.outbox_stats;
SELECT idempotency.purge() AS purged;
SELECT state, count(*) FROM idempotency.outbox_message GROUP BY state ORDER BY state;
SELECT topic, published, delivered, retried, dead, in_flight, undelivered
  FROM idempotency.outbox_stats;
RESET ROLE;
SELECT purged_delivered, purged_retries FROM idempotency.outbox_topic WHERE name = 'payments';
SELECT delivered, retried FROM idempotency._outbox_counts(
  (SELECT id FROM idempotency.outbox_topic WHERE name = 'payments'));
SET ROLE regress_alice;
-- drop: refused while messages are undelivered, unless forced
SELECT idempotency.publish('payments', '{"n": "undelivered"}') IS NOT NULL;
SELECT idempotency.drop_topic('payments');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.drop_topic('payments', force => true);
SELECT idempotency.drop_topic('payments');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT outbox_rows() AS rows_left, (SELECT count(*) FROM idempotency.outbox_grant) AS grants_left;
-- ---- a consumer of one topic reads no other topic's
-- messages (the row policy compared g.topic_id with itself)
SET ROLE regress_alice;
SELECT idempotency.create_topic('alice-only') > 0 AS created;
SELECT idempotency.publish('alice-only', '{"n": "alice secret"}') IS NOT NULL AS published;
RESET ROLE;
SET ROLE regress_outbox_carol;
SELECT idempotency.create_topic('carol-shared') > 0 AS created;
SELECT idempotency.grant_topic('carol-shared', 'regress_bob', publish => false, consume => true);
SELECT idempotency.publish('carol-shared', '{"n": "for bob"}') IS NOT NULL AS published;
RESET ROLE;
SET ROLE regress_bob;
SELECT payload->>'n' AS bob_reads FROM idempotency.outbox_message ORDER BY id;
SELECT count(*) AS bob_sees_dead FROM idempotency.outbox_dead;
RESET ROLE;
SELECT pg_get_expr(polqual, polrelid) LIKE '%g.topic_id = outbox_message.topic_id%' AS qualified
  FROM pg_policy WHERE polname = 'outbox_message_own_rows';
SET ROLE regress_outbox_carol;
SELECT idempotency.drop_topic('carol-shared', force => true);
RESET ROLE;
SET ROLE regress_alice;
SELECT idempotency.drop_topic('alice-only', force => true);

-- ---- a claim whose lapsed message goes dead in the same
-- statement still returns another ready message
SELECT idempotency.create_topic('lapse', max_attempts => 1) > 0 AS created;
SELECT idempotency.publish('lapse', '{"n": "lapsed"}') IS NOT NULL AS published;
SELECT count(*) AS claimed FROM idempotency.claim('lapse', 1, '10 ms');
SELECT idempotency.publish('lapse', '{"n": "ready"}') IS NOT NULL AS published;
-- the claim lapses; the lapsed message was available first (its row kept
-- its publish time), the other one after it
SELECT pg_sleep(0.05);
SELECT payload->>'n' AS n, attempt FROM idempotency.claim('lapse', 1);
RESET ROLE;
SELECT m.payload->>'n' AS n, m.state, coalesce(f.attempt, m.attempts) AS attempts,
       f.id IS NOT NULL AS claimed
  FROM idempotency.outbox_message AS m LEFT JOIN idempotency.outbox_in_flight AS f USING (id)
 ORDER BY m.id;
SET ROLE regress_alice;
SELECT idempotency.drop_topic('lapse', force => true);

-- beyond the window (full of a hot key's backlog, its head out), the
-- claim still hands out the oldest ready message first, not the first key
-- in key order: 'z' was published before 'a'
SELECT idempotency.create_topic('beyond') > 0 AS created;
SELECT count(idempotency.publish('beyond', jsonb_build_object('n', 'h' || i), 'h'))
  FROM generate_series(1, 70) AS i;
SELECT idempotency.publish('beyond', '{"n": "z-old"}', 'z') IS NOT NULL AS published;
SELECT idempotency.publish('beyond', '{"n": "a-new"}', 'a') IS NOT NULL AS published;
SELECT payload->>'n' AS n FROM idempotency.claim('beyond', 1, '1 hour');
SELECT payload->>'n' AS n FROM idempotency.claim('beyond', 1, '1 hour');
SELECT payload->>'n' AS n FROM idempotency.claim('beyond', 1, '1 hour');
SELECT idempotency.drop_topic('beyond', force => true);

-- ---- nack's default backoff is capped before it is
-- doubled (hours of backoff_base at attempt 31 overflowed the interval)
SELECT idempotency.create_topic('slow', max_attempts => 40, backoff_base => '10 hours',
                                backoff_max => '1 day') > 0 AS created;
SELECT idempotency.publish('slow', '{"n": "slow"}') IS NOT NULL AS published;
RESET ROLE;
UPDATE idempotency.outbox_message SET attempts = 30 WHERE payload->>'n' = 'slow';
SET ROLE regress_alice;
SELECT attempt, idempotency.nack(claim, ARRAY[id], '{"error": "503"}') AS nacked
  FROM idempotency.claim('slow');
SELECT state, attempts, available_at - now() BETWEEN '23:59' AND '1 day' AS capped_at_backoff_max
  FROM idempotency.outbox_message;
-- below the cap it still doubles: attempt 2 of 10 hours waits 20 hours
RESET ROLE;
UPDATE idempotency.outbox_message SET attempts = 1, available_at = now();
SET ROLE regress_alice;
SELECT attempt, idempotency.nack(claim, ARRAY[id]) AS nacked FROM idempotency.claim('slow');
SELECT available_at - now() BETWEEN '19:59' AND '20:00' AS doubled FROM idempotency.outbox_message;
SELECT idempotency.drop_topic('slow', force => true);

-- ---- redrive() puts no second message of a key in
-- flight: the redriven message gets a new position behind its key's
-- other messages and keeps its message_id
SELECT idempotency.create_topic('redrive', max_attempts => 1) > 0 AS created;
SELECT idempotency.publish('redrive', '{"n": "k1"}', 'k') IS NOT NULL AS k1,
       idempotency.publish('redrive', '{"n": "k2"}', 'k') IS NOT NULL AS k2,
       idempotency.publish('redrive', '{"n": "u"}') IS NOT NULL AS unkeyed;
SELECT count(idempotency.nack(claim, ARRAY[id], '{"error": "gone"}'))
  FROM idempotency.claim('redrive');
SELECT id AS k1_id, message_id AS k1_message_id FROM idempotency.outbox_dead
 WHERE payload->>'n' = 'k1' \gset
CREATE TEMP TABLE c3 AS SELECT * FROM idempotency.claim('redrive');
SELECT payload->>'n' AS n FROM c3;
SELECT idempotency.redrive('redrive') AS redriven;
-- k2 is out: k1 waits; the unkeyed one goes
SELECT payload->>'n' AS n FROM idempotency.claim('redrive') ORDER BY id;
SELECT idempotency.ack(claim, ARRAY[id]) AS acked FROM c3;
SELECT payload->>'n' AS n, message_id = :'k1_message_id' AS same_message_id,
       id > :k1_id AS behind_its_key, attempt
  FROM idempotency.claim('redrive') WHERE message_key = 'k';
-- redrive of ids that are not dead, of another topic, or of no one: nothing
SELECT idempotency.redrive('redrive', ARRAY[:k1_id]::bigint[]) AS redriven_again;
SELECT idempotency.redrive('redrive', '{}') AS redriven_none;
SELECT idempotency.redrive('redrive', '{NULL}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.drop_topic('redrive', force => true);

-- ---- publish() in a prepared transaction (two-phase
-- commit): PREPARE works; the message is there after COMMIT PREPARED and
-- gone after ROLLBACK PREPARED
SELECT idempotency.create_topic('twophase') > 0 AS created;
BEGIN;
SELECT idempotency.publish('twophase', '{"n": "prepared"}') IS NOT NULL AS published;
PREPARE TRANSACTION 'outbox_2pc_commit';
BEGIN;
SELECT idempotency.publish('twophase', '{"n": "rolled back"}') IS NOT NULL AS published;
PREPARE TRANSACTION 'outbox_2pc_rollback';
RESET ROLE;
COMMIT PREPARED 'outbox_2pc_commit';
ROLLBACK PREPARED 'outbox_2pc_rollback';
SET ROLE regress_alice;
SELECT payload->>'n' AS n, idempotency.ack(claim, ARRAY[id]) AS acked
  FROM idempotency.claim('twophase');
-- a claim in a prepared transaction: held while it is prepared; ROLLBACK
-- PREPARED undoes it as ROLLBACK does (the message is claimable at once, at
-- attempt 1: with max_attempts 1 a rolled-back claim must not make it
-- dead), COMMIT PREPARED keeps it
SELECT idempotency.alter_topic('twophase', max_attempts => 1);
SELECT idempotency.publish('twophase', '{"n": "claimed in 2pc"}') IS NOT NULL AS published;
BEGIN;
SELECT payload->>'n' AS n, attempt FROM idempotency.claim('twophase', 1, '1 hour');
PREPARE TRANSACTION 'outbox_2pc_claim';
SELECT count(*) AS claimable_while_prepared FROM idempotency.claim('twophase');
RESET ROLE;
ROLLBACK PREPARED 'outbox_2pc_claim';
SET ROLE regress_alice;
SELECT count(*) AS in_flight_after_rollback_prepared FROM idempotency.outbox_in_flight;
BEGIN;
SELECT payload->>'n' AS n, attempt FROM idempotency.claim('twophase', 1, '1 hour');
PREPARE TRANSACTION 'outbox_2pc_claim';
RESET ROLE;
COMMIT PREPARED 'outbox_2pc_claim';
SET ROLE regress_alice;
SELECT attempt FROM idempotency.outbox_in_flight;
SELECT count(*) AS claimable_after_commit_prepared FROM idempotency.claim('twophase');
SELECT state, attempts FROM idempotency.outbox_message;
SELECT idempotency.ack(claim, ARRAY[id]) AS acked FROM idempotency.outbox_in_flight;
RESET ROLE;
SELECT id AS twophase_id FROM idempotency.outbox_topic WHERE name = 'twophase' \gset
SELECT delivered FROM idempotency._outbox_counts(:twophase_id) AS counted_before_drop;
SET ROLE regress_alice;
SELECT idempotency.drop_topic('twophase');
-- the purge (by the topic's owner: a role's purge touches only its own
-- topics' counts) drops a dropped topic's counts (it has no row to add them to)
SELECT idempotency.purge() AS purged;
RESET ROLE;
SELECT delivered FROM idempotency._outbox_counts(:twophase_id) AS counted_after_purge;
SET ROLE regress_alice;
-- a topic dropped earlier in the same statement is not published to from
-- the backend's cache
SELECT idempotency.create_topic('same-statement') > 0 AS created;
BEGIN;
SELECT idempotency.publish('same-statement', '{}') IS NOT NULL AS published_and_cached;
SELECT idempotency.drop_topic('same-statement', true), idempotency.publish('same-statement', '{}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT idempotency.drop_topic('same-statement', true);
-- the acked counts are written once: what a purge takes is taken for the
-- purges after it (a purge in a prepared transaction must not leave them
-- to the next purge to write a second time; two purges at once the same);
-- a purge rolled back in a savepoint takes nothing; the superuser's purge
-- touches only its own topics' counts (none here)
SELECT idempotency.create_topic('counted-once') > 0 AS created;
SELECT count(*) AS published FROM (SELECT idempotency.publish('counted-once', pg_catalog.jsonb_build_object('n', g))
                                     FROM generate_series(1, 3) AS g) AS p;
SELECT count(*) AS acked FROM (SELECT idempotency.ack(c.claim, ARRAY[c.id])
                                 FROM idempotency.claim('counted-once', 3) AS c) AS a;
RESET ROLE;
SELECT idempotency.purge() >= 0 AS purged_by_superuser;
SELECT purged_delivered FROM idempotency.outbox_topic WHERE name = 'counted-once';
SET ROLE regress_alice;
BEGIN;
SAVEPOINT before_purge;
SELECT idempotency.purge() >= 0 AS purged_in_savepoint;
ROLLBACK TO SAVEPOINT before_purge;
COMMIT;
SELECT published, delivered FROM idempotency.outbox_stats WHERE topic = 'counted-once';
BEGIN;
SELECT idempotency.purge() >= 0 AS purged_then_prepared;
PREPARE TRANSACTION 'outbox_2pc_purge';
COMMIT PREPARED 'outbox_2pc_purge';
SELECT idempotency.purge() >= 0 AS purged_again;
SELECT published, delivered FROM idempotency.outbox_stats WHERE topic = 'counted-once';
SELECT purged_delivered FROM idempotency.outbox_topic WHERE name = 'counted-once';
SELECT idempotency.drop_topic('counted-once', true);
-- an ack counts as its transaction does: one rolled back to a savepoint
-- counts nothing (the message is pending again), one prepared counts from
-- COMMIT PREPARED on, one prepared and rolled back counts nothing
SELECT idempotency.create_topic('counted-2pc') > 0 AS created;
SELECT count(idempotency.publish('counted-2pc', pg_catalog.jsonb_build_object('n', g))) AS published
  FROM generate_series(1, 3) AS g;
BEGIN;
SAVEPOINT before_ack;
SELECT idempotency.ack(c.claim, ARRAY[c.id]) AS acked FROM idempotency.claim('counted-2pc', 1) AS c;
SELECT published, delivered, undelivered FROM idempotency.outbox_stats WHERE topic = 'counted-2pc';
ROLLBACK TO SAVEPOINT before_ack;
SELECT published, delivered, undelivered FROM idempotency.outbox_stats WHERE topic = 'counted-2pc';
COMMIT;
BEGIN;
SELECT idempotency.ack(c.claim, ARRAY[c.id]) AS acked FROM idempotency.claim('counted-2pc', 1) AS c;
PREPARE TRANSACTION 'outbox_2pc_ack';
SELECT published, delivered, undelivered FROM idempotency.outbox_stats WHERE topic = 'counted-2pc';
ROLLBACK PREPARED 'outbox_2pc_ack';
SELECT published, delivered, undelivered FROM idempotency.outbox_stats WHERE topic = 'counted-2pc';
BEGIN;
SELECT idempotency.ack(c.claim, ARRAY[c.id]) AS acked FROM idempotency.claim('counted-2pc', 1) AS c;
PREPARE TRANSACTION 'outbox_2pc_ack';
COMMIT PREPARED 'outbox_2pc_ack';
SELECT published, delivered, undelivered FROM idempotency.outbox_stats WHERE topic = 'counted-2pc';
SELECT idempotency.drop_topic('counted-2pc', true);
-- a claim that takes over a lapsed claim, in a transaction that rolls
-- back, puts the lapsed claim back: its attempt still counts (review after
-- stop 32: the entry was removed and the row's write of the lapsed attempt
-- rolled back, so the attempt was counted nowhere)
SELECT idempotency.create_topic('takeover') > 0 AS created;
SELECT idempotency.publish('takeover', '{}') IS NOT NULL AS published;
SELECT attempt AS first_attempt FROM idempotency.claim('takeover', 1, '1 millisecond');
SELECT pg_sleep(0.05);
BEGIN;
SELECT attempt AS taken_over_then_rolled_back FROM idempotency.claim('takeover', 1, '1 hour');
ROLLBACK;
SELECT attempt AS next_attempt FROM idempotency.claim('takeover', 1, '1 hour');
SELECT idempotency.drop_topic('takeover', true);
RESET ROLE;
SELECT outbox_rows() AS rows_left, (SELECT count(*) FROM idempotency.outbox_topic) AS topics_left;
DROP FUNCTION outbox_rows();
DROP ROLE regress_outbox_carol;
