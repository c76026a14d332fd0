-- test/citus: a guarded payment with once(), keys shared by every client
-- for 100 ms (so duplicates arrive at once through all three nodes)
\set r random(1, 3)
SELECT 'o-' || (extract(epoch FROM clock_timestamp()) * 10)::bigint || '-' || :r AS key \gset
SELECT outcome FROM idempotency.once(':key', '{}', 'INSERT INTO public.payments (key, amount, node) VALUES ($1, 1, $2) RETURNING amount', ':key', ':node');
