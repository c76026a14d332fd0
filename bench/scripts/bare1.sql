-- bare1: the business insert alone, one autocommit statement (1 round trip)
\set k random(1, 1000000000)
INSERT INTO payment (key, amount) VALUES ('b1' || :client_id || '-' || :k, 10) RETURNING id;
