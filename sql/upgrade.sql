-- upgrade: install the oldest version, use it, update step by step to the
-- newest, and check that keys survive and the result equals a fresh install.
CREATE TABLE objects AS SELECT 'x'::text AS how, 'x'::text AS object WHERE false;
CREATE FUNCTION extension_objects() RETURNS SETOF text LANGUAGE sql AS $$
  SELECT pg_describe_object(classid, objid, objsubid)
    FROM pg_depend
   WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
     AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  UNION ALL
  SELECT 'column ' || attrelid::regclass || '.' || attname || ' ' || format_type(atttypid, atttypmod)
    FROM pg_attribute
   WHERE attrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace)
     AND attnum > 0 AND NOT attisdropped
  UNION ALL
  SELECT 'function ' || p.oid::regprocedure || ' -> ' || pg_get_function_result(p.oid) || ' '
         || pg_get_function_arguments(p.oid) || ' ' || p.provolatile::text || p.proparallel::text || p.proisstrict::text
         || ' ' || coalesce(obj_description(p.oid, 'pg_proc'), '(no comment)')
    FROM pg_proc p WHERE pronamespace = 'idempotency'::regnamespace
  UNION ALL
  SELECT 'index ' || indexrelid::regclass || ' ' || pg_get_indexdef(indexrelid)
    FROM pg_index WHERE indrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace)
  UNION ALL
  SELECT 'policy ' || tablename || '.' || policyname || ' ' || cmd || ' ' || qual
    FROM pg_policies WHERE schemaname = 'idempotency'
  UNION ALL
  SELECT 'acl ' || c.relname || ' ' || coalesce(c.relacl::text, '')
    FROM pg_class c WHERE relnamespace = 'idempotency'::regnamespace
  UNION ALL
  -- each dumped table with its pg_extension_config_dump() filter: an update
  -- must leave the same conditions as a fresh install
  SELECT 'config ' || u.tab::regclass || ' ' || coalesce(u.cond, '(no condition)')
    FROM pg_extension AS e, unnest(e.extconfig, e.extcondition) AS u(tab, cond)
   WHERE e.extname = 'idempotency'
  UNION ALL
  SELECT 'function acl ' || p.oid::regprocedure || ' ' || coalesce(p.proacl::text, '(default)')
         || ' definer ' || p.prosecdef::text || ' ' || coalesce(array_to_string(p.proconfig, ','), '')
    FROM pg_proc p WHERE pronamespace = 'idempotency'::regnamespace
  UNION ALL
  SELECT 'constraint ' || conrelid::regclass || '.' || conname || ' ' || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = 'idempotency'::regnamespace
  UNION ALL
  SELECT 'rls ' || relname || ' ' || relrowsecurity::text || relforcerowsecurity::text
    FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace AND relkind IN ('r', 'p')
  UNION ALL
  SELECT 'view ' || c.oid::regclass || ' ' || pg_get_viewdef(c.oid)
    FROM pg_class c WHERE relnamespace = 'idempotency'::regnamespace AND relkind = 'v'
  UNION ALL
  SELECT 'trigger ' || tgrelid::regclass || ' ' || pg_get_triggerdef(oid)
    FROM pg_trigger WHERE NOT tgisinternal
     AND tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace)
  UNION ALL
  SELECT 'type ' || t.oid::regtype || ' ' || t.typtype::text
    FROM pg_type t WHERE typnamespace = 'idempotency'::regnamespace
$$;

-- every version there is (from the update paths, not from
-- pg_available_extension_versions, which does not see the built files in
-- Debian's build-time test: pg_buildext installcheck's extension_destdir)
SELECT DISTINCT 'idempotency' AS name, source AS version
  FROM pg_extension_update_paths('idempotency') ORDER BY version;
SELECT * FROM pg_extension_update_paths('idempotency') WHERE path IS NOT NULL ORDER BY source, target;

-- a fresh install of the newest version, for comparison
INSERT INTO objects SELECT 'fresh', o FROM extension_objects() o;

