-- bench/citus.sh: the transaction of citus_oncetx.sql without the guard:
-- the business insert and a plain insert of a key row (a co-located table
-- shaped like the key table, with its primary key) in one BEGIN..COMMIT,
-- so that oncetx / tx is what the guard adds to such a transaction
\set k random(1, 1000000000000)
BEGIN;
INSERT INTO public.plain_key (owner, key, status, expires_at) VALUES (10, 'k:client_id-:k', 'completed', now() + interval '1 day');
INSERT INTO public.payments (key, amount, node) VALUES ('k:client_id-:k', 1, 'bench');
COMMIT;
