-- plpgsql1: the seed pattern as one PL/pgSQL function call (1 round trip)
\set k random(1, 1000000000)
SELECT pl_once('l1' || :client_id || '-' || :k, NULL, 10);
