-- test/citus: once() inside a transaction block (not delegated: routed statement by statement), keys shared by every client
-- for 100 ms (so duplicates arrive at once through all three nodes)
\set r random(1, 3)
SELECT 't-' || (extract(epoch FROM clock_timestamp()) * 10)::bigint || '-' || :r AS key \gset
BEGIN;
SELECT outcome FROM idempotency.once(':key', '{}', 'INSERT INTO public.payments (key, amount, node) VALUES ($1, 1, $2) RETURNING amount', ':key', ':node');
COMMIT;
