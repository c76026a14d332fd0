-- write helpers under row-level security (found by the privilege
-- matrix): a row the caller may SELECT but not UPDATE made transition()
-- raise IK005 naming an allowed move, and update_versioned() IK006 with
-- "expected 1, current 1".  Now: 42501 naming row security, nothing written;
-- a trigger that skips the UPDATE: 09000.
CREATE ROLE regress_rls_clerk NOLOGIN;
CREATE TABLE rls_orders (id int PRIMARY KEY, status text NOT NULL, version bigint NOT NULL, note text);
INSERT INTO rls_orders VALUES (1, 'pending', 1, NULL), (2, 'pending', 1, NULL);
ALTER TABLE rls_orders ENABLE ROW LEVEL SECURITY;
CREATE POLICY read_all ON rls_orders FOR SELECT USING (true);
CREATE POLICY update_two ON rls_orders FOR UPDATE USING (id = 2);
GRANT SELECT, UPDATE ON rls_orders TO regress_rls_clerk;
SELECT idempotency.create_machine('rls_order', '{"pending": ["paid"], "paid": []}');
\set VERBOSITY terse
SET ROLE regress_rls_clerk;
SELECT idempotency.transition('rls_orders', 1, 'paid', 'rls_order');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.update_versioned('rls_orders', 1, 1, '{"note": "x"}');
\echo :LAST_ERROR_SQLSTATE
-- the row the policy lets it update: as before
SELECT idempotency.transition('rls_orders', 2, 'paid', 'rls_order');
SELECT idempotency.update_versioned('rls_orders', 2, 1, '{"note": "y"}');
-- a real stale version and a real invalid move still say so
SELECT idempotency.update_versioned('rls_orders', 2, 1, '{"note": "z"}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('rls_orders', 2, 'pending', 'rls_order');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT * FROM rls_orders ORDER BY id;
-- a BEFORE UPDATE trigger that skips the row: 09000, not IK005/IK006
ALTER TABLE rls_orders DISABLE ROW LEVEL SECURITY;
CREATE FUNCTION rls_skip() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER rls_skip BEFORE UPDATE ON rls_orders FOR EACH ROW EXECUTE FUNCTION rls_skip();
SELECT idempotency.transition('rls_orders', 1, 'paid', 'rls_order');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.update_versioned('rls_orders', 1, 1, '{"note": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM rls_orders ORDER BY id;
-- insert_once() of a key held by a row the caller's SELECT policies hide:
-- 42501 naming row security (not 40001 "retry", which can never succeed),
-- nothing written; a key no row holds is inserted as before
CREATE TABLE rls_seen (id int PRIMARY KEY, who text NOT NULL);
INSERT INTO rls_seen VALUES (1, 'other');
ALTER TABLE rls_seen ENABLE ROW LEVEL SECURITY;
CREATE POLICY mine ON rls_seen FOR SELECT USING (who = 'clerk');
CREATE POLICY add_mine ON rls_seen FOR INSERT WITH CHECK (who = 'clerk');
GRANT SELECT, INSERT ON rls_seen TO regress_rls_clerk;
SET ROLE regress_rls_clerk;
SELECT * FROM idempotency.insert_once('rls_seen', '{"id": 1, "who": "clerk"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.insert_once('rls_seen', '{"id": 2, "who": "clerk"}');
SELECT * FROM idempotency.insert_once('rls_seen', '{"id": 2, "who": "clerk"}');
RESET ROLE;
SELECT * FROM rls_seen ORDER BY id;
DROP TABLE rls_seen;
\set VERBOSITY default
DROP TABLE rls_orders;
DROP FUNCTION rls_skip();
DELETE FROM idempotency.state_machine WHERE machine = 'rls_order';
DROP ROLE regress_rls_clerk;
