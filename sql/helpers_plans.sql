-- helpers_plans: the helpers' plan cache is bounded.  10,000 distinct sets
-- of `changes` columns (one pair of plans each, all sets of the same size so
-- that every plan is as big as another) leave the backend's memory where 300
-- sets left it: at most 256 pairs are kept, the least recently used are
-- freed.  Tolerance: 1 MB (the 0.3.0 cache grew by about 1 GB here).

CREATE TABLE wide (id int PRIMARY KEY, version bigint NOT NULL DEFAULT 1,
  c0 int, c1 int, c2 int, c3 int, c4 int, c5 int, c6 int, c7 int,
  c8 int, c9 int, c10 int, c11 int, c12 int, c13 int, c14 int, c15 int);
INSERT INTO wide (id) VALUES (1);
-- update_versioned with n distinct sets of 8 of the 16 columns, from the
-- skip-th set on
CREATE FUNCTION churn(skip int, n int) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v bigint;
  i int;
BEGIN
  FOR i IN SELECT g FROM generate_series(0, 65535) g
            WHERE bit_count(g::bit(16)) = 8 ORDER BY g OFFSET skip LIMIT n LOOP
    SELECT idempotency.update_versioned('wide', 1, w.version,
             (SELECT jsonb_object_agg('c' || b, i) FROM generate_series(0, 15) b
               WHERE i & (1 << b) <> 0))
      INTO v FROM wide w WHERE w.id = 1;
  END LOOP;
  RETURN v;
END $$;
CREATE FUNCTION backend_bytes() RETURNS bigint LANGUAGE sql AS
  $$ SELECT sum(total_bytes)::bigint FROM pg_backend_memory_contexts $$;

-- the same column set again and again is one kept pair, prepared once: the
-- kept statements are the CachedPlanSource contexts named by their text
SELECT churn(0, 1) AS version;
SELECT idempotency.update_versioned('wide', 1, g + 1, '{"c0": 1}') FROM generate_series(1, 50) g \g /dev/null
SELECT count(*) AS kept_statements_for_c0
  FROM pg_backend_memory_contexts
 WHERE name = 'CachedPlanSource' AND ident LIKE '% public.wide AS t %r.c0, t.version%';
SELECT churn(1, 299) AS version;
SELECT backend_bytes() AS before \gset
SELECT churn(300, 10000) AS version;
SELECT backend_bytes() - :before AS growth \gset
SELECT :growth < 1024 * 1024 AS memory_flat;
SELECT 'grew by ' || pg_size_pretty(:growth::bigint) AS growth_if_not_flat
 WHERE :growth >= 1024 * 1024;
-- every call did its update
SELECT version FROM wide;

DROP FUNCTION churn(int, int);
DROP TABLE wide;

-- a plan that turns stale while it runs: a trigger invalidates the outer
-- call's plans (GRANT changes the table's relcache entry) and calls the
-- helper again with the same columns.  The nested call prepares new plans;
-- the old ones are freed after the outer call, never leaked or freed under
-- it.  Memory stays flat over 300 rounds (tolerance 256 kB).
CREATE TABLE nest (id int PRIMARY KEY, version bigint NOT NULL DEFAULT 1, note text);
INSERT INTO nest (id) VALUES (1), (2);
CREATE FUNCTION nest_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.id = 1 THEN
    GRANT SELECT ON nest TO PUBLIC;
    PERFORM idempotency.update_versioned('nest', 2, v.version, jsonb_build_object('note', NEW.note))
       FROM nest v WHERE v.id = 2;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER touch AFTER UPDATE ON nest FOR EACH ROW EXECUTE FUNCTION nest_touch();
CREATE FUNCTION nest_rounds(n int) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v bigint;
BEGIN
  FOR i IN 1 .. n LOOP
    SELECT idempotency.update_versioned('nest', 1, w.version, jsonb_build_object('note', 'round ' || i))
      INTO v FROM nest w WHERE w.id = 1;
  END LOOP;
  RETURN v;
END $$;
SELECT nest_rounds(20) AS version;
SELECT backend_bytes() AS before \gset
SELECT nest_rounds(300) AS version;
SELECT backend_bytes() - :before AS growth \gset
SELECT :growth < 256 * 1024 AS memory_flat;
SELECT 'grew by ' || pg_size_pretty(:growth::bigint) AS growth_if_not_flat
 WHERE :growth >= 256 * 1024;
SELECT id, version, note FROM nest ORDER BY id;
DROP TABLE nest;
DROP FUNCTION nest_touch();
DROP FUNCTION nest_rounds(int);
DROP FUNCTION backend_bytes();