-- the oldest version, in use
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency VERSION '0.1.0';
BEGIN;
SELECT outcome FROM idempotency.begin('kept', '{"v": 1}');
SELECT idempotency.complete('kept', '{"answer": 42}');
COMMIT;
-- the new library serves the old SQL definitions (complete() with 3 arguments)
BEGIN;
SELECT outcome FROM idempotency.begin('kept-2');
SELECT idempotency.complete('kept-2', '"old signature"');
COMMIT;

ALTER EXTENSION idempotency UPDATE TO '0.2.0';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
-- 0.2.0's primary key is (owner, scope, key); the library reads the order
BEGIN;
SELECT outcome FROM idempotency.begin('kept-3', lease => '1 hour');
SELECT idempotency.complete('kept-3', '"on 0.2.0"', attempt => 1);
COMMIT;
SELECT outcome, response FROM idempotency.begin('kept');
SELECT idempotency.first_seen('s', 'before 0.3.0') AS first_seen_works;

-- 0.3.0 rebuilds the primary keys with the key first, in this session: the
-- library must notice the new index (its cached order would be wrong)
ALTER EXTENSION idempotency UPDATE TO '0.3.0';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT pg_get_indexdef('idempotency.idempotency_key_pkey'::regclass) AS key_pkey;
SELECT pg_get_indexdef('idempotency.seen_message_pkey'::regclass) AS seen_pkey;
SELECT idempotency.first_seen('s', 'on 0.3.0') AS first_seen_on_030;
ALTER EXTENSION idempotency UPDATE TO '0.4.0';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
-- 0.4.0's key table has no recovery point columns and its begin_result 5
-- attributes: the 0.5.0 library serves both as they are, and its
-- checkpoint() (reached through a function 0.4.0 does not have) asks for
-- the update, writing nothing
SELECT count(*) AS begin_result_columns
  FROM idempotency.begin('rp-040', lease => '1 hour') AS b, json_object_keys(row_to_json(b));
SELECT count(*) AS lookup_result_columns
  FROM idempotency.lookup('rp-040') AS l, json_object_keys(row_to_json(l));
