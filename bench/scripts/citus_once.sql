-- bench/citus.sh: the same insert guarded by once() in autocommit (Citus
-- delegates the call to the node of the key's shard: one round trip)
\set k random(1, 1000000000000)
SELECT outcome FROM idempotency.once('k:client_id-:k', NULL, 'INSERT INTO public.payments (key, amount, node) VALUES ($1, 1, $2)', 'k:client_id-:k', 'bench');
