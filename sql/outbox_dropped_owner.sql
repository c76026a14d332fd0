-- A topic whose owner role was dropped belongs to no role that exists:
-- the grants its owner gave give nothing (no reading, publishing,
-- claiming, acking, waiting), for the granted role as for a new one, and
-- nothing is written; create_topic() of its name by any role takes the
-- name over (the old topic, its grants and messages go), while a live
-- owner's topic still keeps its name (42710).
\set VERBOSITY terse
CREATE ROLE regress_gone_owner NOLOGIN;
CREATE ROLE regress_gone_user NOLOGIN;
CREATE ROLE regress_gone_new NOLOGIN;
CREATE FUNCTION gone_rows() RETURNS text LANGUAGE sql AS $$
  SELECT format('topics %s, grants %s, messages %s',
                (SELECT count(*) FROM idempotency.outbox_topic WHERE name = 'gone'),
                (SELECT count(*) FROM idempotency.outbox_grant AS g
                   JOIN idempotency.outbox_topic AS t ON t.id = g.topic_id WHERE t.name = 'gone'),
                (SELECT count(*) FROM idempotency.outbox_message AS m
                   JOIN idempotency.outbox_topic AS t ON t.id = m.topic_id WHERE t.name = 'gone'))
$$;
SET ROLE regress_gone_owner;
SELECT idempotency.create_topic('gone') > 0 AS created;
SELECT idempotency.grant_topic('gone', 'regress_gone_user', publish => true, consume => true);
SELECT count(idempotency.publish('gone', jsonb_build_object('n', i))) FROM generate_series(1, 3) i;
-- the granted role holds a claim on one message when the owner goes
SET ROLE regress_gone_user;
SELECT claim AS held_claim, id AS held_id FROM idempotency.claim('gone', 1) \gset
RESET ROLE;
DROP ROLE regress_gone_owner;
SELECT gone_rows();

-- the granted role: nothing to read, nothing to use
SET ROLE regress_gone_user;
SELECT count(*) FROM idempotency.outbox_topic WHERE name = 'gone';
SELECT count(*) FROM idempotency.outbox_grant;
SELECT count(*) FROM idempotency.outbox_message;
SELECT count(*) FROM idempotency.outbox_stats WHERE topic = 'gone';
SELECT count(*) FROM idempotency.outbox_dead;
SELECT idempotency.publish('gone', '{"n": 4}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim('gone', 10);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.ack(:'held_claim', ARRAY[:held_id]::bigint[]);
SELECT idempotency.nack(:'held_claim', ARRAY[:held_id]::bigint[], '{}');
SELECT idempotency.release(:'held_claim', ARRAY[:held_id]::bigint[]);
SELECT idempotency.redrive('gone');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.wait_for(ARRAY['gone'], '0');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.alter_topic('gone', max_attempts => 9);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.drop_topic('gone', force => true);
\echo :LAST_ERROR_SQLSTATE
-- a role with nothing: the same
SET ROLE regress_gone_new;
SELECT count(*) FROM idempotency.outbox_topic WHERE name = 'gone';
SELECT idempotency.publish('gone', '{"n": 5}');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT gone_rows();

-- the name: a new role's create_topic() takes it over; the old grants,
-- messages and claim go with the old topic
SET ROLE regress_gone_new;
SELECT idempotency.create_topic('gone', max_attempts => 2) > 0 AS taken_over;
SELECT name, owner, max_attempts FROM idempotency.outbox_topic WHERE name = 'gone';
SELECT published, delivered, dead, undelivered FROM idempotency.outbox_stats WHERE topic = 'gone';
RESET ROLE;
SELECT gone_rows();
SELECT owner FROM idempotency.outbox_topic WHERE name = 'gone';
-- the role granted the old topic has no right on the new one
SET ROLE regress_gone_user;
SELECT idempotency.publish('gone', '{"n": 6}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.ack(:'held_claim', ARRAY[:held_id]::bigint[]);
-- a live owner's topic keeps its name
SELECT idempotency.create_topic('gone');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT gone_rows();

SET ROLE regress_gone_new;
SELECT idempotency.drop_topic('gone');
RESET ROLE;
\set VERBOSITY default
DROP FUNCTION gone_rows();
DROP ROLE regress_gone_user, regress_gone_new;
