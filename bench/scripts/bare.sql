-- bare: the business insert alone
\set k random(1, 1000000000)
BEGIN;
INSERT INTO payment (key, amount) VALUES ('b' || :client_id || '-' || :k, 10);
END;
