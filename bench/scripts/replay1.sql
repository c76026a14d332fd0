-- replay1: once() of completed keys: the work does not run
\set k random(1, 100000)
SELECT outcome, response FROM idempotency.once('replay-' || :k, NULL,
  'INSERT INTO payment (key, amount) VALUES ($1, $2) RETURNING id', 'replay-' || :k, 10);
