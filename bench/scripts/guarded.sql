-- guarded: the same insert under a new idempotency key
\set k random(1, 1000000000)
BEGIN;
SELECT outcome FROM idempotency.begin('g' || :client_id || '-' || :k);
INSERT INTO payment (key, amount) VALUES ('g' || :client_id || '-' || :k, 10);
SELECT idempotency.complete('g' || :client_id || '-' || :k, '{"ok": true}');
END;
