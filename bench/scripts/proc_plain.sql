-- proc_plain: a stored procedure doing the payment, no guard
\set k random(1, 1000000000)
CALL pay_plain('q' || :client_id || '-' || :k, 10);
