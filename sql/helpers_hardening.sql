-- helpers_hardening: the write helpers never change another row than the one
-- asked for, never loop on 40001, and refuse what they cannot do with a clear
-- SQLSTATE; refused calls write nothing.

SELECT idempotency.create_machine('hard', '{"pending": ["paid", "cancelled"], "paid": ["shipped"]}');

-- item 5: an id that does not convert exactly is an error, never another row
CREATE TABLE h_orders (id int PRIMARY KEY, status text NOT NULL DEFAULT 'pending',
                       version int NOT NULL DEFAULT 1, qty int);
INSERT INTO h_orders (id) SELECT g FROM generate_series(1, 10) g;
SELECT idempotency.transition('h_orders', 6.5, 'paid', 'hard');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.update_versioned('h_orders', 8.5, 1, '{"qty": 1}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('h_orders', 1e10::bigint, 'paid', 'hard');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('h_orders', '7x'::text, 'paid', 'hard');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('h_orders', 2.0, 'paid', 'hard');	-- exact: row 2
SELECT idempotency.transition('h_orders', 3::bigint, 'paid', 'hard');
SELECT idempotency.update_versioned('h_orders', 4::smallint, 1, '{"qty": 4}');
SELECT idempotency.transition('h_orders', '5'::text, 'paid', 'hard');
SELECT idempotency.transition('h_orders', now(), 'paid', 'hard');
\echo :LAST_ERROR_SQLSTATE
-- the id column as state or version column would rewrite the key: 22023
SELECT idempotency.transition('h_orders', 10, '11', NULL, state_column => 'id', id_column => 'id');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.update_versioned('h_orders', 1, 1, '{"qty": 1}', version_column => 'id', id_column => 'id');
\echo :LAST_ERROR_SQLSTATE
SELECT id, status, version, qty FROM h_orders WHERE status <> 'pending' OR qty IS NOT NULL OR version <> 1 ORDER BY id;

-- item 6: a conflict column left out of row takes its DEFAULT: the second
-- call returns the first row
CREATE TABLE t1 (tenant text DEFAULT 'acme', code text, n int, PRIMARY KEY (tenant, code));
SELECT * FROM idempotency.insert_once('t1', '{"code": "a", "n": 1}');
SELECT * FROM idempotency.insert_once('t1', '{"code": "a", "n": 2}');
SELECT * FROM idempotency.insert_once('t1', '{"tenant": "other", "code": "a", "n": 3}');
SELECT * FROM t1 ORDER BY tenant;
-- a key column left to a volatile default (a sequence) that collides with an
-- existing row: the row cannot be looked up, 23505 at once, not 40001
CREATE TABLE t3 (id serial PRIMARY KEY, code text);
SELECT inserted, "row" FROM idempotency.insert_once('t3', '{"code": "a"}');
SELECT setval('t3_id_seq', 1, false);
SELECT * FROM idempotency.insert_once('t3', '{"code": "b"}');
\echo :LAST_ERROR_SQLSTATE
SELECT id, code FROM t3;
-- a BEFORE INSERT trigger that skips the row: a clear error, not 40001
CREATE FUNCTION skip_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TABLE t2 (code text PRIMARY KEY);
CREATE TRIGGER skip BEFORE INSERT ON t2 FOR EACH ROW EXECUTE FUNCTION skip_row();
SELECT * FROM idempotency.insert_once('t2', '{"code": "a"}');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS t2_rows FROM t2;

-- an unknown machine is 42704 even when the row is in the target state
UPDATE h_orders SET status = 'paid' WHERE id = 9;
SELECT idempotency.transition('h_orders', 9, 'paid', 'no-such-machine');
\echo :LAST_ERROR_SQLSTATE
-- a label the enum does not have is the type's own 22P02
CREATE TYPE h_state AS ENUM ('pending', 'paid', 'shipped');
CREATE TABLE h_enum (id int PRIMARY KEY, status h_state NOT NULL DEFAULT 'pending');
INSERT INTO h_enum VALUES (1);
SELECT idempotency.transition('h_enum', 1, 'lost', 'hard');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('h_enum', 1, 'paid', 'hard');
-- unsupported state types are refused, naming column and type
CREATE TABLE h_bytea (id int PRIMARY KEY, status bytea);
INSERT INTO h_bytea VALUES (1, 'pending');
SELECT idempotency.transition('h_bytea', 1, 'paid', 'hard');
\echo :LAST_ERROR_SQLSTATE
SELECT status FROM h_bytea;
-- NULL target: 22004
SELECT idempotency.transition(NULL, 1, 'paid', 'hard');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.update_versioned(NULL, 1, 1, '{"qty": 1}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.insert_once(NULL, '{"code": "a"}');
\echo :LAST_ERROR_SQLSTATE
-- a NOT NULL domain column the call does not name keeps its value / gets
-- its default
CREATE DOMAIN h_label AS text NOT NULL DEFAULT 'none';
CREATE TABLE h_dom (id int PRIMARY KEY, label h_label, qty int, version int NOT NULL DEFAULT 1);
INSERT INTO h_dom (id, label) VALUES (1, 'kept');
SELECT idempotency.update_versioned('h_dom', 1, 1, '{"qty": 5}');
SELECT * FROM idempotency.insert_once('h_dom', '{"id": 2, "qty": 1}');
SELECT * FROM idempotency.update_versioned('h_dom', 1, 2, '{"label": null}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM h_dom ORDER BY id;
-- a machine name too long to index (12,800 characters that do not
-- compress): 22023 naming the machine
SELECT idempotency.create_machine((SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g),
                                  '{"a": ["b"]}');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS long_machines FROM idempotency.state_machine WHERE length(machine) > 1000;
-- a NULL in state_machine.transitions (a DBA's UPDATE): a clear error
-- naming the table, no crash
ALTER TABLE idempotency.state_machine ALTER COLUMN transitions DROP NOT NULL;
SELECT idempotency.create_machine('broken', '{"pending": ["paid"]}');
UPDATE idempotency.state_machine SET transitions = NULL WHERE machine = 'broken';
SELECT idempotency.transition('h_orders', 10, 'paid', 'broken');
\echo :LAST_ERROR_SQLSTATE
UPDATE idempotency.state_machine SET transitions = '["paid"]' WHERE machine = 'broken';
SELECT idempotency.transition('h_orders', 10, 'paid', 'broken');
\echo :LAST_ERROR_SQLSTATE
DELETE FROM idempotency.state_machine WHERE machine = 'broken';
ALTER TABLE idempotency.state_machine ALTER COLUMN transitions SET NOT NULL;
SELECT status FROM h_orders WHERE id = 10;

-- item 7: one state listing 150,000 targets is checked in linear time, under
-- a statement_timeout the quadratic check exceeded by far; a duplicate at
-- the end is still found
CREATE TABLE big_def AS
  SELECT jsonb_build_object('s', jsonb_agg('t' || g)) AS ok,
         jsonb_build_object('s', jsonb_agg('t' || g) || '"t1"'::jsonb) AS dup
    FROM generate_series(1, 150000) g;
SET statement_timeout = '5s';
SELECT idempotency.create_machine('big', ok) FROM big_def;
SELECT idempotency.create_machine('big-dup', dup) FROM big_def;
\echo :LAST_ERROR_SQLSTATE
-- and a statement_timeout far below what the whole call takes stops it
SET statement_timeout = '5ms';
SELECT idempotency.create_machine('big-timeout', ok) FROM big_def;
\echo :LAST_ERROR_SQLSTATE
RESET statement_timeout;
SELECT machine, jsonb_array_length(transitions -> 's') AS targets
  FROM idempotency.state_machine WHERE machine LIKE 'big%';
DELETE FROM idempotency.state_machine WHERE machine LIKE 'big%';
DROP TABLE big_def;

DROP TABLE h_orders, t1, t2, t3, h_enum, h_bytea, h_dom;
DROP FUNCTION skip_row();
DROP TYPE h_state;
DROP DOMAIN h_label;
DELETE FROM idempotency.state_machine WHERE machine = 'hard';
