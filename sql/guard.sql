-- guard: every outcome of begin(), and what complete()/fail() store.
CREATE TABLE payment (id serial PRIMARY KEY, key text, amount numeric);

-- new: the first request does the work and stores its response
BEGIN;
SELECT outcome, status, response, attempts, created_at = now() AS created_now
  FROM idempotency.begin('pay-1', '{"amount": 10}');
INSERT INTO payment (key, amount) VALUES ('pay-1', 10);
SELECT idempotency.complete('pay-1', '{"payment_id": 1, "status": "paid"}');
COMMIT;

-- replay: a duplicate gets the same answer back and does nothing
SELECT outcome, status, response, attempts
  FROM idempotency.begin('pay-1', '{"amount": 10}');
-- the same request written differently is the same request
SELECT outcome FROM idempotency.begin('pay-1', '{ "amount" : 10.00 }');
-- a duplicate that sends no request body is not compared
SELECT outcome FROM idempotency.begin('pay-1');
SELECT count(*) AS payments FROM payment;

-- what is stored
SELECT owner, scope, key, status, response, retryable, attempts,
       request_hash = idempotency.fingerprint('{"amount": 10}') AS hash_ok,
       expires_at - created_at AS ttl, locked_until
  FROM idempotency.idempotency_key WHERE key = 'pay-1';

-- rollback: nothing was stored, so the next request is new again
BEGIN;
SELECT outcome FROM idempotency.begin('pay-2', '{"amount": 5}');
INSERT INTO payment (key, amount) VALUES ('pay-2', 5);
SELECT idempotency.complete('pay-2', '{"payment_id": 2}');
ROLLBACK;
SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'pay-2';
BEGIN;
SELECT outcome, attempts FROM idempotency.begin('pay-2', '{"amount": 5}');
SELECT idempotency.complete('pay-2', '{"payment_id": 2}');
COMMIT;

-- retryable failure: stored, and the next begin() retries
BEGIN;
SELECT outcome FROM idempotency.begin('pay-3', '{"amount": 7}');
SELECT idempotency.fail('pay-3', '{"error": "gateway timeout"}');
COMMIT;
SELECT status, response, retryable, attempts
  FROM idempotency.idempotency_key WHERE key = 'pay-3';
BEGIN;
-- retry: attempts counts up, response holds the previous error
SELECT outcome, status, response, attempts, created_at < now() AS kept_created_at
  FROM idempotency.begin('pay-3', '{"amount": 7}');
INSERT INTO payment (key, amount) VALUES ('pay-3', 7);
SELECT idempotency.complete('pay-3', '{"payment_id": 3}');
COMMIT;
SELECT outcome, status, response, attempts FROM idempotency.begin('pay-3');
SELECT status, retryable, attempts, updated_at > created_at AS updated
  FROM idempotency.idempotency_key WHERE key = 'pay-3';

-- non-retryable failure: replayed as it is
BEGIN;
SELECT outcome FROM idempotency.begin('pay-4');
SELECT idempotency.fail('pay-4', '{"error": "card declined"}', retryable => false);
COMMIT;
SELECT outcome, status, response, attempts FROM idempotency.begin('pay-4');

-- fail() with the defaults is retryable
BEGIN;
SELECT outcome FROM idempotency.begin('pay-5');
SELECT idempotency.fail('pay-5', NULL);
COMMIT;
SELECT status, response, retryable FROM idempotency.idempotency_key WHERE key = 'pay-5';

-- complete() may store a NULL response; it is replayed as NULL
BEGIN;
SELECT outcome FROM idempotency.begin('pay-6');
SELECT idempotency.complete('pay-6', NULL);
COMMIT;
SELECT outcome, status, response IS NULL AS null_response FROM idempotency.begin('pay-6');

-- scopes are separate namespaces
BEGIN;
SELECT outcome FROM idempotency.begin('pay-1', scope => 'refunds');
SELECT idempotency.complete('pay-1', '{"refund": true}', scope => 'refunds');
COMMIT;
SELECT scope, response FROM idempotency.idempotency_key WHERE key = 'pay-1' ORDER BY scope;
SELECT outcome, response FROM idempotency.begin('pay-1', scope => 'refunds');

