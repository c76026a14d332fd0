-- once: the same insert guarded by idempotency.once(), one autocommit statement
\set k random(1, 1000000000)
SELECT outcome, response FROM idempotency.once('o' || :client_id || '-' || :k, NULL,
  'INSERT INTO payment (key, amount) VALUES ($1, $2) RETURNING id', 'o' || :client_id || '-' || :k, 10);
