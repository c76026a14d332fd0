-- pgTAP: the installed objects, their signatures, attributes and privileges.
BEGIN;
SELECT plan(50);

-- schema and extension
SELECT has_schema('idempotency');
SELECT has_extension('idempotency', 'idempotency');
SELECT is((SELECT extversion FROM pg_extension WHERE extname = 'idempotency'), '0.1.0', 'version 0.1.0');
SELECT is((SELECT extrelocatable FROM pg_extension WHERE extname = 'idempotency'), false, 'not relocatable');

-- the key table
SELECT has_table('idempotency', 'idempotency_key', 'key table exists');
SELECT columns_are('idempotency', 'idempotency_key', ARRAY[
  'owner', 'scope', 'key', 'status', 'request_hash', 'response', 'retryable',
  'attempts', 'created_at', 'updated_at', 'expires_at', 'locked_until']);
SELECT col_type_is('idempotency', 'idempotency_key', 'owner', 'regrole', 'owner is regrole');
SELECT col_type_is('idempotency', 'idempotency_key', 'scope', 'text', 'scope is text');
SELECT col_type_is('idempotency', 'idempotency_key', 'key', 'text', 'key is text');
SELECT col_type_is('idempotency', 'idempotency_key', 'status', 'text', 'status is text');
SELECT col_type_is('idempotency', 'idempotency_key', 'request_hash', 'bytea', 'request_hash is bytea');
SELECT col_type_is('idempotency', 'idempotency_key', 'response', 'jsonb', 'response is jsonb');
SELECT col_type_is('idempotency', 'idempotency_key', 'attempts', 'integer', 'attempts is integer');
SELECT col_type_is('idempotency', 'idempotency_key', 'expires_at', 'timestamp with time zone', 'expires_at is timestamptz');
SELECT col_type_is('idempotency', 'idempotency_key', 'locked_until', 'timestamp with time zone', 'locked_until is timestamptz');
SELECT col_not_null('idempotency', 'idempotency_key', 'owner', 'owner is NOT NULL');
SELECT col_not_null('idempotency', 'idempotency_key', 'key', 'key is NOT NULL');
SELECT col_not_null('idempotency', 'idempotency_key', 'expires_at', 'expires_at is NOT NULL');
SELECT col_default_is('idempotency', 'idempotency_key', 'scope', '', 'scope defaults to empty');
SELECT has_pk('idempotency', 'idempotency_key', 'key table has a primary key');
SELECT col_is_pk('idempotency', 'idempotency_key', ARRAY['owner', 'scope', 'key'], 'primary key is (owner, scope, key)');
SELECT is((SELECT collname FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
            WHERE attrelid = 'idempotency.idempotency_key'::regclass AND attname = 'key'),
          'C', 'key compares bytewise (COLLATE "C")');
SELECT col_has_check('idempotency', 'idempotency_key', 'status', 'status is checked');
SELECT throws_ok(
  $$INSERT INTO idempotency.idempotency_key (owner, key, status, expires_at)
    VALUES ('postgres', 'x', 'bogus', now())$$,
  '23514', NULL, 'an unknown status is refused');

-- kept by pg_dump
SELECT ok((SELECT 'idempotency.idempotency_key'::regclass = ANY (extconfig)
             FROM pg_extension WHERE extname = 'idempotency'),
          'key table is marked for pg_dump (pg_extension_config_dump)');

-- row-level security: plain roles read their own rows only
SELECT ok((SELECT relrowsecurity FROM pg_class WHERE oid = 'idempotency.idempotency_key'::regclass),
          'row-level security is enabled');
SELECT policies_are('idempotency', 'idempotency_key', ARRAY['idempotency_key_own_rows']);
SELECT policy_cmd_is('idempotency', 'idempotency_key', 'idempotency_key_own_rows', 'SELECT',
                     'the policy is for SELECT only');

-- privileges
SELECT table_privs_are('idempotency', 'idempotency_key', 'public', ARRAY['SELECT'],
                       'PUBLIC may only SELECT the key table');
SELECT schema_privs_are('idempotency', 'public', ARRAY['USAGE'], 'PUBLIC may use the schema');

-- functions and their signatures
SELECT functions_are('idempotency', ARRAY['begin', 'complete', 'fail', 'fingerprint']);
SELECT has_function('idempotency', 'begin', ARRAY['text', 'jsonb', 'text', 'interval', 'interval']);
SELECT has_function('idempotency', 'complete', ARRAY['text', 'jsonb', 'text']);
SELECT has_function('idempotency', 'fail', ARRAY['text', 'jsonb', 'text', 'boolean']);
SELECT has_function('idempotency', 'fingerprint', ARRAY['jsonb']);
SELECT function_returns('idempotency', 'begin', ARRAY['text', 'jsonb', 'text', 'interval', 'interval'], 'record');
SELECT is((SELECT pg_get_function_arguments('idempotency.begin(text,jsonb,text,interval,interval)'::regprocedure)),
          'key text, request jsonb DEFAULT NULL::jsonb, scope text DEFAULT ''''::text, ttl interval DEFAULT NULL::interval, lease interval DEFAULT NULL::interval, OUT outcome text, OUT status text, OUT response jsonb, OUT attempts integer, OUT created_at timestamp with time zone',
          'begin() arguments and defaults');
SELECT function_returns('idempotency', 'complete', ARRAY['text', 'jsonb', 'text'], 'void');
SELECT function_returns('idempotency', 'fail', ARRAY['text', 'jsonb', 'text', 'boolean'], 'void');
SELECT function_returns('idempotency', 'fingerprint', ARRAY['jsonb'], 'bytea');
SELECT function_lang_is('idempotency', 'begin', ARRAY['text', 'jsonb', 'text', 'interval', 'interval'], 'c');
SELECT volatility_is('idempotency', 'begin', ARRAY['text', 'jsonb', 'text', 'interval', 'interval'], 'volatile');
SELECT volatility_is('idempotency', 'fingerprint', ARRAY['jsonb'], 'immutable');
SELECT is_strict('idempotency', 'fingerprint', ARRAY['jsonb']);
SELECT isnt_strict('idempotency', 'begin', ARRAY['text', 'jsonb', 'text', 'interval', 'interval'],
                   'begin() is not strict: a NULL key is an error, not a NULL');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace AND prosecdef),
          0, 'every function is SECURITY INVOKER');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace
             AND proname <> 'fingerprint' AND proparallel <> 'u'),
          0, 'functions that lock and write are PARALLEL UNSAFE');
SELECT is((SELECT count(*)::int FROM pg_proc p
             WHERE pronamespace = 'idempotency'::regnamespace
               AND obj_description(p.oid, 'pg_proc') IS NULL),
          0, 'every function has a comment');
SELECT function_privs_are('idempotency', 'begin', ARRAY['text', 'jsonb', 'text', 'interval', 'interval'],
                          'public', ARRAY['EXECUTE'], 'PUBLIC may call begin()');
SELECT function_privs_are('idempotency', 'fingerprint', ARRAY['jsonb'], 'public', ARRAY['EXECUTE'],
                          'PUBLIC may call fingerprint()');

SELECT * FROM finish();
ROLLBACK;
