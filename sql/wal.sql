-- wal: a replay writes nothing (no WAL, no dirtied page, no transaction id);
-- begin() of a new key writes nothing either; the work each path does.
CREATE EXTENSION pg_stat_statements;
CREATE FUNCTION stmt_wal(q text, OUT wal_records bigint, OUT wal_bytes bigint,
                         OUT dirtied bigint)
LANGUAGE plpgsql AS $$
DECLARE plan jsonb;
BEGIN
  EXECUTE 'EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) ' || q INTO plan;
  wal_records := (plan -> 0 -> 'Plan' ->> 'WAL Records')::bigint;
  wal_bytes := (plan -> 0 -> 'Plan' ->> 'WAL Bytes')::bigint;
  dirtied := (plan -> 0 -> 'Plan' ->> 'Shared Dirtied Blocks')::bigint;
END $$;

BEGIN;
SELECT outcome FROM idempotency.begin('wal-1', '{"n": 1}');
SELECT idempotency.complete('wal-1', '{"payment": 1}');
COMMIT;
SELECT outcome FROM idempotency.begin('wal-1', '{"n": 1}');	-- sets hint bits once
CHECKPOINT;

-- a replay: no WAL, no dirtied page
SELECT * FROM stmt_wal($$SELECT * FROM idempotency.begin('wal-1', '{"n": 1}')$$);
-- the check can fail: a completion does write WAL
BEGIN;
SELECT outcome FROM idempotency.begin('wal-2');
SELECT wal_records > 0 AS complete_writes_wal
  FROM stmt_wal($$SELECT idempotency.complete('wal-2', '{}')$$);
COMMIT;
-- begin() of a new key writes nothing: the row waits for complete()
BEGIN;
SELECT wal_records, wal_bytes FROM stmt_wal($$SELECT * FROM idempotency.begin('wal-3')$$);
SELECT idempotency.complete('wal-3', '{}');
COMMIT;

-- a replay takes no transaction id
BEGIN;
SELECT outcome FROM idempotency.begin('wal-1');
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
COMMIT;

-- the server's WAL insert position does not move over 200 replays
-- (background processes may write WAL too, so take the best of 3 tries)
CREATE TEMP TABLE lsn_try (moved numeric);
DO $$
DECLARE
  before pg_lsn;
BEGIN
  FOR t IN 1..3 LOOP
    before := pg_current_wal_insert_lsn();
    FOR i IN 1..200 LOOP
      PERFORM idempotency.begin('wal-1', '{"n": 1}');
    END LOOP;
    INSERT INTO lsn_try VALUES (pg_current_wal_insert_lsn() - before);
  END LOOP;
END $$;
SELECT min(moved) AS wal_bytes_for_200_replays FROM lsn_try;

-- work on the key table per request.  Lookups are direct probes of the
-- primary key (counted in pg_stat_user_indexes); a new key row goes straight
-- into the table and its indexes (counted in pg_stat_user_tables); updates
-- are SQL statements (counted by pg_stat_statements with track = all).
CREATE FUNCTION key_statements(OUT statement text, OUT calls bigint)
RETURNS SETOF record LANGUAGE sql AS $$
  SELECT split_part(ltrim(query), ' ', 1), sum(calls)::bigint
    FROM pg_stat_statements
   WHERE query LIKE '%idempotency.idempotency_key%'
     AND query NOT LIKE '%pg_stat_statements%'
     AND query NOT LIKE '%pg_stat_user_%'   -- this test's own counters (18 keeps their constants)
   GROUP BY 1 ORDER BY 1 $$;
CREATE FUNCTION pkey_probes() RETURNS bigint LANGUAGE sql AS $$
  SELECT idx_scan FROM pg_stat_user_indexes
   WHERE indexrelid = 'idempotency.idempotency_key_pkey'::regclass $$;
CREATE FUNCTION key_rows_written() RETURNS bigint LANGUAGE sql AS $$
  SELECT n_tup_ins + n_tup_upd FROM pg_stat_user_tables
   WHERE relid = 'idempotency.idempotency_key'::regclass $$;
SELECT pg_stat_statements_reset() IS NOT NULL AS reset, pg_stat_force_next_flush();
SELECT pkey_probes() AS probes, key_rows_written() AS written \gset
BEGIN;
SELECT outcome FROM idempotency.begin('stmt-1');
SELECT idempotency.complete('stmt-1', '{}');
COMMIT;
SELECT pg_stat_force_next_flush();
SELECT pkey_probes() - :probes AS first_time_probes,
       key_rows_written() - :written AS first_time_rows_written;
SELECT * FROM key_statements();	-- a first-time request
SELECT pg_stat_statements_reset() IS NOT NULL AS reset, pg_stat_force_next_flush();
SELECT pkey_probes() AS probes, key_rows_written() AS written \gset
SELECT outcome FROM idempotency.begin('stmt-1');
SELECT pg_stat_force_next_flush();
SELECT pkey_probes() - :probes AS replay_probes,
       key_rows_written() - :written AS replay_rows_written;
SELECT count(*) AS replay_statements FROM key_statements();	-- a replay
SELECT pg_stat_statements_reset() IS NOT NULL AS reset;
BEGIN;
SELECT outcome FROM idempotency.begin('stmt-2');
SELECT idempotency.fail('stmt-2', '{}');
COMMIT;
BEGIN;
SELECT outcome FROM idempotency.begin('stmt-2');
SELECT idempotency.complete('stmt-2', '{}');
COMMIT;
SELECT * FROM key_statements();	-- a failure, then its retry
DROP EXTENSION pg_stat_statements;
