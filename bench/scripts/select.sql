-- select: a plain primary-key SELECT of a completed key's row
\set k random(1, 100000)
SELECT status, response FROM idempotency.idempotency_key
 WHERE owner = 'postgres'::regrole AND scope = '' AND key = 'replay-' || :k;
