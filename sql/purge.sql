-- purge: purge() on a hash-partitioned key
-- table (the README's recipe, as in partitioned.sql).  A ctid is unique
-- only within one partition: a role's purge must delete its own expired
-- rows, never another role's row that shares a ctid in another partition.
SELECT current_database() AS regress_db \gset
CREATE DATABASE purge_partitioned;
\c purge_partitioned
CREATE EXTENSION idempotency;
CREATE ROLE regress_purge_a NOLOGIN;
CREATE ROLE regress_purge_b NOLOGIN;
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

-- one expired row of a, expired rows of b in every other partition: the
-- first row of each partition has ctid (0,1)
INSERT INTO idempotency.idempotency_key (owner, key, status, expires_at)
SELECT 'regress_purge_a', 'a-expired', 'completed', now() - interval '1 day';
INSERT INTO idempotency.idempotency_key (owner, key, status, expires_at)
SELECT 'regress_purge_b', 'b-expired-' || i, 'completed', now() - interval '1 day'
  FROM generate_series(1, 12) AS i;
SELECT count(*) > 0 AS b_shares_a_ctid
  FROM idempotency.idempotency_key AS a, idempotency.idempotency_key AS b
 WHERE a.key = 'a-expired' AND b.owner = 'regress_purge_b'::regrole
   AND b.ctid = a.ctid AND b.tableoid <> a.tableoid;

-- a purges: its one row goes, all of b's stay
SET ROLE regress_purge_a;
SELECT idempotency.purge(100) AS purged_by_a;
RESET ROLE;
SELECT owner, count(*) FROM idempotency.idempotency_key GROUP BY owner ORDER BY owner;
-- b purges its own twelve
SET ROLE regress_purge_b;
SELECT idempotency.purge(100) AS purged_by_b;
RESET ROLE;
SELECT count(*) AS left_over FROM idempotency.idempotency_key;

\c :regress_db
DROP DATABASE purge_partitioned;
DROP ROLE regress_purge_a, regress_purge_b;
