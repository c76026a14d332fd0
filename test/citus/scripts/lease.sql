-- test/citus: lease mode, begin() and complete() in separate transactions
\set r random(1, 3)
SELECT 'l-' || (extract(epoch FROM clock_timestamp()) * 10)::bigint || '-' || :r AS key \gset
SELECT public.lease_begin(':key') AS attempt \gset
\if :attempt
BEGIN;
INSERT INTO public.payments (key, amount, node) VALUES (':key', 1, ':node');
SELECT idempotency.complete(':key', '{"paid": true}', attempt => :attempt);
COMMIT;
\endif
