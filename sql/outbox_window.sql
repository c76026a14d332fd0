-- outbox_window: with claims in shared memory, claim()'s window is an
-- index scan in C (src/outbox_claims.c).  It hands out what the
-- statement it replaced hands out, claim after claim: the statement is
-- still its fallback for a table not of the shipped shape, taken here by
-- renaming the ready index inside a transaction that rolls back.  Both
-- paths see the same messages: a hot key's backlog larger than the window,
-- heads of other keys, unkeyed messages, messages not yet available,
-- lapsed claims taken over and one made dead at max_attempts.  In a
-- read-only transaction the claim fails as the statement's row lock did.
\set VERBOSITY default
SELECT idempotency.create_topic('win') > 0 AS created;
SELECT idempotency.create_topic('winlapse', max_attempts => 2) > 0 AS created;
SELECT count(idempotency.publish('win', jsonb_build_object('n', 'h' || i), 'h'))
  FROM generate_series(1, 70) i;
SELECT count(idempotency.publish('win', jsonb_build_object('n', 'k' || i), 'k' || (i % 3)))
  FROM generate_series(1, 9) i;
SELECT count(idempotency.publish('win', jsonb_build_object('n', 'u' || i)))
  FROM generate_series(1, 30) i;
SELECT count(idempotency.publish('win', jsonb_build_object('n', 'later' || i), deliver_after => '1 hour'))
  FROM generate_series(1, 3) i;
SELECT idempotency.publish('win', '{"n": "z-old"}', 'z') IS NOT NULL AS published;
SELECT idempotency.publish('win', '{"n": "a-new"}', 'a') IS NOT NULL AS published;
SELECT idempotency.publish('winlapse', '{"n": "x"}', 'q') IS NOT NULL AS published;
SELECT idempotency.publish('winlapse', '{"n": "y"}', 'q') IS NOT NULL AS published;
SELECT idempotency.publish('winlapse', '{"n": "u"}') IS NOT NULL AS published;

-- claims of the given sizes, one after another: what each got
CREATE FUNCTION win_claims(topic text, batches int[]) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  out text := '';
  b int;
  got text;
BEGIN
  FOREACH b IN ARRAY batches LOOP
    SELECT coalesce(string_agg(payload->>'n', ' ' ORDER BY id), '-') INTO got
      FROM idempotency.claim(topic, b, '1 hour');
    out := out || '[' || got || '] ';
  END LOOP;
  RETURN out;
END $$;
-- x claimed for 1 ms twice (the second takes the lapsed claim over: attempt
-- 2), then a claim of 2 finds it lapsed at max_attempts: x goes dead, and
-- the claim looks again for its place: y (x no longer heads key q) and u
CREATE FUNCTION win_lapse() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  out text := '';
  got text;
BEGIN
  SELECT string_agg(payload->>'n' || '/' || attempt, ' ') INTO got FROM idempotency.claim('winlapse', 1, '1 ms');
  out := out || '[' || got || '] ';
  PERFORM pg_sleep(0.02);
  SELECT string_agg(payload->>'n' || '/' || attempt, ' ') INTO got FROM idempotency.claim('winlapse', 1, '1 ms');
  out := out || '[' || got || '] ';
  PERFORM pg_sleep(0.02);
  SELECT string_agg(payload->>'n' || '/' || attempt, ' ' ORDER BY id) INTO got FROM idempotency.claim('winlapse', 2, '1 hour');
  out := out || '[' || got || '] ';
  SELECT string_agg(payload->>'n' || ':' || state || '/' || attempts, ' ' ORDER BY id) INTO got
    FROM idempotency.outbox_message WHERE topic_id = (SELECT id FROM idempotency.outbox_topic WHERE name = 'winlapse');
  RETURN out || got;
END $$;

-- the scan
BEGIN;
SELECT win_claims('win', '{1,5,20,1,100,100,1}') AS scanned \gset
SELECT win_lapse() AS scanned_lapse \gset
ROLLBACK;
-- the statement
BEGIN;
ALTER INDEX idempotency.outbox_message_ready_idx RENAME TO outbox_message_ready_idx_away;
SELECT win_claims('win', '{1,5,20,1,100,100,1}') AS statement \gset
SELECT win_lapse() AS statement_lapse \gset
ROLLBACK;
SELECT :'scanned' AS scanned;
SELECT :'scanned' = :'statement' AS same_claims;
SELECT :'scanned_lapse' AS scanned_lapse;
SELECT :'scanned_lapse' = :'statement_lapse' AS same_lapse;
-- nothing of either stays: every claim rolled back with its transaction
SELECT count(*) AS in_flight FROM idempotency.outbox_in_flight;

-- read-only: 25006, nothing claimed
BEGIN READ ONLY;
SELECT count(*) FROM idempotency.claim('win', 10);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT count(*) AS in_flight FROM idempotency.outbox_in_flight;

SELECT idempotency.drop_topic('win', force => true);
SELECT idempotency.drop_topic('winlapse', force => true);
DROP FUNCTION win_claims(text, int[]);
DROP FUNCTION win_lapse();
