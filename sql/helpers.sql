-- helpers: create_machine/transition, update_versioned, insert_once.  Every
-- outcome and error with its SQLSTATE, refused calls write nothing,
-- identifiers of every shape, privileges, ALTER TABLE between calls.
\i sql/include/roles.sql

-- state machines: validation
SELECT idempotency.create_machine('order', '{"pending": ["paid", "cancelled"], "paid": ["shipped"], "shipped": []}');
SELECT machine, transitions, owner FROM idempotency.state_machine;
SELECT idempotency.create_machine('bad', '[]');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.create_machine('bad', '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.create_machine('bad', '{"": ["a"]}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.create_machine('bad', '{"a": "b"}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.create_machine('bad', '{"a": {"b": 1}}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.create_machine('bad', '{"a": ["b", "b"]}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.create_machine('bad', '{"a": ["b", 1]}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.create_machine('bad', '{"a": [["b"]]}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.create_machine(NULL, '{"a": ["b"]}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.create_machine('bad', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS bad_machines FROM idempotency.state_machine WHERE machine = 'bad';
-- redefinable by its owner; not by another role
SELECT idempotency.create_machine('door', '{"closed": ["open"]}');
SELECT idempotency.create_machine('door', '{"closed": ["open"], "open": ["closed"]}');
SET ROLE regress_bob;
SELECT idempotency.create_machine('door', '{"closed": []}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.create_machine('bobs', '{"a": ["b"]}');
RESET ROLE;
SELECT machine, transitions, owner FROM idempotency.state_machine ORDER BY machine;

-- transition on a text column
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL DEFAULT 'pending');
INSERT INTO orders VALUES (1), (2), (3);
SELECT idempotency.transition('orders', 1, 'paid', 'order');
SELECT idempotency.transition('orders', 1, 'paid', 'order');	-- the duplicate callback
SELECT idempotency.transition('orders', 1, 'shipped', 'order');
SELECT idempotency.transition('orders', 1, 'cancelled', 'order');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('orders', 2, 'shipped', 'order');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('orders', 2, 'teleported', 'order');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('orders', 42, 'paid', 'order');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('orders', 2, 'paid', 'no-such-machine');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('orders', 2, 'paid', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('orders', 2, NULL, 'order');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('orders', NULL::int, 'paid', 'order');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('no_such_table', 2, 'paid', 'order');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('orders', 2, 'paid', 'order', state_column => 'state');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('orders', 2, 'paid', 'order', id_column => 'order_id');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('orders', 2, 'paid', 'order', id_column => 'ctid');
\echo :LAST_ERROR_SQLSTATE
CREATE VIEW orders_view AS SELECT * FROM orders;
SELECT idempotency.transition('orders_view', 2, 'paid', 'order');
\echo :LAST_ERROR_SQLSTATE
-- refused calls wrote nothing
SELECT id, status FROM orders ORDER BY id;

-- an enum state column, and a uuid id given as text
CREATE TYPE shipment_state AS ENUM ('pending', 'paid', 'shipped', 'cancelled');
CREATE TABLE shipments (id uuid PRIMARY KEY, state shipment_state NOT NULL DEFAULT 'pending');
INSERT INTO shipments VALUES ('00000000-0000-0000-0000-000000000001');
SELECT idempotency.transition('shipments', '00000000-0000-0000-0000-000000000001'::text, 'paid', 'order', 'state');
SELECT idempotency.transition('shipments', '00000000-0000-0000-0000-000000000001'::uuid, 'paid', 'order', 'state');
SELECT idempotency.transition('shipments', '00000000-0000-0000-0000-000000000001'::uuid, 'lost', 'order', 'state');
\echo :LAST_ERROR_SQLSTATE
SELECT state FROM shipments;

-- an integer state column without a machine: forward only
CREATE TABLE jobs (id bigint PRIMARY KEY, stage int NOT NULL DEFAULT 0);
INSERT INTO jobs VALUES (7);
SELECT idempotency.transition('jobs', 7, '2', NULL, 'stage');	-- int literal id, bigint column
SELECT idempotency.transition('jobs', 7, '2', NULL, 'stage');
SELECT idempotency.transition('jobs', 7, '1', NULL, 'stage');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('jobs', 7, 'two', NULL, 'stage');
\echo :LAST_ERROR_SQLSTATE
SELECT stage FROM jobs;

-- versioned update
CREATE TABLE item (
  id int PRIMARY KEY, name text, qty int, price numeric(10, 2), tags text[],
  meta jsonb, seen_at timestamptz, version bigint NOT NULL DEFAULT 1,
  total numeric GENERATED ALWAYS AS (qty * price) STORED);
INSERT INTO item (id, name, qty) VALUES (1, 'widget', 10);
SELECT idempotency.update_versioned('item', 1, 1,
  '{"qty": 9, "price": 1.5, "tags": ["a", "b"], "meta": {"x": [1, 2]}, "seen_at": "2024-01-02T03:04:05Z", "name": null}');
SELECT id, name, qty, price, tags, meta, seen_at, version, total FROM item;
-- a retry with the old version is stale: IK006, nothing written
SELECT idempotency.update_versioned('item', 1, 1, '{"qty": 8}');
\echo :LAST_ERROR_SQLSTATE
SELECT qty, version FROM item;
SELECT idempotency.update_versioned('item', 99, 1, '{"qty": 8}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.update_versioned('item', 1, 2, '{"version": 7}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.update_versioned('item', 1, 2, '{"id": 7}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.update_versioned('item', 1, 2, '{"colour": "red"}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.update_versioned('item', 1, 2, '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.update_versioned('item', 1, 2, '[1]');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.update_versioned('item', 1, 2, '{"qty": "many"}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.update_versioned('item', 1, 2, '{"total": 5}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.update_versioned('item', 1, 2, '{"qty": 1}', version_column => 'name');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.update_versioned('item', 1, NULL, '{"qty": 1}');
\echo :LAST_ERROR_SQLSTATE
-- no such row, and no version read from it (NULL): the missing row, P0002
SELECT idempotency.update_versioned('item', 99, NULL, '{"qty": 1}');
\echo :LAST_ERROR_SQLSTATE
SELECT qty, version FROM item;

-- dedup insert: the new row with its defaults and generated values, then
-- the same row again for the duplicate
CREATE TABLE purchase (
  id bigserial PRIMARY KEY, request_id text NOT NULL UNIQUE, amount numeric NOT NULL,
  status text NOT NULL DEFAULT 'new', doubled numeric GENERATED ALWAYS AS (amount * 2) STORED);
SELECT inserted, "row" - 'id' AS "row" FROM idempotency.insert_once('purchase', '{"request_id": "r-1", "amount": 5}', '{request_id}');
SELECT inserted, "row" - 'id' AS "row" FROM idempotency.insert_once('purchase', '{"request_id": "r-1", "amount": 999}', '{request_id}');
SELECT (a).row = (b).row AS same_answer
  FROM (SELECT idempotency.insert_once('purchase', '{"request_id": "r-2", "amount": 1}', '{request_id}') AS a) x,
       (SELECT idempotency.insert_once('purchase', '{"request_id": "r-2", "amount": 1}', '{request_id}') AS b) y;
SELECT count(*), sum(amount) FROM purchase;
-- by primary key (the default)
SELECT * FROM idempotency.insert_once('orders', '{"id": 10, "status": "pending"}');
SELECT * FROM idempotency.insert_once('orders', '{"id": 10, "status": "paid"}');
-- errors
SELECT * FROM idempotency.insert_once('purchase', '{"request_id": "r-3", "amount": 1}', '{amount}');
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE no_pk (a int);
SELECT * FROM idempotency.insert_once('no_pk', '{"a": 1}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.insert_once('purchase', '{"request_id": "r-3", "colour": "red"}', '{request_id}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.insert_once('purchase', '{"request_id": "r-3", "amount": 1}', '{no_such}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.insert_once('purchase', '{}', '{request_id}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.insert_once('purchase', '{"request_id": "r-3"}', '{request_id}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.insert_once('purchase', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM purchase;

-- hostile identifiers: spaces, quotes, semicolons, mixed case
CREATE SCHEMA "My Schema";
CREATE TABLE "My Schema"."Odd ""Table""; DROP TABLE orders;--" (
  "Id ""x""" int PRIMARY KEY, "State; --" text NOT NULL DEFAULT 'pending',
  "Ver" int NOT NULL DEFAULT 0, "Note" text);
INSERT INTO "My Schema"."Odd ""Table""; DROP TABLE orders;--" VALUES (1);
SELECT idempotency.transition('"My Schema"."Odd ""Table""; DROP TABLE orders;--"', 1, 'paid', 'order',
                              state_column => 'State; --', id_column => 'Id "x"');
SELECT idempotency.update_versioned('"My Schema"."Odd ""Table""; DROP TABLE orders;--"', 1, 0,
                                    '{"Note": "it''s; fine"}', version_column => 'Ver', id_column => 'Id "x"');
SELECT * FROM idempotency.insert_once('"My Schema"."Odd ""Table""; DROP TABLE orders;--"', '{"Id \"x\"": 2, "Note": "x"}');
SELECT * FROM "My Schema"."Odd ""Table""; DROP TABLE orders;--" ORDER BY 1;
SELECT count(*) AS orders_still_there FROM orders;

-- SECURITY INVOKER: a role without rights on the target gets 42501
SET ROLE regress_bob;
SELECT idempotency.transition('orders', 2, 'paid', 'order');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.update_versioned('item', 1, 2, '{"qty": 1}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.insert_once('purchase', '{"request_id": "bob", "amount": 1}', '{request_id}');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT (SELECT status FROM orders WHERE id = 2) AS order_2, (SELECT version FROM item) AS item_version,
       (SELECT count(*) FROM purchase WHERE request_id = 'bob') AS bob_purchases;

-- ALTER TABLE between calls in one session: the cached statements follow
CREATE TABLE doc (id int PRIMARY KEY, body text, rev int NOT NULL DEFAULT 1, status text NOT NULL DEFAULT 'pending');
INSERT INTO doc (id, body) VALUES (1, 'a');
SELECT idempotency.update_versioned('doc', 1, 1, '{"body": "b"}', version_column => 'rev');
ALTER TABLE doc RENAME COLUMN body TO content;
SELECT idempotency.update_versioned('doc', 1, 2, '{"body": "c"}', version_column => 'rev');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.update_versioned('doc', 1, 2, '{"content": "c"}', version_column => 'rev');
ALTER TABLE doc ALTER COLUMN content TYPE varchar(3);
SELECT idempotency.update_versioned('doc', 1, 3, '{"content": "toolong"}', version_column => 'rev');
\echo :LAST_ERROR_SQLSTATE
ALTER TABLE doc ALTER COLUMN rev TYPE bigint;
SELECT idempotency.update_versioned('doc', 1, 3, '{"content": "d"}', version_column => 'rev');
ALTER TABLE doc DROP COLUMN content, ADD COLUMN content jsonb;
SELECT idempotency.update_versioned('doc', 1, 4, '{"content": {"v": 5}}', version_column => 'rev');
SELECT idempotency.transition('doc', 1, 'paid', 'order');
ALTER TABLE doc RENAME COLUMN status TO phase;
SELECT idempotency.transition('doc', 1, 'shipped', 'order', state_column => 'phase');
SELECT * FROM idempotency.insert_once('doc', '{"id": 2, "phase": "pending"}');
ALTER TABLE doc ADD COLUMN created timestamptz DEFAULT 'epoch';
SELECT inserted, "row" FROM idempotency.insert_once('doc', '{"id": 2, "phase": "pending"}');
SELECT inserted, "row" FROM idempotency.insert_once('doc', '{"id": 3}');
SELECT * FROM doc ORDER BY id;

-- a hostile search_path: look-alike operators and functions in front change
-- nothing (statements are prepared under it in a fresh session)
CREATE SCHEMA evil;
CREATE FUNCTION evil.hijack(int, int) RETURNS boolean LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'hijacked int ='; END $$;
CREATE OPERATOR evil.= (LEFTARG = int, RIGHTARG = int, FUNCTION = evil.hijack);
CREATE FUNCTION evil.hijack(text, text) RETURNS boolean LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'hijacked text ='; END $$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.hijack);
CREATE FUNCTION evil.jsonb_populate_record(anyelement, jsonb) RETURNS anyelement LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'hijacked jsonb_populate_record'; END $$;
CREATE FUNCTION evil.to_jsonb(anyelement) RETURNS jsonb LANGUAGE sql AS $$ SELECT '"hijacked"'::jsonb $$;
\c
SET search_path = evil, public, pg_catalog;
SELECT idempotency.transition('orders', 3, 'paid', 'order');
SELECT idempotency.update_versioned('item', 1, 2, '{"qty": 4}');
SELECT * FROM idempotency.insert_once('purchase', '{"request_id": "r-evil", "amount": 3}', '{request_id}');
SELECT inserted, "row" ->> 'request_id' AS request_id
  FROM idempotency.insert_once('purchase', '{"request_id": "r-evil", "amount": 3}', '{request_id}');
RESET search_path;
DROP SCHEMA evil CASCADE;
