-- proc_keyrow: the unguarded procedure plus an INSERT of the same key row into a plain copy of the key table (no lock, no lookup): the cost of storing the key alone
\set k random(1, 1000000000)
CALL pay_keyrow('k' || :client_id || '-' || :k, 10);
