-- replay: begin() of the same completed keys
\set k random(1, 100000)
SELECT outcome, response FROM idempotency.begin('replay-' || :k);
