-- proc_guarded: the same procedure with the guard inside
\set k random(1, 1000000000)
CALL pay_guarded('r' || :client_id || '-' || :k, 10);
