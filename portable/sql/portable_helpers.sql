-- portable_helpers: what the portable edition's write helpers and stats
-- do their own way.  The statements on the target run under the caller's
-- search_path (a trigger that names a function without its schema works
-- as in the C edition) while every name the helper writes is qualified
-- (a look-alike type or function in front changes nothing), and the
-- caller's search_path is as it was after the call; a row with a
-- constrained domain column it does not name; machines are written only
-- through create_machine(), which checks a definition as the C edition
-- does; stats() reads the key table.

-- a trigger on the target that names a function without its schema
CREATE FUNCTION ph_stamp_value() RETURNS text LANGUAGE sql AS $$ SELECT 'stamped' $$;
CREATE FUNCTION ph_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.note := ph_stamp_value(); RETURN NEW; END $$;
CREATE TABLE ph_doc (id int PRIMARY KEY, status text NOT NULL DEFAULT 'pending',
                     version int NOT NULL DEFAULT 1, note text, body text);
CREATE TRIGGER ph_stamp BEFORE INSERT OR UPDATE ON ph_doc FOR EACH ROW EXECUTE FUNCTION ph_stamp();
SELECT idempotency.create_machine('ph', '{"pending": ["done"]}');
SELECT * FROM idempotency.insert_once('ph_doc', '{"id": 1, "body": "a"}');
SELECT idempotency.update_versioned('ph_doc', 1, 1, '{"body": "b"}');
SELECT idempotency.transition('ph_doc', 1, 'done', 'ph');
SELECT * FROM ph_doc;

