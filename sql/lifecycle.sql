-- lifecycle: purge() of expired rows (own role only), one-time tokens,
-- consumer dedup with first_seen().
\i sql/include/roles.sql

-- purge: expired keys of the calling role go, live ones and other roles' stay
SET ROLE regress_alice;
BEGIN;
SELECT count(*) FROM generate_series(1, 25) i, idempotency.begin('old-' || i, ttl => '1 millisecond');
SELECT count(idempotency.complete('old-' || i, '{}')) FROM generate_series(1, 25) i;
SELECT outcome FROM idempotency.begin('live');
SELECT idempotency.complete('live', '{}');
COMMIT;
SET ROLE regress_bob;
BEGIN;
SELECT outcome FROM idempotency.begin('bobs-old', ttl => '1 millisecond');
SELECT idempotency.complete('bobs-old', '{}');
COMMIT;
RESET ROLE;
SELECT pg_sleep(0.01);
SET ROLE regress_alice;
-- batches: 10 + 10 + 5, then nothing
SELECT idempotency.purge(10) AS first, idempotency.purge(10) AS second;
SELECT idempotency.purge(10) AS third, idempotency.purge(10) AS fourth;
SELECT key FROM idempotency.idempotency_key
 WHERE key = 'live' OR key LIKE 'old-%' ORDER BY key;
SELECT idempotency.purge(0);
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- bob's expired key is still there until bob (or the worker) purges it
SELECT owner, key FROM idempotency.idempotency_key WHERE key = 'bobs-old';
SET ROLE regress_bob;
SELECT idempotency.purge();
RESET ROLE;
SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'bobs-old';
-- purge skips rows another transaction has locked instead of waiting
-- (the worker deletes every role's rows: see test/t/003_purge_worker.pl)

-- one-time tokens
SELECT idempotency.issue_token('checkout') AS t \gset
SELECT idempotency.consume_token(:'t', 'checkout') AS first_use;
SELECT idempotency.consume_token(:'t', 'checkout') AS second_use;
-- unknown, wrong scope, NULL, another role's, expired
SELECT idempotency.consume_token(gen_random_uuid(), 'checkout') AS unknown;
SELECT idempotency.issue_token('checkout') AS t2 \gset
SELECT idempotency.consume_token(:'t2', 'other-scope') AS wrong_scope,
       idempotency.consume_token(NULL, 'checkout') AS null_token;
SET ROLE regress_bob;
SELECT idempotency.consume_token(:'t2', 'checkout') AS bobs_try;
RESET ROLE;
SELECT idempotency.consume_token(:'t2', 'checkout') AS owner_still_can;
SELECT idempotency.issue_token(ttl => '1 millisecond') AS t3 \gset
SELECT pg_sleep(0.01);
SELECT idempotency.consume_token(:'t3') AS expired;
-- a consumed token comes back when its transaction rolls back
SELECT idempotency.issue_token() AS t4 \gset
BEGIN;
SELECT idempotency.consume_token(:'t4') AS in_rolled_back_tx;
ROLLBACK;
SELECT idempotency.consume_token(:'t4') AS after_rollback;
-- bad arguments
SELECT idempotency.issue_token(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.issue_token(ttl => '0 seconds');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.consume_token(:'t4', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.consume_token('not-a-uuid');
\echo :LAST_ERROR_SQLSTATE
-- expired tokens are purged too
SELECT count(*) AS tokens_left FROM idempotency.token;
SELECT idempotency.purge() > 0 AS purged;
SELECT count(*) AS tokens_left FROM idempotency.token;

-- consumer dedup
SELECT idempotency.first_seen('orders-consumer', 'msg-1') AS first_delivery;
SELECT idempotency.first_seen('orders-consumer', 'msg-1') AS redelivery;
SELECT idempotency.first_seen('audit-consumer', 'msg-1') AS other_scope;
SET ROLE regress_bob;
SELECT idempotency.first_seen('orders-consumer', 'msg-1') AS other_role;
RESET ROLE;
-- a failed handler's message is processed again on redelivery
BEGIN;
SELECT idempotency.first_seen('orders-consumer', 'msg-2') AS handler_starts;
ROLLBACK;
SELECT idempotency.first_seen('orders-consumer', 'msg-2') AS redelivered_after_failure;
-- and a savepoint rolled back inside a handler forgets it too
BEGIN;
SAVEPOINT s;
SELECT idempotency.first_seen('orders-consumer', 'msg-3');
ROLLBACK TO SAVEPOINT s;
SELECT idempotency.first_seen('orders-consumer', 'msg-3') AS after_savepoint_rollback;
COMMIT;
-- an expired entry counts as unseen
SELECT idempotency.first_seen('orders-consumer', 'msg-4', ttl => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT idempotency.first_seen('orders-consumer', 'msg-4', ttl => '1 hour') AS after_expiry;
SELECT idempotency.first_seen('orders-consumer', 'msg-4') AS redelivery;
-- a redelivery writes nothing
CREATE FUNCTION wal_of(q text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE plan jsonb;
BEGIN
  EXECUTE 'EXPLAIN (ANALYZE, WAL, FORMAT JSON) ' || q INTO plan;
  RETURN (plan -> 0 -> 'Plan' ->> 'WAL Records')::bigint;
END $$;
SELECT wal_of($$SELECT idempotency.first_seen('orders-consumer', 'msg-1')$$) AS redelivery_wal_records;
-- bad arguments
SELECT idempotency.first_seen(NULL, 'msg');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.first_seen('q', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.first_seen('q', '');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.first_seen('q', repeat('m', 256));
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.first_seen('q', 'm', ttl => '-1 day');
\echo :LAST_ERROR_SQLSTATE
SELECT owner, scope, message_id, expires_at > first_seen_at AS expires_later
  FROM idempotency.seen_message ORDER BY owner::text, scope, message_id;
