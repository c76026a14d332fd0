-- once: a guarded request in one statement.  The work runs as the caller
-- and its result is stored (new/retry) or the stored result comes back
-- without running it (replay); errors store nothing; the plan is kept.
\i sql/include/roles.sql
\set VERBOSITY default
CREATE TABLE once_payment (id bigserial PRIMARY KEY, amount numeric NOT NULL,
                      note text, paid_on date);
CREATE FUNCTION keys(OUT key text, OUT status text, OUT response jsonb)
RETURNS SETOF record LANGUAGE sql AS $$
  SELECT key, status, response FROM idempotency.idempotency_key
   WHERE key LIKE 'once-%' ORDER BY key $$;

-- new, then replay: the work does not run again
SELECT * FROM idempotency.once('once-1', '{"amount": 49.90}',
  'INSERT INTO once_payment (amount) VALUES ($1) RETURNING id, amount', 49.90);
SELECT * FROM idempotency.once('once-1', '{"amount": 49.90}',
  'INSERT INTO once_payment (amount) VALUES ($1) RETURNING id, amount', 49.90);
SELECT count(*) AS payments FROM once_payment;
SELECT * FROM keys();

-- the same key with another request: IK001, nothing runs
SELECT * FROM idempotency.once('once-1', '{"amount": 1}',
  'INSERT INTO once_payment (amount) VALUES ($1) RETURNING id', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS payments FROM once_payment;

-- string arguments take the type the statement gives them (untyped bind
-- parameters: node-postgres, psycopg strings); NULL is NULL
SELECT * FROM idempotency.once('once-2', NULL,
  'INSERT INTO once_payment (amount, note, paid_on) VALUES ($1, $2, $3)
   RETURNING amount, note, paid_on', '12.50', 'two', '2026-11-23');
SELECT * FROM idempotency.once('once-3', NULL,
  'INSERT INTO once_payment (amount, note) VALUES ($1, $2) RETURNING amount, note',
  '3', NULL);
-- typed and string arguments together (VARIADIC "any")
SELECT * FROM idempotency.once('once-4', NULL,
  'INSERT INTO once_payment (amount, note, paid_on) VALUES ($1, $2, $3)
   RETURNING amount, note, paid_on', 4::int, 'four'::text, '2026-01-04'::date);
-- an explicit array, and no arguments at all
SELECT * FROM idempotency.once('once-5', NULL,
  'SELECT $1::int + $2::int AS sum', VARIADIC ARRAY['2', '3']);
SELECT * FROM idempotency.once('once-6', NULL, 'SELECT 42 AS answer');
-- VARIADIC NULL is no arguments; a two-dimensional array is refused (2202E)
SELECT * FROM idempotency.once('once-8', NULL, 'SELECT 8 AS n', VARIADIC NULL::text[]);
SELECT * FROM idempotency.once('once-9', NULL, 'SELECT $1 AS n', VARIADIC ARRAY[['a']]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.once('once-9', NULL, 'SELECT $1 AS n', VARIADIC ARRAY[[1]]);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored FROM keys() WHERE key = 'once-9';
-- a string that is not a value of the decided type: 22P02, nothing stored
SELECT * FROM idempotency.once('once-7', NULL,
  'INSERT INTO once_payment (amount) VALUES ($1) RETURNING id', 'lots');
\echo :LAST_ERROR_SQLSTATE

-- the response: one row is an object, several an array, none null; a row
-- of one json/jsonb column is that value
SELECT response FROM idempotency.once('once-10', NULL,
  'SELECT g AS n FROM generate_series(1, 3) g');
SELECT response FROM idempotency.once('once-11', NULL,
  'UPDATE once_payment SET note = $1 WHERE false', 'x');
SELECT response FROM idempotency.once('once-12', NULL,
  'INSERT INTO once_payment (amount) VALUES ($1)', '5');
SELECT response FROM idempotency.once('once-13', NULL,
  'SELECT jsonb_build_object(''id'', 7) AS r');
SELECT response FROM idempotency.once('once-14', NULL,
  'SELECT $1::json AS r', '{"b": 1, "a": 2}');
SELECT response FROM idempotency.once('once-15', NULL,
  'SELECT NULL::jsonb AS r');
SELECT response FROM idempotency.once('once-16', NULL,
  'SELECT 1 AS a, ''x'' AS b, NULL::int AS c, ARRAY[1,2] AS d');
SELECT key, status, response FROM keys() WHERE key >= 'once-10';

-- an error in the work: the statement fails, nothing is stored, and the
-- next try is new
CREATE TABLE once_guarded (id int PRIMARY KEY);
INSERT INTO once_guarded VALUES (1);
SELECT * FROM idempotency.once('once-20', NULL,
  'INSERT INTO once_guarded VALUES ($1) RETURNING id', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored FROM keys() WHERE key = 'once-20';
SELECT * FROM idempotency.once('once-20', NULL,
  'INSERT INTO once_guarded VALUES ($1) RETURNING id', 2);

-- a retryable failure stored by fail() is retried by once()
BEGIN;
SELECT outcome FROM idempotency.begin('once-21');
SELECT idempotency.fail('once-21', '{"error": "timeout"}');
COMMIT;
SELECT * FROM idempotency.once('once-21', NULL, 'SELECT 21 AS n');
SELECT status, attempts FROM idempotency.idempotency_key WHERE key = 'once-21';

-- what the work may be: one SELECT, INSERT, UPDATE, DELETE or MERGE
SELECT count(*) AS keys_before FROM idempotency.idempotency_key \gset
SELECT * FROM idempotency.once('once-30', NULL, 'CREATE TABLE nope (a int)');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.once('once-30', NULL, 'SELECT 1 INTO nope');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.once('once-30', NULL, 'COMMIT');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.once('once-30', NULL, 'SELECT 1; SELECT 2');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.once('once-30', NULL, '');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.once('once-30', NULL, 'SELEKT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.once('once-30', NULL, 'SELECT $2::int', '1');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.once('once-30', NULL, NULL);
\echo :LAST_ERROR_SQLSTATE
-- the key is checked first, like begin()
SELECT * FROM idempotency.once('', NULL, 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.once(NULL, NULL, 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) - :keys_before AS keys_written FROM idempotency.idempotency_key;
SELECT count(*) AS nope_tables FROM pg_class WHERE relname = 'nope';
-- MERGE is DML too
CREATE TABLE once_stock (item int PRIMARY KEY, qty int NOT NULL);
SELECT * FROM idempotency.once('once-31', NULL,
  'MERGE INTO once_stock s USING (SELECT $1::int AS item) v ON s.item = v.item
   WHEN MATCHED THEN UPDATE SET qty = s.qty + 1
   WHEN NOT MATCHED THEN INSERT VALUES (v.item, 1)', '9');
SELECT * FROM once_stock;

-- the work runs as the caller: its privileges ...
CREATE TABLE once_secret (id int, owner text DEFAULT current_user);
SET ROLE regress_alice;
SELECT * FROM idempotency.once('once-40', NULL,
  'INSERT INTO once_secret (id) VALUES ($1) RETURNING id', '1');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS alice_keys FROM idempotency.idempotency_key WHERE key = 'once-40';
RESET ROLE;
GRANT SELECT, INSERT ON once_secret TO regress_alice, regress_bob;
SET ROLE regress_alice;
SELECT * FROM idempotency.once('once-40', NULL,
  'INSERT INTO once_secret (id) VALUES ($1) RETURNING id, owner', '1');
-- ... its row-level security ...
RESET ROLE;
INSERT INTO once_secret VALUES (2, 'regress_bob'), (3, 'regress_bob');
ALTER TABLE once_secret ENABLE ROW LEVEL SECURITY;
CREATE POLICY own ON once_secret USING (owner = current_user);
SET ROLE regress_alice;
SELECT * FROM idempotency.once('once-41', NULL, 'SELECT count(*) AS visible FROM once_secret');
SET ROLE regress_bob;
SELECT * FROM idempotency.once('once-41', NULL, 'SELECT count(*) AS visible FROM once_secret');
-- (the same key, the same plan, another role: another key and other rows)
RESET ROLE;
-- ... and its search_path
CREATE SCHEMA once_a;
CREATE SCHEMA once_b;
CREATE TABLE once_a.t (v text);
CREATE TABLE once_b.t (v text);
INSERT INTO once_a.t VALUES ('a');
INSERT INTO once_b.t VALUES ('b');
SET search_path = once_a, public;
SELECT response FROM idempotency.once('once-42', NULL, 'SELECT v FROM t');
SET search_path = once_b, public;
SELECT response FROM idempotency.once('once-43', NULL, 'SELECT v FROM t');
RESET search_path;

-- inside an explicit transaction: key and work commit or vanish together
BEGIN;
SELECT outcome FROM idempotency.once('once-50', NULL,
  'INSERT INTO once_payment (amount, note) VALUES ($1, $2) RETURNING note', '50', 'tx');
SELECT outcome FROM idempotency.once('once-50', NULL,
  'INSERT INTO once_payment (amount, note) VALUES ($1, $2) RETURNING note', '50', 'tx');
ROLLBACK;
SELECT count(*) AS rows_after_rollback FROM once_payment WHERE note = 'tx';
SELECT count(*) AS keys_after_rollback FROM keys() WHERE key = 'once-50';
-- in a savepoint that rolls back
BEGIN;
SAVEPOINT s;
SELECT outcome FROM idempotency.once('once-51', NULL, 'SELECT 1 AS n');
ROLLBACK TO s;
SELECT outcome FROM idempotency.once('once-51', NULL, 'SELECT 2 AS n');
COMMIT;
SELECT response FROM keys() WHERE key = 'once-51';
-- begun by begin() in this transaction: once() sees it is in progress
BEGIN;
SELECT outcome FROM idempotency.begin('once-52');
SELECT * FROM idempotency.once('once-52', NULL, 'SELECT 1 AS n');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- in a read-only transaction: a replay works, new work is refused (25006)
BEGIN READ ONLY;
SELECT outcome FROM idempotency.once('once-1', '{"amount": 49.90}',
  'INSERT INTO once_payment (amount) VALUES ($1) RETURNING id, amount', 49.90);
SELECT outcome FROM idempotency.once('once-53', NULL,
  'INSERT INTO once_payment (amount) VALUES ($1) RETURNING id', '53');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT count(*) AS stored FROM keys() WHERE key = 'once-53';

-- from a function and from a procedure
CREATE FUNCTION once_pay(k text, amount numeric) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  RETURN (SELECT response FROM idempotency.once(k, jsonb_build_object('amount', amount),
          'INSERT INTO once_payment (amount, note) VALUES ($1, $2) RETURNING amount, note',
          amount, 'fn'::text));
END $$;
SELECT once_pay('once-60', 60), once_pay('once-60', 60);
CREATE PROCEDURE once_pay_proc(k text, amount numeric, INOUT outcome text DEFAULT NULL)
LANGUAGE plpgsql AS $$
BEGIN
  SELECT o.outcome INTO outcome FROM idempotency.once(k, NULL,
    'INSERT INTO once_payment (amount, note) VALUES ($1, $2) RETURNING id',
    amount, 'proc'::text) o;
  COMMIT;
END $$;
CALL once_pay_proc('once-61', 61);
CALL once_pay_proc('once-61', 61);
SELECT note, count(*) FROM once_payment WHERE note IN ('fn', 'proc') GROUP BY note ORDER BY note;

-- the plan is prepared once per (statement, argument types) and kept
CREATE FUNCTION once_plans(q text) RETURNS bigint LANGUAGE sql AS $$
  SELECT count(*) FROM pg_backend_memory_contexts
   WHERE name = 'CachedPlanSource' AND ident = q $$;
SELECT count(*) FROM (SELECT idempotency.once('once-70-' || i, NULL,
  'SELECT $1::int * 2 AS twice', i::text) FROM generate_series(1, 5) i) s;
SELECT once_plans('SELECT $1::int * 2 AS twice') AS plans_for_text_args;
SELECT count(*) FROM (SELECT idempotency.once('once-71-' || i, NULL,
  'SELECT $1::int * 2 AS twice', i) FROM generate_series(1, 5) i) s;
SELECT once_plans('SELECT $1::int * 2 AS twice') AS plans_with_int_args_too;
-- the cache is bounded: 70 statements keep at most 64 plans, the oldest go
SELECT count(*) FROM (SELECT idempotency.once('once-72-' || i, NULL,
  'SELECT ' || i || ' AS n') FROM generate_series(1, 70) i) s;
SELECT count(*) AS kept_plans FROM pg_backend_memory_contexts
 WHERE name = 'CachedPlanSource' AND ident ~ '^SELECT \d+ AS n$';
SELECT once_plans('SELECT 1 AS n') AS oldest_evicted, once_plans('SELECT 70 AS n') AS newest_kept;
-- a work statement that calls once() with 70 other statements: the cache
-- evicts others, never the plan that is running
CREATE FUNCTION once_many() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..70 LOOP
    PERFORM idempotency.once('once-75-' || i, NULL, 'SELECT ' || i || ' AS inner_n');
  END LOOP;
  RETURN 70;
END $$;
SELECT * FROM idempotency.once('once-75', NULL, 'SELECT once_many() AS n');
SELECT once_plans('SELECT once_many() AS n') AS outer_plan_kept;
SELECT count(*) AS inner_keys FROM keys() WHERE key LIKE 'once-75-%';
-- a kept plan follows the table: the column changes type, the string
-- argument now converts to the new type
CREATE TABLE once_item (id int, size numeric);
SELECT response FROM idempotency.once('once-73', NULL,
  'INSERT INTO once_item VALUES (1, $1) RETURNING size', '1.5');
ALTER TABLE once_item ALTER size TYPE text;
SELECT response FROM idempotency.once('once-74', NULL,
  'INSERT INTO once_item VALUES (1, $1) RETURNING size', 'large');
SELECT once_plans('INSERT INTO once_item VALUES (1, $1) RETURNING size') AS plans;

-- a replay writes nothing: no WAL, no transaction id
CREATE FUNCTION once_stmt_wal(q text, OUT wal_records bigint, OUT wal_bytes bigint)
LANGUAGE plpgsql AS $$
DECLARE plan jsonb;
BEGIN
  EXECUTE 'EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) ' || q INTO plan;
  wal_records := (plan -> 0 -> 'Plan' ->> 'WAL Records')::bigint;
  wal_bytes := (plan -> 0 -> 'Plan' ->> 'WAL Bytes')::bigint;
END $$;
SELECT outcome FROM idempotency.once('once-80', NULL,
  'INSERT INTO once_payment (amount) VALUES ($1) RETURNING id', '80');
SELECT outcome FROM idempotency.once('once-80', NULL,
  'INSERT INTO once_payment (amount) VALUES ($1) RETURNING id', '80');  -- hint bits
CHECKPOINT;
SELECT * FROM once_stmt_wal($$SELECT * FROM idempotency.once('once-80', NULL,
  'INSERT INTO once_payment (amount) VALUES ($1) RETURNING id', '80')$$);
-- the check can fail: a new key writes
SELECT wal_records > 0 AS new_key_writes_wal FROM once_stmt_wal($$SELECT * FROM idempotency.once('once-81', NULL,
  'INSERT INTO once_payment (amount) VALUES ($1) RETURNING id', '81')$$);
BEGIN;
SELECT outcome FROM idempotency.once('once-80', NULL,
  'INSERT INTO once_payment (amount) VALUES ($1) RETURNING id', '80');
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
COMMIT;
CREATE TEMP TABLE lsn_try (moved numeric);
DO $$
DECLARE
  before pg_lsn;
BEGIN
  FOR t IN 1..3 LOOP
    before := pg_current_wal_insert_lsn();
    FOR i IN 1..200 LOOP
      PERFORM idempotency.once('once-80', NULL,
        'INSERT INTO once_payment (amount) VALUES ($1) RETURNING id', '80');
    END LOOP;
    INSERT INTO lsn_try VALUES (pg_current_wal_insert_lsn() - before);
  END LOOP;
END $$;
SELECT min(moved) AS wal_bytes_for_200_replays FROM lsn_try;
SELECT count(*) AS payments_80 FROM once_payment WHERE amount = 80;
