-- bench/citus.sh: the business insert alone, into a table co-located with
-- the key table (a new key every time)
\set k random(1, 1000000000000)
INSERT INTO public.payments (key, amount, node) VALUES ('k:client_id-:k', 1, 'bench');
