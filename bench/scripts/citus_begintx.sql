-- bench/citus.sh: the guard as begin() ... the work ... complete() in one
-- BEGIN..COMMIT (the other guarded transaction form; compare with
-- citus_tx.sql, the same transaction without the guard)
\set k random(1, 1000000000000)
BEGIN;
SELECT outcome FROM idempotency.begin('k:client_id-:k');
INSERT INTO public.payments (key, amount, node) VALUES ('k:client_id-:k', 1, 'bench');
SELECT idempotency.complete('k:client_id-:k', '{}');
COMMIT;
