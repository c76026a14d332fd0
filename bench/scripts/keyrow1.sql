-- keyrow1: the same insert plus a plain INSERT of an equivalent key row into a
-- copy of the key table, one autocommit statement (no lock, no lookup): the
-- floor of any design that stores a key row
\set k random(1, 1000000000)
WITH p AS (INSERT INTO payment (key, amount) VALUES ('r1' || :client_id || '-' || :k, 10) RETURNING id)
INSERT INTO keyrow (owner, scope, key, status, response, expires_at)
SELECT current_user::regrole, '', 'r1' || :client_id || '-' || :k, 'completed',
       jsonb_build_object('id', p.id), now() + interval '1 day' FROM p;
