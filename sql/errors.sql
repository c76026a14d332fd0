-- errors: every error path with its SQLSTATE, and proof nothing was written.
\set VERBOSITY default
CREATE TABLE effect (note text);
CREATE FUNCTION key_rows() RETURNS bigint LANGUAGE sql
  AS 'SELECT count(*) FROM idempotency.idempotency_key';
SELECT key_rows() AS rows_before \gset

-- IK003: NULL, empty and too long keys; NULL and too long scopes
SELECT * FROM idempotency.begin(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.begin('');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.begin(repeat('k', 256));
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.begin('k', scope => NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.begin('k', scope => repeat('s', 256));
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.complete(NULL, '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.fail('', '{}');
\echo :LAST_ERROR_SQLSTATE
-- 255 characters is fine, counted in characters, not bytes
BEGIN;
SELECT outcome FROM idempotency.begin(repeat('k', 255));
SELECT outcome FROM idempotency.begin(repeat('é', 255));
ROLLBACK;
-- the limit is a setting
SET idempotency.max_key_length = 8;
SELECT * FROM idempotency.begin('123456789');
\echo :LAST_ERROR_SQLSTATE
-- and key + scope are capped in bytes, whatever the setting
SET idempotency.max_key_length = 1024;
SELECT * FROM idempotency.begin(repeat('€', 700));
\echo :LAST_ERROR_SQLSTATE
RESET idempotency.max_key_length;
SELECT key_rows() = :rows_before AS key_rows_unchanged;

-- IK004: complete()/fail() of a key this transaction does not hold
SELECT idempotency.complete('never-begun', '{}');
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SELECT outcome FROM idempotency.begin('once');
SELECT idempotency.complete('once', '{}');
SELECT idempotency.complete('once', '{}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN;
SELECT outcome FROM idempotency.begin('once');
SELECT idempotency.complete('once', '{}', scope => 'other-scope');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN;
SELECT outcome FROM idempotency.begin('once');
SELECT idempotency.fail('once', '{}');
SELECT idempotency.fail('once', '{}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- IK001: a key reused with a different request, and nothing was written
BEGIN;
SELECT outcome FROM idempotency.begin('order-1', '{"sku": "A", "qty": 1}');
SELECT idempotency.complete('order-1', '{"order": 1}');
COMMIT;
SELECT key_rows() AS rows_before \gset
BEGIN;
INSERT INTO effect VALUES ('before IK001');
SELECT * FROM idempotency.begin('order-1', '{"sku": "A", "qty": 2}');
\echo :LAST_ERROR_SQLSTATE
COMMIT;
SELECT count(*) AS effects, key_rows() = :rows_before AS key_rows_unchanged FROM effect;
-- also on retry of a failed key
BEGIN;
SELECT outcome FROM idempotency.begin('order-2', '{"sku": "B"}');
SELECT idempotency.fail('order-2', '{"error": "timeout"}');
COMMIT;
SELECT * FROM idempotency.begin('order-2', '{"sku": "C"}');
\echo :LAST_ERROR_SQLSTATE
SELECT status, attempts FROM idempotency.idempotency_key WHERE key = 'order-2';

-- IK002 within one transaction: begin() twice without finishing
BEGIN;
SELECT outcome FROM idempotency.begin('twice');
SELECT * FROM idempotency.begin('twice');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- 2D000: COMMIT with a begun but unfinished key fails and stores nothing
BEGIN;
SELECT outcome FROM idempotency.begin('unfinished');
INSERT INTO effect VALUES ('must not commit');
COMMIT;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS effects FROM effect;
SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'unfinished';
-- the error names the first unfinished key and counts them
BEGIN;
SELECT count(*) FROM generate_series(1, 40) i, idempotency.begin('open-' || i);
SELECT count(idempotency.complete('open-' || i, '{}')) FROM generate_series(1, 37) i;
COMMIT;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idempotency.idempotency_key WHERE key LIKE 'open-%';
-- also in autocommit: a lone begin() of a new key cannot commit
SELECT outcome FROM idempotency.begin('autocommit');
\echo :LAST_ERROR_SQLSTATE
-- and PREPARE TRANSACTION is refused the same way
BEGIN;
SELECT outcome FROM idempotency.begin('prepared');
PREPARE TRANSACTION 'idem_regress';
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM pg_prepared_xacts;
-- a finished key can be prepared and committed
BEGIN;
SELECT outcome FROM idempotency.begin('prepared');
SELECT idempotency.complete('prepared', '"2pc"');
PREPARE TRANSACTION 'idem_regress';
COMMIT PREPARED 'idem_regress';
SELECT outcome, response FROM idempotency.begin('prepared');

-- a finished key is checked as a new one is: a lower max_key_length
-- refuses its replay (IK003), a bad ttl too (22023), another request is
-- IK001; a key longer in bytes than the default limit, not in
-- characters, replays
BEGIN;
SELECT outcome FROM idempotency.begin('ten-chars!', '{"a": 1}');
SELECT idempotency.complete('ten-chars!', '{"n": 1}');
SELECT outcome FROM idempotency.begin(repeat('é', 200));
SELECT idempotency.complete(repeat('é', 200), '{"n": 2}');
COMMIT;
SET idempotency.max_key_length = 8;
SELECT * FROM idempotency.begin('ten-chars!');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.lookup('ten-chars!');
\echo :LAST_ERROR_SQLSTATE
RESET idempotency.max_key_length;
SELECT * FROM idempotency.begin('ten-chars!', ttl => '0 seconds');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.begin('ten-chars!', '{"a": 2}');
\echo :LAST_ERROR_SQLSTATE
SELECT outcome, response FROM idempotency.begin('ten-chars!');
SELECT outcome, response FROM idempotency.begin('ten-chars!', '{"a": 1}');
SELECT outcome, response FROM idempotency.begin('ten-chars!', '{"a": 1}', ttl => '1 hour');
SELECT outcome, response FROM idempotency.begin(repeat('é', 200));
SELECT status FROM idempotency.lookup(repeat('é', 200));
SELECT idempotency.forget(repeat('é', 200));
-- and a lease completed from another transaction (the lease holder's check)
SELECT outcome FROM idempotency.begin('leased-key', lease => '1 minute');
SET idempotency.max_key_length = 8;
SELECT idempotency.complete('leased-key', '{}', attempt => 1);
\echo :LAST_ERROR_SQLSTATE
RESET idempotency.max_key_length;
SELECT idempotency.complete('leased-key', '{}', attempt => 1);
SELECT outcome FROM idempotency.begin('leased-key');
SELECT idempotency.forget('leased-key');

-- wrong types and bad arguments
SELECT * FROM idempotency.begin(42);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.begin('k', 'not json');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.begin('k', ttl => 'soon');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.begin('k', ttl => '0 seconds');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.begin('k', ttl => '-1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.begin('k', lease => '0 seconds');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.begin('k', lease => '-5 minutes');
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SELECT outcome FROM idempotency.begin('k');
SELECT idempotency.fail('k', '{}', retryable => NULL);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SET idempotency.lock_wait = -1;
\echo :LAST_ERROR_SQLSTATE
SET idempotency.max_key_length = 0;
\echo :LAST_ERROR_SQLSTATE

-- after all of the above, only the keys that were meant to be stored are
SELECT key, status FROM idempotency.idempotency_key
 WHERE key NOT LIKE 'pay-%' AND key NOT LIKE 'batch-%' ORDER BY key;
SELECT count(*) AS effects FROM effect;
