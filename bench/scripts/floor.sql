-- floor: bare plus two statements that do nothing (SELECT 1): the least any guard made of two extra statements can cost
\set k random(1, 1000000000)
BEGIN;
SELECT 1;
INSERT INTO payment (key, amount) VALUES ('f' || :client_id || '-' || :k, 10);
SELECT 1;
END;