-- inside one transaction: complete, then begin again -> replay of our own row
BEGIN;
SELECT outcome FROM idempotency.begin('pay-7');
SELECT idempotency.complete('pay-7', '"done"');
SELECT outcome, response FROM idempotency.begin('pay-7');
-- a retryable failure in the same transaction can be retried at once
SELECT outcome FROM idempotency.begin('pay-8');
SELECT idempotency.fail('pay-8', '"flaky"');
SELECT outcome, attempts FROM idempotency.begin('pay-8');
SELECT idempotency.complete('pay-8', '"second time lucky"');
COMMIT;
SELECT key, status, response, attempts FROM idempotency.idempotency_key
 WHERE key IN ('pay-7', 'pay-8') ORDER BY key;

-- expiry: an expired key behaves as absent; its row is reused
BEGIN;
SELECT outcome FROM idempotency.begin('pay-9', '{"v": 1}', ttl => '1 millisecond');
SELECT idempotency.complete('pay-9', '"old"');
COMMIT;
SELECT pg_sleep(0.01);
BEGIN;
-- a different request is fine: the old key is gone
SELECT outcome, attempts FROM idempotency.begin('pay-9', '{"v": 2}', ttl => '2 hours');
SELECT idempotency.complete('pay-9', '"new"');
COMMIT;
SELECT count(*), min(response::text) AS response, min(attempts) AS attempts,
       min(expires_at - created_at) AS ttl
  FROM idempotency.idempotency_key WHERE key = 'pay-9';

-- idempotency.default_ttl applies when begin() gets no ttl
SET idempotency.default_ttl = '1h';
BEGIN;
SELECT outcome FROM idempotency.begin('pay-10');
SELECT idempotency.complete('pay-10', '{}');
COMMIT;
RESET idempotency.default_ttl;
SELECT expires_at - created_at AS ttl FROM idempotency.idempotency_key WHERE key = 'pay-10';

-- a replay needs no transaction block; a new key does, since COMMIT checks it
SELECT outcome FROM idempotency.begin('pay-10');

-- many keys in one transaction (past the per-transaction hash threshold)
BEGIN;
SELECT count(*) FILTER (WHERE b.outcome = 'new') AS new_keys
  FROM generate_series(1, 100) AS i,
       LATERAL idempotency.begin('batch-' || i) AS b;
SELECT count(idempotency.complete('batch-' || i, pg_catalog.to_jsonb(i)))
  FROM generate_series(1, 100) AS i;
SELECT outcome, response FROM idempotency.begin('batch-42');
COMMIT;
SELECT count(*) FROM idempotency.idempotency_key WHERE key LIKE 'batch-%';

-- complete() inserts key rows directly into the table and its indexes; when
-- a DBA has added something a direct insert would not honour (a trigger, an
-- expression index), it inserts through SQL instead, and both are kept
CREATE INDEX key_lower_idx ON idempotency.idempotency_key (lower(key));
CREATE TABLE key_audit (key text);
CREATE FUNCTION audit_key() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO key_audit VALUES (NEW.key); RETURN NEW; END $$;
BEGIN;
SELECT outcome FROM idempotency.begin('Expr-Index');
SELECT idempotency.complete('Expr-Index', '"indexed"');
COMMIT;
SET enable_seqscan = off;
SELECT key, response FROM idempotency.idempotency_key WHERE lower(key) = 'expr-index';
RESET enable_seqscan;
DROP INDEX idempotency.key_lower_idx;
CREATE TRIGGER audit AFTER INSERT ON idempotency.idempotency_key
  FOR EACH ROW EXECUTE FUNCTION audit_key();
BEGIN;
SELECT outcome FROM idempotency.begin('audited');
SELECT idempotency.complete('audited', '{}');
COMMIT;
DROP TRIGGER audit ON idempotency.idempotency_key;
BEGIN;
SELECT outcome FROM idempotency.begin('not-audited');
SELECT idempotency.complete('not-audited', '{}');
COMMIT;
SELECT key FROM key_audit;
SELECT outcome, response FROM idempotency.begin('Expr-Index');
DELETE FROM idempotency.idempotency_key WHERE key IN ('Expr-Index', 'audited', 'not-audited');