-- look-alikes in front of pg_catalog: a type text, functions format() and
-- jsonb_populate_record(), an operator = on integers; the caller's
-- search_path is unchanged after each call, inside a transaction too
CREATE SCHEMA ph_evil;
CREATE TYPE ph_evil.text AS (x int);
CREATE FUNCTION ph_evil.format(text, int) RETURNS text LANGUAGE sql AS $$ SELECT 'hijacked format' $$;
CREATE FUNCTION ph_evil.jsonb_populate_record(anyelement, jsonb) RETURNS anyelement LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'hijacked jsonb_populate_record'; END $$;
CREATE FUNCTION ph_evil.hijack(int, int) RETURNS boolean LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'hijacked int ='; END $$;
CREATE OPERATOR ph_evil.= (LEFTARG = int, RIGHTARG = int, FUNCTION = ph_evil.hijack);
BEGIN;
SET LOCAL search_path = ph_evil, public, pg_catalog;
SELECT idempotency.update_versioned('ph_doc', 1, 2, '{"body": "c"}');
SHOW search_path;
SELECT * FROM idempotency.insert_once('ph_doc', '{"id": 1, "body": "again"}');
SELECT * FROM idempotency.insert_once('ph_doc', '{"id": 2, "body": "x"}');
SHOW search_path;
SELECT idempotency.transition('ph_doc', 2, 'done', 'ph');
SELECT idempotency.transition('ph_doc', 2, 'done', 'ph');
SHOW search_path;
-- an error path leaves it too (the savepoint's rollback restores it)
SAVEPOINT s;
SELECT idempotency.update_versioned('ph_doc', 99, 1, '{"body": "d"}');
ROLLBACK TO SAVEPOINT s;
SHOW search_path;
COMMIT;
SELECT id, status, version, note, body FROM ph_doc ORDER BY id;
DROP SCHEMA ph_evil CASCADE;

-- a NOT NULL domain column the row does not name: the row is read by a
-- column list of the named columns only; the duplicate finds the row
CREATE DOMAIN ph_label AS text NOT NULL DEFAULT 'none';
CREATE TABLE ph_dom (code text PRIMARY KEY, label ph_label, n int);
SELECT * FROM idempotency.insert_once('ph_dom', '{"code": "a", "n": 1}');
SELECT * FROM idempotency.insert_once('ph_dom', '{"code": "a", "n": 2}');
SELECT * FROM idempotency.insert_once('ph_dom', '{"code": "b", "label": null}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM ph_dom;

-- machines: an application role defines its own through create_machine(),
-- and may not write the table itself (42501, nothing written)
SET ROLE regress_alice;
SELECT idempotency.create_machine('ph-alice', '{"a": ["b"]}');
INSERT INTO idempotency.state_machine (machine, transitions, owner) VALUES ('ph-direct', '{"a": []}', 'regress_alice');
\echo :LAST_ERROR_SQLSTATE
UPDATE idempotency.state_machine SET transitions = '{"a": []}' WHERE machine = 'ph-alice';
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT machine, transitions, owner FROM idempotency.state_machine WHERE machine LIKE 'ph%' ORDER BY machine;

-- stats(): the live keys per role and scope; the event counters are NULL
SET ROLE regress_alice;
BEGIN;
SELECT outcome FROM idempotency.begin('ph-1', scope => 'ph-stats');
SELECT idempotency.complete('ph-1', '{}', scope => 'ph-stats');
SELECT outcome FROM idempotency.begin('ph-2', scope => 'ph-stats');
SELECT idempotency.fail('ph-2', '{}', scope => 'ph-stats', retryable => false);
COMMIT;
SELECT database = current_database() AS this_database, role, scope, completed, failed_retryable, failed_final,
       begin_new, waits, wait_total_ms, purged, stats_since
  FROM idempotency.stats WHERE scope = 'ph-stats';
SET ROLE regress_bob;
SELECT count(*) AS alices_rows_seen_by_bob FROM idempotency.stats WHERE scope = 'ph-stats';
RESET ROLE;
SELECT count(*) AS alices_rows_seen_by_superuser FROM idempotency.stats WHERE scope = 'ph-stats';
SET ROLE regress_bob;
SELECT idempotency.stats_reset();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

DELETE FROM idempotency.idempotency_key WHERE scope = 'ph-stats';
DELETE FROM idempotency.state_machine WHERE machine LIKE 'ph%';
DROP TABLE ph_doc, ph_dom;
DROP DOMAIN ph_label;
DROP FUNCTION ph_stamp(), ph_stamp_value();

-- create_machine(): the first fault of a state's targets in array order,
-- as the C edition's one pass (a repeat before a number, a number before
-- a repeat); a long name of multibyte characters clipped at 40 bytes
-- without splitting one; nothing written
SELECT idempotency.create_machine('ph-bad', '{"a": ["b", "b", 1]}');
SELECT idempotency.create_machine('ph-bad', '{"a": ["b", 1, "b"]}');
SELECT idempotency.create_machine('ph-bad', '{"a": ["b", "c"], "d": ["e", ["f"]]}');
SELECT idempotency.create_machine(repeat('é', 600), '{"a": ["b"]}');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS bad_machines FROM idempotency.state_machine WHERE machine LIKE 'ph-bad%' OR machine LIKE 'é%';

-- messages name a type as the caller's search_path spells it (the helper
-- works on its own): unqualified where visible, qualified where not
CREATE SCHEMA ph_types;
CREATE DOMAIN ph_types.blob AS bytea;
-- (no cast from point to integer on any major; 18 casts bytea to integer)
CREATE DOMAIN ph_types.spot AS point;
CREATE TABLE ph_blob (id int PRIMARY KEY, status ph_types.blob, version ph_types.blob);
INSERT INTO ph_blob VALUES (1, 'x', 'y');
SELECT idempotency.transition('ph_blob', 1, 'a', 'ph-none');
SELECT idempotency.update_versioned('ph_blob', 1, 1, '{"status": "z"}');
SET search_path = ph_types, public;
SELECT idempotency.transition('ph_blob', 1, 'a', 'ph-none');
SELECT idempotency.update_versioned('ph_blob', 1, 1, '{"status": "z"}');
SELECT idempotency.transition('ph_blob', '(1,1)'::ph_types.spot, 'a', 'ph-none');
RESET search_path;
DROP TABLE ph_blob;
DROP SCHEMA ph_types CASCADE;