CREATE FUNCTION checkpoint_040(text, text, jsonb, int4, text DEFAULT '') RETURNS void
AS '$libdir/idempotency', 'idempotency_checkpoint' LANGUAGE C;
SELECT checkpoint_040('rp-040', 'order_created', '{"order": 1}', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT status, attempts FROM idempotency.idempotency_key WHERE key = 'rp-040';
DROP FUNCTION checkpoint_040;
ALTER EXTENSION idempotency UPDATE TO '0.5.0';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
-- in the same session, the library sees the new columns and types
SELECT idempotency.checkpoint('rp-040', 'order_created', '{"order": 1}', 1);
SELECT status, attempts, recovery_point, recovery_state FROM idempotency.lookup('rp-040');
SELECT idempotency.complete('rp-040', '"done"', attempt => 1);
SELECT outcome, response, recovery_point, recovery_state FROM idempotency.begin('rp-040');
-- a key in flight across the update to 0.6.0 derives the same downstream
-- key after it (its seed freezes the owner's name), even after a rename
CREATE ROLE regress_upgrade_payer;
SET ROLE regress_upgrade_payer;
SELECT outcome FROM idempotency.begin('in-flight-050', lease => '1 hour');
SELECT idempotency.derive_key('in-flight-050', 'charge') AS derived_050 \gset
RESET ROLE;
ALTER EXTENSION idempotency UPDATE TO '0.6.0';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SET ROLE regress_upgrade_payer;
SELECT idempotency.derive_key('in-flight-050', 'charge') = :'derived_050' AS same_after_update;
RESET ROLE;
ALTER ROLE regress_upgrade_payer RENAME TO regress_upgrade_payer2;
SET ROLE regress_upgrade_payer2;
SELECT idempotency.derive_key('in-flight-050', 'charge') = :'derived_050' AS same_after_rename;
SELECT outcome FROM idempotency.begin('after-060', lease => '1 hour');
RESET ROLE;
SELECT key, get_byte(derive_seed, 0) AS seed_version, length(derive_seed) AS seed_bytes
  FROM idempotency.idempotency_key WHERE key IN ('in-flight-050', 'after-060') ORDER BY key;
-- new work over the 0.5.0 key once it expired is a new life: a new derived
-- key, the same on every call of that life
UPDATE idempotency.idempotency_key SET expires_at = now() - interval '1 second'
 WHERE key = 'in-flight-050';
SET ROLE regress_upgrade_payer2;
SELECT outcome FROM idempotency.begin('in-flight-050', lease => '1 hour');
SELECT idempotency.derive_key('in-flight-050', 'charge') <> :'derived_050' AS new_life,
       idempotency.derive_key('in-flight-050', 'charge') = idempotency.derive_key('in-flight-050', 'charge') AS stable;
RESET ROLE;
DELETE FROM idempotency.idempotency_key WHERE key IN ('in-flight-050', 'after-060');
DROP ROLE regress_upgrade_payer2;
INSERT INTO objects SELECT 'updated', o FROM extension_objects() o;

-- the updates changed nothing a fresh install would not have
SELECT how, object FROM (
  (SELECT 'only fresh' AS how, object FROM objects WHERE how = 'fresh'
   EXCEPT ALL SELECT 'only fresh', object FROM objects WHERE how = 'updated')
  UNION ALL
  (SELECT 'only updated', object FROM objects WHERE how = 'updated'
   EXCEPT ALL SELECT 'only updated', object FROM objects WHERE how = 'fresh')
) d ORDER BY 1, 2;
SELECT count(*) > 40 AS compared_enough FROM objects WHERE how = 'fresh';

-- keys stored by 0.1.0 and 0.2.0 still replay, and 0.5.0 works on them
SELECT outcome, response FROM idempotency.begin('kept', '{"v": 1}');
SELECT outcome, response FROM idempotency.begin('kept-2');
SELECT outcome, response FROM idempotency.begin('kept-3');
SELECT * FROM idempotency.begin('kept', '{"v": 2}');
\echo :LAST_ERROR_SQLSTATE
SELECT outcome FROM idempotency.begin('after-update', lease => '1 hour');
SELECT idempotency.complete('after-update', '"lease"', attempt => 1);
-- one row per key, whatever the order it was stored under
SELECT key, count(*) FROM idempotency.idempotency_key GROUP BY key ORDER BY key;
SELECT idempotency.first_seen('s', 'before 0.3.0') AS first_seen_again;
SELECT idempotency.first_seen('s', 'after 0.3.0') AS first_seen_new;

-- leave a fresh newest version for the files after this one
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
DROP TABLE objects;
DROP FUNCTION extension_objects();

-- On Citus, 0.5.0 kept the owner as text: regrole's output, quoted where
-- the name needs it ("Pay-Role"), while its derive_key() hashed the role's
-- name itself (Pay-Role).  The update freezes the name into a key's seed:
-- it must be the name 0.5.0 hashed, or a key in flight across the update
-- derives another downstream key (paid twice).  The owner column as
-- 0.5.0's distribute() left it on every node (its conversion, without
-- Citus), then the update:
SELECT current_database() AS regress_db \gset
CREATE DATABASE regress_upgrade_text_owner;
\c regress_upgrade_text_owner
CREATE EXTENSION idempotency VERSION '0.5.0';
CREATE ROLE "regress_Upgrade-Payer";
SET ROLE "regress_Upgrade-Payer";
SELECT outcome FROM idempotency.begin('in-flight-text', lease => '1 hour');
RESET ROLE;
DROP POLICY idempotency_key_own_rows ON idempotency.idempotency_key;
ALTER TABLE idempotency.idempotency_key ALTER COLUMN owner TYPE pg_catalog.text USING owner::pg_catalog.text;
SELECT owner FROM idempotency.idempotency_key WHERE key = 'in-flight-text';
ALTER EXTENSION idempotency UPDATE TO '0.6.0';
SELECT get_byte(derive_seed, 0) AS seed_version,
       convert_from(substr(derive_seed, 18), 'UTF8') AS frozen_name
  FROM idempotency.idempotency_key WHERE key = 'in-flight-text';
\c :regress_db
DROP DATABASE regress_upgrade_text_owner;
DROP ROLE "regress_Upgrade-Payer";
