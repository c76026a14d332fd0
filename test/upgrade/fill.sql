-- test/upgrade/fill.sql — run as role app on the PostgreSQL 15 cluster before
-- pg_upgrade: keys in every state, tokens, seen messages, a state machine.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;

-- the SQLSTATE a statement raises ('ok' when none); kept across the upgrade
CREATE FUNCTION t.sqlstate_of(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE sql;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE;
END $$;
CREATE TABLE t.saved (name text PRIMARY KEY, value text NOT NULL);
CREATE TABLE t.orders (id int PRIMARY KEY, status text NOT NULL, amount numeric);
INSERT INTO t.orders VALUES (1, 'pending', 10), (2, 'pending', 20);

-- completed: jsonb, an HTTP body byte for byte, a binary body, once(), a scope, NULL
BEGIN;
SELECT outcome FROM idempotency.begin('c1', '{"amount": 1, "currency": "EUR"}');
SELECT idempotency.complete('c1', '{"id": 1, "list": [1, 2.50, "x"], "nested": {"b": 1, "a": null}}');
COMMIT;
BEGIN;
SELECT outcome FROM idempotency.begin('c2', '{"amount": 2}');
SELECT idempotency.complete('c2', idempotency.http_response(201,
  E'{ "id" : 2,  "price": 1.50e0, "name": "Gr\u00fc\u00dfe \u2603" }\n',
  '{"Location": "/orders/2", "Content-Type": "application/json"}'));
COMMIT;
BEGIN;
SELECT outcome FROM idempotency.begin('c3', '{"amount": 3}');
SELECT idempotency.complete('c3', idempotency.http_response(200, '\x00ff10c3'::bytea));
COMMIT;
SELECT outcome FROM idempotency.once('c4', '{"order": 1}',
  'UPDATE t.orders SET amount = amount + $1 WHERE id = 1 RETURNING id, amount', '5');
BEGIN;
SELECT outcome FROM idempotency.begin('c5', '{"amount": 5}', scope => 'tenant-a');
SELECT idempotency.complete('c5', '"tenant a"', scope => 'tenant-a');
COMMIT;
BEGIN;
SELECT outcome FROM idempotency.begin('c6');
SELECT idempotency.complete('c6', NULL);
COMMIT;

-- failed: retryable, and for good
BEGIN;
SELECT outcome FROM idempotency.begin('f-retry', '{"amount": 7}');
SELECT idempotency.fail('f-retry', '{"error": "card declined"}', retryable => true);
COMMIT;
BEGIN;
SELECT outcome FROM idempotency.begin('f-final', '{"amount": 8}');
SELECT idempotency.fail('f-final', '{"error": "fraud"}', retryable => false);
COMMIT;

-- in progress under a lease: one that outlives the upgrade, one that lapses during it
SELECT outcome, attempts FROM idempotency.begin('l-live', '{"ship": 1}', lease => '1 hour');
SELECT outcome, attempts FROM idempotency.begin('l-short', '{"ship": 2}', lease => '2 seconds');

-- expired by the time the new cluster runs: keys, a token, a message
BEGIN;
SELECT outcome FROM idempotency.begin('e1', ttl => '1 second');
SELECT idempotency.complete('e1', '1');
SELECT outcome FROM idempotency.begin('e2', ttl => '1 second');
SELECT idempotency.fail('e2', '2', retryable => false);
SELECT outcome FROM idempotency.begin('e3', ttl => '1 second');
SELECT idempotency.complete('e3', '3');
COMMIT;
SELECT idempotency.issue_token('checkout', '1 second') IS NOT NULL AS expired_token;
SELECT idempotency.first_seen('consumer', 'm-expired', '1 second');

-- tokens: one live, one consumed
INSERT INTO t.saved VALUES ('tok-live', idempotency.issue_token('checkout', '1 hour')::text);
INSERT INTO t.saved VALUES ('tok-used', idempotency.issue_token('checkout', '1 hour')::text);
SELECT idempotency.consume_token(value::uuid, 'checkout') FROM t.saved WHERE name = 'tok-used';

-- seen messages
SELECT idempotency.first_seen('consumer', 'm1'), idempotency.first_seen('consumer', 'm2');

-- a state machine, one row moved
SELECT idempotency.create_machine('order',
  '{"pending": ["paid", "cancelled"], "paid": ["shipped"], "shipped": []}');
SELECT idempotency.transition('t.orders', 1, 'paid', 'order');
