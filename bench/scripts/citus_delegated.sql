-- bench/citus.sh: the same insert in a function Citus delegates to the
-- key's node (create_distributed_function, force_delegation), with no guard:
-- what any delegated call costs, the ceiling of once() in autocommit
\set k random(1, 1000000000000)
SELECT public.pay('k:client_id-:k', 'bench');
