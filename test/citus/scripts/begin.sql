-- test/citus: begin() / the work / complete() in one explicit transaction
\set r random(1, 3)
SELECT 'b-' || (extract(epoch FROM clock_timestamp()) * 10)::bigint || '-' || :r AS key \gset
BEGIN;
SELECT (outcome OPERATOR(pg_catalog.<>) 'replay')::int AS work FROM idempotency.begin(':key', '{}') \gset
\if :work
INSERT INTO public.payments (key, amount, node) VALUES (':key', 1, ':node');
SELECT idempotency.complete(':key', '{"paid": true}');
\endif
COMMIT;
