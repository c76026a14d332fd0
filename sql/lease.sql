-- lease: begin(..., lease) commits an in_progress row held until
-- locked_until; duplicates inside the lease get IK002; after it the next
-- begin() takes over (retry, attempts + 1); the worker that was taken over
-- can no longer complete or fail (IK004).  Messages naming lease end times
-- are shown terse; the isolation spec lease.spec shows the rest.
\i sql/include/roles.sql
CREATE TABLE shipment (key text, carrier_ref text);

-- begin with a lease commits the in_progress row at once (autocommit here)
SELECT outcome, status, response, attempts FROM idempotency.begin('ship-1', lease => '1 hour');
SELECT status, attempts, locked_until > now() + '59 minutes' AS leased_for_an_hour,
       locked_until <= expires_at AS expiry_covers_lease, retryable, response
  FROM idempotency.idempotency_key WHERE key = 'ship-1';

-- a duplicate inside the lease: IK002 at once
\set VERBOSITY terse
SELECT * FROM idempotency.begin('ship-1', lease => '1 hour');
\echo :LAST_ERROR_SQLSTATE
-- also without a lease
BEGIN;
SELECT * FROM idempotency.begin('ship-1');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
\set VERBOSITY default

-- the holder completes in a later transaction, proving itself by attempt
INSERT INTO shipment VALUES ('ship-1', 'DHL-123');
SELECT idempotency.complete('ship-1', '{"carrier_ref": "DHL-123"}', attempt => 1);
SELECT status, response, attempts, locked_until FROM idempotency.idempotency_key WHERE key = 'ship-1';
SELECT outcome, status, response FROM idempotency.begin('ship-1', lease => '1 hour');
-- complete() without attempt, or with a wrong one, from another transaction
SELECT idempotency.complete('ship-1', '"again"');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.complete('ship-1', '"again"', attempt => 1);
\echo :LAST_ERROR_SQLSTATE

-- lease expiry and takeover: attempt 1 stalls, attempt 2 takes over
SELECT outcome, attempts FROM idempotency.begin('ship-2', '{"to": "Berlin"}', lease => '50 milliseconds');
SELECT pg_sleep(0.1);
SELECT outcome, status, attempts FROM idempotency.begin('ship-2', '{"to": "Berlin"}', lease => '1 hour');
-- the zombie (attempt 1) comes back: it may neither complete nor fail
SELECT idempotency.complete('ship-2', '"zombie result"', attempt => 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.fail('ship-2', '"zombie error"', attempt => 1);
\echo :LAST_ERROR_SQLSTATE
-- an attempt that never existed
SELECT idempotency.complete('ship-2', '"made up"', attempt => 7);
\echo :LAST_ERROR_SQLSTATE
-- the new holder's result stands
SELECT idempotency.complete('ship-2', '"attempt 2 result"', attempt => 2);
SELECT outcome, response, attempts FROM idempotency.begin('ship-2');
-- the fingerprint still guards a takeover
SELECT outcome FROM idempotency.begin('ship-3', '{"to": "Paris"}', lease => '50 milliseconds');
SELECT pg_sleep(0.1);
SELECT * FROM idempotency.begin('ship-3', '{"to": "Rome"}', lease => '1 hour');
\echo :LAST_ERROR_SQLSTATE

-- a lapsed lease that nobody took over: the late holder may still finish
SELECT outcome FROM idempotency.begin('ship-4', lease => '50 milliseconds');
SELECT pg_sleep(0.1);
SELECT idempotency.fail('ship-4', '{"error": "carrier down"}', attempt => 1);
SELECT status, retryable, attempts FROM idempotency.idempotency_key WHERE key = 'ship-4';
-- a retryable failure is retried under a new lease
SELECT outcome, response, attempts FROM idempotency.begin('ship-4', lease => '1 hour');
SELECT idempotency.fail('ship-4', '{"error": "address invalid"}', retryable => false, attempt => 2);
SELECT outcome, status, response FROM idempotency.begin('ship-4', lease => '1 hour');

-- begin(lease) and complete() in one transaction: no attempt needed, and
-- COMMIT does not ask for complete() (the lease row is the point)
BEGIN;
SELECT outcome FROM idempotency.begin('ship-5', lease => '1 hour');
SELECT idempotency.complete('ship-5', '"same transaction"');
COMMIT;
BEGIN;
SELECT outcome FROM idempotency.begin('ship-6', lease => '1 hour');
COMMIT;
SELECT key, status, response, attempts FROM idempotency.idempotency_key
 WHERE key IN ('ship-5', 'ship-6') ORDER BY key;
-- in the same transaction a wrong attempt is refused too
BEGIN;
SELECT outcome FROM idempotency.begin('ship-7', lease => '1 hour');
SELECT idempotency.complete('ship-7', '{}', attempt => 3);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- a lease begun in a transaction that rolls back leaves nothing
SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'ship-7';

-- another role cannot complete a lease, whatever attempt it names
SELECT outcome FROM idempotency.begin('ship-8', lease => '1 hour');
SET ROLE regress_bob;
SELECT idempotency.complete('ship-8', '"bob"', attempt => 1);
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT status, response FROM idempotency.idempotency_key WHERE key = 'ship-8';
