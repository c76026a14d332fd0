-- bench/citus.sh: once() inside a transaction block: not delegated, each of
-- its statements routed to the key's shard (claim, work, store, commit)
\set k random(1, 1000000000000)
BEGIN;
SELECT outcome FROM idempotency.once('k:client_id-:k', NULL, 'INSERT INTO public.payments (key, amount, node) VALUES ($1, 1, $2)', 'k:client_id-:k', 'bench');
COMMIT;
