-- once_evict: once() keeps at most 64 plans;
-- an evicted plan's input functions for domain, array and record arguments
-- keep state (a domain's constraint reference and ExprContext, an array's
-- and a record's I/O cache) in the memory they were set up in.  Each plan
-- has its own memory context, deleted with the plan: many evictions leave
-- the backend's memory flat.
CREATE DOMAIN review_amount AS numeric CHECK (VALUE > 0);
CREATE TYPE review_pair AS (a int, b text);
CREATE FUNCTION review_evict(first int, last int) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  n bigint := 0;
BEGIN
  FOR i IN first .. last LOOP
    -- a new statement text each time: every call past the 64th evicts a plan
    PERFORM idempotency.once('review-evict-' || i, NULL,
      'SELECT $1::review_amount AS amount, $2::int[] AS ids, $3::review_pair AS pair, ' || i || ' AS i',
      '12.50', '{1,2,3}', '(1,x)');
    n := n + 1;
  END LOOP;
  RETURN n;
END $$;
CREATE FUNCTION review_backend_bytes() RETURNS bigint LANGUAGE sql AS
  $$ SELECT sum(total_bytes)::bigint FROM pg_backend_memory_contexts $$;
-- the arguments are converted (a domain violation is the domain's error)
SELECT response FROM idempotency.once('review-evict-check', NULL,
  'SELECT $1::review_amount AS amount, $2::int[] AS ids, $3::review_pair AS pair',
  '12.50', '{1,2,3}', '(1,x)');
SELECT response FROM idempotency.once('review-evict-bad', NULL,
  'SELECT $1::review_amount AS amount', '-1');
\echo :LAST_ERROR_SQLSTATE
-- fill the cache, then measure 2000 evictions
SELECT review_evict(1, 200) AS calls;
SELECT review_backend_bytes() AS before \gset
SELECT review_evict(201, 2200) AS calls;
SELECT review_backend_bytes() - :before AS growth \gset
SELECT :growth < 1024 * 1024 AS memory_flat;
SELECT 'grew by ' || pg_size_pretty(:growth::bigint) AS growth_if_not_flat
 WHERE :growth >= 1024 * 1024;
-- the plans are counted in their own contexts, at most 64 of them
SELECT count(*) BETWEEN 1 AND 64 AS plan_contexts_bounded
  FROM pg_backend_memory_contexts WHERE name = 'idempotency once() plan';
DROP FUNCTION review_evict(int, int);
DROP FUNCTION review_backend_bytes();
DELETE FROM idempotency.idempotency_key WHERE key LIKE 'review-evict-%';
DROP TYPE review_pair;
DROP DOMAIN review_amount;
