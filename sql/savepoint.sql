-- savepoint: what a rolled-back subtransaction did is undone for the commit
-- check too; the key lock goes with it.
CREATE TABLE sp_effect (note text);
CREATE VIEW key_locks AS
  SELECT count(*) AS held FROM pg_locks
   WHERE locktype = 'advisory' AND objsubid = 18756 AND pid = pg_backend_pid();

-- begin() in a savepoint that rolls back: the key is no longer held
BEGIN;
SAVEPOINT a;
SELECT outcome FROM idempotency.begin('sp-1');
SELECT held FROM key_locks;
ROLLBACK TO SAVEPOINT a;
SELECT held FROM key_locks;
SELECT idempotency.complete('sp-1', '{}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- ... and COMMIT has nothing to complain about
BEGIN;
SAVEPOINT a;
SELECT outcome FROM idempotency.begin('sp-1');
ROLLBACK TO SAVEPOINT a;
INSERT INTO sp_effect VALUES ('sp-1 commit');
COMMIT;
SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'sp-1';
SELECT count(*) FROM sp_effect;

-- complete() in a savepoint that rolls back: the key is unfinished again
BEGIN;
SELECT outcome FROM idempotency.begin('sp-2');
SAVEPOINT a;
SELECT idempotency.complete('sp-2', '"in savepoint"');
ROLLBACK TO SAVEPOINT a;
INSERT INTO sp_effect VALUES ('sp-2 must not commit');
COMMIT;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'sp-2';
-- complete() again after the rollback works
BEGIN;
SELECT outcome FROM idempotency.begin('sp-2');
SAVEPOINT a;
SELECT idempotency.complete('sp-2', '"in savepoint"');
ROLLBACK TO SAVEPOINT a;
SELECT idempotency.complete('sp-2', '"after rollback"');
COMMIT;
SELECT response FROM idempotency.idempotency_key WHERE key = 'sp-2';

-- complete() in a released savepoint counts
BEGIN;
SELECT outcome FROM idempotency.begin('sp-3');
SAVEPOINT a;
SELECT idempotency.complete('sp-3', '"released"');
RELEASE SAVEPOINT a;
COMMIT;
SELECT response FROM idempotency.idempotency_key WHERE key = 'sp-3';

-- fail() rolled back, then complete(): the completion is what is stored
BEGIN;
SELECT outcome FROM idempotency.begin('sp-4');
SAVEPOINT a;
SELECT idempotency.fail('sp-4', '"oops"', retryable => false);
ROLLBACK TO SAVEPOINT a;
SELECT idempotency.complete('sp-4', '"ok"');
COMMIT;
SELECT status, response FROM idempotency.idempotency_key WHERE key = 'sp-4';

-- nested savepoints: inner released into outer, outer rolled back
BEGIN;
SAVEPOINT outer_sp;
SELECT outcome FROM idempotency.begin('sp-5');
SAVEPOINT inner_sp;
SELECT idempotency.complete('sp-5', '"nested"');
RELEASE SAVEPOINT inner_sp;
ROLLBACK TO SAVEPOINT outer_sp;
SELECT held FROM key_locks;
SELECT outcome FROM idempotency.begin('sp-5');
SELECT idempotency.complete('sp-5', '"second"');
COMMIT;
SELECT response FROM idempotency.idempotency_key WHERE key = 'sp-5';

-- a key completed in an outer level, then begun again in a rolled back
-- savepoint (replay) keeps its completed state
BEGIN;
SELECT outcome FROM idempotency.begin('sp-6');
SELECT idempotency.complete('sp-6', '"kept"');
SAVEPOINT a;
SELECT outcome FROM idempotency.begin('sp-6');
ROLLBACK TO SAVEPOINT a;
COMMIT;
SELECT response FROM idempotency.idempotency_key WHERE key = 'sp-6';

-- PL/pgSQL exception blocks are subtransactions too
CREATE FUNCTION pay_or_fail(k text, fail_it boolean) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  o text;
BEGIN
  BEGIN
    SELECT outcome INTO o FROM idempotency.begin(k);
    IF o = 'replay' THEN
      RETURN 'replayed';
    END IF;
    INSERT INTO sp_effect VALUES (k);
    IF fail_it THEN
      RAISE EXCEPTION 'gateway down';
    END IF;
    PERFORM idempotency.complete(k, '"paid"');
    RETURN o;
  EXCEPTION WHEN raise_exception THEN
    -- the begin() and the insert above are undone; record the failure
    PERFORM idempotency.begin(k);
    PERFORM idempotency.fail(k, to_jsonb(SQLERRM));
    RETURN 'failed: ' || SQLERRM;
  END;
END $$;
SELECT pay_or_fail('sp-7', true);
SELECT pay_or_fail('sp-7', false);
SELECT pay_or_fail('sp-7', false);
SELECT status, response, attempts FROM idempotency.idempotency_key WHERE key = 'sp-7';
SELECT count(*) FROM sp_effect WHERE note = 'sp-7';
