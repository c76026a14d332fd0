-- plpgsql: the same logic as two PL/pgSQL functions
\set k random(1, 1000000000)
BEGIN;
SELECT pl_begin('p' || :client_id || '-' || :k);
INSERT INTO payment (key, amount) VALUES ('p' || :client_id || '-' || :k, 10);
SELECT pl_complete('p' || :client_id || '-' || :k, '{"ok": true}');
END;
