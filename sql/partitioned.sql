-- partitioned: the key table hash-partitioned by a DBA, with the recipe
-- the README gives ("Partitioning the key table").  begin, complete,
-- replay, retry, leases, purge and the updates to 0.4.0 and 0.5.0 work on it.
-- 0.3.0 crashed the server on the first begin().

-- a key stored before the conversion
BEGIN;
SELECT outcome FROM idempotency.begin('part-before');
SELECT idempotency.complete('part-before', '"kept"');
COMMIT;

-- the recipe (README), in one transaction
BEGIN;
LOCK TABLE idempotency.idempotency_key IN ACCESS EXCLUSIVE MODE;
ALTER TABLE idempotency.idempotency_key RENAME TO idempotency_key_unpartitioned;
ALTER EXTENSION idempotency DROP TABLE idempotency.idempotency_key_unpartitioned;
CREATE TABLE idempotency.idempotency_key
  (LIKE idempotency.idempotency_key_unpartitioned INCLUDING ALL)
  PARTITION BY HASH (key);
CREATE TABLE idempotency.idempotency_key_p0 PARTITION OF idempotency.idempotency_key
  FOR VALUES WITH (MODULUS 4, REMAINDER 0);
CREATE TABLE idempotency.idempotency_key_p1 PARTITION OF idempotency.idempotency_key
  FOR VALUES WITH (MODULUS 4, REMAINDER 1);
CREATE TABLE idempotency.idempotency_key_p2 PARTITION OF idempotency.idempotency_key
  FOR VALUES WITH (MODULUS 4, REMAINDER 2);
CREATE TABLE idempotency.idempotency_key_p3 PARTITION OF idempotency.idempotency_key
  FOR VALUES WITH (MODULUS 4, REMAINDER 3);
INSERT INTO idempotency.idempotency_key
  SELECT * FROM idempotency.idempotency_key_unpartitioned;
DROP TABLE idempotency.idempotency_key_unpartitioned;
ALTER INDEX idempotency.idempotency_key_pkey1 RENAME TO idempotency_key_pkey;
ALTER INDEX idempotency.idempotency_key_expires_at_idx1 RENAME TO idempotency_key_expires_at_idx;
ALTER EXTENSION idempotency ADD TABLE idempotency.idempotency_key;
ALTER TABLE idempotency.idempotency_key ENABLE ROW LEVEL SECURITY;
CREATE POLICY idempotency_key_own_rows ON idempotency.idempotency_key FOR SELECT
  USING (owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER)));
REVOKE ALL ON idempotency.idempotency_key FROM PUBLIC;
GRANT SELECT ON idempotency.idempotency_key TO PUBLIC;
COMMIT;
SELECT relkind FROM pg_class WHERE oid = 'idempotency.idempotency_key'::regclass;

-- the key stored before replays; new keys go to their partitions
SELECT outcome, response FROM idempotency.begin('part-before');
BEGIN;
SELECT outcome FROM idempotency.begin('part-1', '{"n": 1}');
SELECT idempotency.complete('part-1', '"one"');
COMMIT;
SELECT outcome, response FROM idempotency.begin('part-1', '{"n": 1}');
SELECT * FROM idempotency.begin('part-1', '{"n": 2}');
\echo :LAST_ERROR_SQLSTATE
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT outcome, response FROM idempotency.begin('part-1');
COMMIT;
-- retry after a retryable failure (an UPDATE routed to the partition)
BEGIN;
SELECT outcome FROM idempotency.begin('part-2');
SELECT idempotency.fail('part-2', '"try again"');
COMMIT;
BEGIN;
SELECT outcome, attempts FROM idempotency.begin('part-2');
SELECT idempotency.complete('part-2', '"second time"');
COMMIT;
-- a lease begun and completed in separate transactions
SELECT outcome FROM idempotency.begin('part-lease', lease => '1 hour');
\set VERBOSITY terse
SELECT * FROM idempotency.begin('part-lease');
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.complete('part-lease', '"leased"', attempt => 1);
SELECT outcome, response FROM idempotency.begin('part-lease');
-- the commit check still holds
BEGIN;
SELECT outcome FROM idempotency.begin('part-unfinished');
COMMIT;
-- purge finds expired keys in every partition
BEGIN;
SELECT outcome FROM idempotency.begin('part-short', ttl => '1 millisecond');
SELECT idempotency.complete('part-short', '"short"');
COMMIT;
SELECT pg_sleep(0.01);
SELECT idempotency.purge();
SELECT key, status, response, attempts FROM idempotency.idempotency_key
 WHERE key LIKE 'part-%' ORDER BY key;
SELECT count(DISTINCT tableoid) > 1 AS spread_over_partitions FROM idempotency.idempotency_key
 WHERE key LIKE 'part-%';

-- the update from 0.3.0 on a partitioned key table, with keys in use
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency VERSION '0.3.0';
BEGIN;
SELECT outcome FROM idempotency.begin('on-0.3.0');
SELECT idempotency.complete('on-0.3.0', '"from 0.3.0"');
COMMIT;
BEGIN;
ALTER TABLE idempotency.idempotency_key RENAME TO idempotency_key_unpartitioned;
ALTER EXTENSION idempotency DROP TABLE idempotency.idempotency_key_unpartitioned;
CREATE TABLE idempotency.idempotency_key
  (LIKE idempotency.idempotency_key_unpartitioned INCLUDING ALL)
  PARTITION BY HASH (key);
CREATE TABLE idempotency.idempotency_key_p0 PARTITION OF idempotency.idempotency_key
  FOR VALUES WITH (MODULUS 2, REMAINDER 0);
CREATE TABLE idempotency.idempotency_key_p1 PARTITION OF idempotency.idempotency_key
  FOR VALUES WITH (MODULUS 2, REMAINDER 1);
INSERT INTO idempotency.idempotency_key
  SELECT * FROM idempotency.idempotency_key_unpartitioned;
DROP TABLE idempotency.idempotency_key_unpartitioned;
ALTER EXTENSION idempotency ADD TABLE idempotency.idempotency_key;
COMMIT;
ALTER EXTENSION idempotency UPDATE TO '0.4.0';
SELECT outcome, response FROM idempotency.begin('on-0.3.0');
BEGIN;
SELECT outcome FROM idempotency.begin('on-0.4.0');
SELECT idempotency.complete('on-0.4.0', '"from 0.4.0"');
COMMIT;
ALTER EXTENSION idempotency UPDATE TO '0.5.0';
SELECT outcome, response FROM idempotency.begin('on-0.4.0');
BEGIN;
SELECT outcome FROM idempotency.begin('on-0.5.0');
SELECT idempotency.complete('on-0.5.0', '"from 0.5.0"');
COMMIT;
SELECT key, response FROM idempotency.idempotency_key ORDER BY key;

-- leave a fresh newest version for the files after this one
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
