-- pgTAP: the installed objects, their signatures, attributes and privileges.
BEGIN;
SELECT plan(141);

-- schema and extension
SELECT has_schema('idempotency');
SELECT has_extension('idempotency', 'idempotency');
SELECT is((SELECT extversion FROM pg_extension WHERE extname = 'idempotency'), '0.6.0', 'version 0.6.0');
SELECT is((SELECT extrelocatable FROM pg_extension WHERE extname = 'idempotency'), false, 'not relocatable');

-- the key table
SELECT has_table('idempotency', 'idempotency_key', 'key table exists');
SELECT columns_are('idempotency', 'idempotency_key', ARRAY[
  'owner', 'scope', 'key', 'status', 'request_hash', 'response', 'retryable',
  'attempts', 'created_at', 'updated_at', 'expires_at', 'locked_until',
  'recovery_point', 'recovery_state', 'derive_seed']);
SELECT col_type_is('idempotency', 'idempotency_key', 'derive_seed', 'bytea', 'derive_seed is bytea');
-- idempotency.roleref (Citus's owner columns): no binary form, so every copy
-- between nodes carries the role's name; binary-coercible to oid
SELECT has_type('idempotency', 'roleref', 'type roleref exists');
SELECT is((SELECT typsend::oid = 0 AND typreceive::oid = 0 FROM pg_type
            WHERE oid = 'idempotency.roleref'::regtype), true, 'roleref has no binary send/receive');
SELECT is((SELECT castmethod::text || castcontext::text FROM pg_cast
            WHERE castsource = 'idempotency.roleref'::regtype AND casttarget = 'oid'::regtype),
          'bi', 'roleref casts to oid implicitly, without a function');
SELECT col_is_null('idempotency', 'idempotency_key', 'derive_seed', 'derive_seed may be NULL (a row restored from a dump of 0.5.0)');
SELECT col_hasnt_default('idempotency', 'idempotency_key', 'derive_seed', 'derive_seed has no DEFAULT (the library draws it; a restored 0.5.0 row stays without)');
SELECT col_default_is('idempotency', 'derive_secret', 'restored_050', 'true', 'derive_secret.restored_050 defaults to true (the rows a dump of 0.5.0 restores)');
SELECT col_type_is('idempotency', 'idempotency_key', 'owner', 'idempotency.roleref', 'owner is idempotency.roleref (by name in every copy: logical replication, dumps)');
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
SELECT col_is_pk('idempotency', 'idempotency_key', ARRAY['key', 'scope', 'owner'], 'primary key is (key, scope, owner): the column that differs first');
SELECT is((SELECT collname FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
            WHERE attrelid = 'idempotency.idempotency_key'::regclass AND attname = 'key'),
          'C', 'key compares bytewise (COLLATE "C")');
SELECT is((SELECT count(*)::int FROM pg_constraint
             WHERE conrelid = 'idempotency.idempotency_key'::regclass AND contype = 'c'),
          0, 'no CHECK constraints on the key table (re-read on every insert; the functions guarantee them)');

-- the other tables
SELECT tables_are('idempotency', ARRAY['idempotency_key', 'token', 'seen_message', 'state_machine', 'lock_secret',
                                       'derive_secret', 'outbox_topic', 'outbox_grant', 'outbox_message',
                                       'key_route', 'token_route']);
-- the lock secret: one 16-byte row, nobody but the owner may read it, not dumped
SELECT is((SELECT count(*)::int FROM idempotency.lock_secret WHERE length(secret) = 16), 1,
          'lock_secret holds one 16-byte secret');
SELECT table_privs_are('idempotency', 'lock_secret', 'public', ARRAY[]::text[],
                       'PUBLIC has no privilege on lock_secret');
SELECT throws_ok($$INSERT INTO idempotency.lock_secret VALUES ('\x00112233445566778899aabbccddeeff')$$,
                 '23505', NULL, 'lock_secret holds one row only');
SELECT trigger_is('idempotency', 'lock_secret', 'lock_secret_changed', 'idempotency', 'lock_secret_changed',
                  'a change to the secret reaches every session (trigger)');
SELECT function_privs_are('idempotency', 'lock_secret_changed', ARRAY[]::text[], 'public', ARRAY[]::text[],
                          'PUBLIC cannot execute lock_secret_changed()');
SELECT columns_are('idempotency', 'state_machine', ARRAY['machine', 'transitions', 'owner', 'updated_at']);
SELECT table_privs_are('idempotency', 'state_machine', 'public', ARRAY['SELECT'],
                       'PUBLIC may only SELECT state machines');
SELECT columns_are('idempotency', 'token', ARRAY['token', 'owner', 'scope', 'created_at', 'expires_at']);
SELECT col_is_pk('idempotency', 'token', 'token', 'token is the primary key of token');
SELECT columns_are('idempotency', 'seen_message',
                   ARRAY['owner', 'scope', 'message_id', 'first_seen_at', 'expires_at']);
SELECT col_is_pk('idempotency', 'seen_message', ARRAY['message_id', 'scope', 'owner'],
                 'seen_message is keyed by (message_id, scope, owner)');
SELECT indexes_are('idempotency', 'idempotency_key', ARRAY['idempotency_key_pkey', 'idempotency_key_expires_at_idx']);
SELECT has_index('idempotency', 'token', 'token_expires_at_idx', 'expires_at', 'tokens are purged by expires_at');
SELECT has_index('idempotency', 'seen_message', 'seen_message_expires_at_idx', 'expires_at',
                 'messages are purged by expires_at');

-- kept by pg_dump
SELECT is((SELECT array_agg(c::regclass::text ORDER BY c::regclass::text)
             FROM pg_extension, unnest(extconfig) c WHERE extname = 'idempotency'),
          ARRAY['idempotency.derive_secret', 'idempotency.idempotency_key', 'idempotency.outbox_grant', 'idempotency.outbox_message',
                'idempotency.outbox_message_id_seq', 'idempotency.outbox_topic', 'idempotency.outbox_topic_id_seq',
                'idempotency.seen_message', 'idempotency.state_machine', 'idempotency.token'],
          'every table is marked for pg_dump (pg_extension_config_dump)');

-- row-level security: plain roles read their own rows only; the secret
-- tables have it with no policy (no row for a role that may SELECT them
-- without owning them, such as pg_read_all_data)
SELECT is((SELECT array_agg(relname::text ORDER BY relname) FROM pg_class
             WHERE relnamespace = 'idempotency'::regnamespace AND relkind = 'r' AND relrowsecurity),
          ARRAY['derive_secret', 'idempotency_key', 'lock_secret', 'outbox_grant', 'outbox_message',
                'outbox_topic', 'seen_message', 'token'],
          'row-level security on every table whose rows belong to roles, and on the secret tables');
SELECT is((SELECT count(*)::int FROM pg_policy
             WHERE polrelid IN ('idempotency.lock_secret'::regclass, 'idempotency.derive_secret'::regclass)),
          0, 'the secret tables have no policy');
SELECT policies_are('idempotency', 'idempotency_key', ARRAY['idempotency_key_own_rows']);
SELECT policy_cmd_is('idempotency', 'idempotency_key', 'idempotency_key_own_rows', 'SELECT',
                     'the policy is for SELECT only');

-- privileges
SELECT table_privs_are('idempotency', 'idempotency_key', 'public', ARRAY['SELECT'],
                       'PUBLIC may only SELECT the key table');
SELECT table_privs_are('idempotency', 'token', 'public', ARRAY['SELECT'], 'PUBLIC may only SELECT tokens');
SELECT table_privs_are('idempotency', 'seen_message', 'public', ARRAY['SELECT'],
                       'PUBLIC may only SELECT seen messages');
SELECT policies_are('idempotency', 'token', ARRAY['token_own_rows']);
SELECT policies_are('idempotency', 'seen_message', ARRAY['seen_message_own_rows']);
SELECT policies_are('idempotency', 'outbox_message', ARRAY['outbox_message_own_rows']);
SELECT policies_are('idempotency', 'outbox_topic', ARRAY['outbox_topic_own_rows']);
SELECT policies_are('idempotency', 'outbox_grant', ARRAY['outbox_grant_own_rows']);
SELECT table_privs_are('idempotency', 'outbox_message', 'public', ARRAY['SELECT'],
                       'PUBLIC may only SELECT outbox messages');
SELECT schema_privs_are('idempotency', 'public', ARRAY['USAGE'], 'PUBLIC may use the schema');

-- functions and their signatures
SELECT functions_are('idempotency', ARRAY['begin', 'complete', 'fail', 'fingerprint', 'purge',
                                        'issue_token', 'consume_token', 'first_seen',
                                        'create_machine', 'transition', 'update_versioned', 'insert_once',
                                        'forget', 'renew', 'stats', 'stats_reset', 'key_health',
                                        'once', 'lookup', 'http_response', 'lock_secret_changed',
                                        'checkpoint', 'derive_key', 'distribute',
                                        'create_topic', 'alter_topic', 'drop_topic', 'grant_topic', 'revoke_topic',
                                        'publish', 'claim', 'ack', 'nack', 'release', 'redrive', 'wait_for',
                                        'roleref_in', 'roleref_out', 'roleref_eq',
                                        '_outbox_claimed', '_outbox_attempt', '_outbox_claim', '_outbox_counts']);
SELECT is((SELECT pg_get_function_arguments('idempotency.wait_for(text[],interval,bigint[])'::regprocedure)),
          'topics text[], timeout interval DEFAULT ''00:00:30''::interval, since bigint[] DEFAULT NULL::bigint[], OUT woken text[], OUT cursor bigint[]',
          'wait_for() arguments, defaults and result');
SELECT is((SELECT pg_get_function_arguments('idempotency.transition(regclass,anyelement,text,text,name,name)'::regprocedure)),
          'target regclass, id anyelement, to_state text, machine text, state_column name DEFAULT ''status''::name, id_column name DEFAULT ''id''::name',
          'transition() arguments and defaults');
SELECT is((SELECT pg_get_function_arguments('idempotency.update_versioned(regclass,anyelement,bigint,jsonb,name,name)'::regprocedure)),
          'target regclass, id anyelement, expected_version bigint, changes jsonb, version_column name DEFAULT ''version''::name, id_column name DEFAULT ''id''::name',
          'update_versioned() arguments and defaults');
SELECT is((SELECT pg_get_function_arguments('idempotency.insert_once(regclass,jsonb,name[])'::regprocedure)),
          'target regclass, "row" jsonb, conflict_columns name[] DEFAULT NULL::name[]',
          'insert_once() arguments and defaults');
SELECT function_returns('idempotency', 'transition', ARRAY['regclass', 'anyelement', 'text', 'text', 'name', 'name'], 'text');
SELECT function_returns('idempotency', 'update_versioned', ARRAY['regclass', 'anyelement', 'bigint', 'jsonb', 'name', 'name'], 'bigint');
SELECT function_returns('idempotency', 'insert_once', ARRAY['regclass', 'jsonb', 'name[]'], 'idempotency.insert_once_result');
SELECT has_composite('idempotency', 'insert_once_result', 'insert_once returns (inserted, row)');
SELECT has_function('idempotency', 'begin', ARRAY['text', 'jsonb', 'text', 'interval', 'interval']);
SELECT has_function('idempotency', 'complete', ARRAY['text', 'jsonb', 'text', 'integer']);
SELECT has_function('idempotency', 'fail', ARRAY['text', 'jsonb', 'text', 'boolean', 'integer']);
SELECT has_function('idempotency', 'fingerprint', ARRAY['jsonb']);
SELECT function_returns('idempotency', 'begin', ARRAY['text', 'jsonb', 'text', 'interval', 'interval'], 'idempotency.begin_result');
SELECT is((SELECT pg_get_function_arguments('idempotency.begin(text,jsonb,text,interval,interval)'::regprocedure)),
          'key text, request jsonb DEFAULT NULL::jsonb, scope text DEFAULT ''''::text, ttl interval DEFAULT NULL::interval, lease interval DEFAULT NULL::interval',
          'begin() arguments and defaults');
SELECT has_composite('idempotency', 'begin_result', 'begin() returns a named row type');
SELECT is((SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum)
             FROM pg_attribute WHERE attrelid = 'idempotency.begin_result'::regclass AND attnum > 0),
          'outcome text, status text, response jsonb, attempts integer, created_at timestamp with time zone, recovery_point text, recovery_state jsonb',
          'begin() returns (outcome, status, response, attempts, created_at, recovery_point, recovery_state)');
SELECT function_returns('idempotency', 'complete', ARRAY['text', 'jsonb', 'text', 'integer'], 'void');
SELECT function_returns('idempotency', 'fail', ARRAY['text', 'jsonb', 'text', 'boolean', 'integer'], 'void');
SELECT function_returns('idempotency', 'fingerprint', ARRAY['jsonb'], 'bytea');
SELECT function_returns('idempotency', 'purge', ARRAY['integer'], 'bigint');
SELECT function_returns('idempotency', 'issue_token', ARRAY['text', 'interval'], 'uuid');
SELECT function_returns('idempotency', 'consume_token', ARRAY['uuid', 'text'], 'boolean');
SELECT function_returns('idempotency', 'first_seen', ARRAY['text', 'text', 'interval'], 'boolean');
SELECT is((SELECT pg_get_function_arguments('idempotency.complete(text,jsonb,text,integer)'::regprocedure)),
          'key text, response jsonb, scope text DEFAULT ''''::text, attempt integer DEFAULT NULL::integer',
          'complete() arguments and defaults');
SELECT is((SELECT pg_get_function_arguments('idempotency.issue_token(text,interval)'::regprocedure)),
          'scope text DEFAULT ''''::text, ttl interval DEFAULT ''01:00:00''::interval',
          'issue_token() defaults: scope '''', ttl 1 hour');
SELECT function_lang_is('idempotency', 'begin', ARRAY['text', 'jsonb', 'text', 'interval', 'interval'], 'c');
SELECT volatility_is('idempotency', 'begin', ARRAY['text', 'jsonb', 'text', 'interval', 'interval'], 'volatile');
SELECT volatility_is('idempotency', 'fingerprint', ARRAY['jsonb'], 'immutable');
SELECT is_strict('idempotency', 'fingerprint', ARRAY['jsonb']);
SELECT isnt_strict('idempotency', 'begin', ARRAY['text', 'jsonb', 'text', 'interval', 'interval'],
                   'begin() is not strict: a NULL key is an error, not a NULL');
SELECT is((SELECT array_agg(proname::text) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace AND prosecdef),
          ARRAY['key_health'], 'every function is SECURITY INVOKER but key_health() (aggregates of every role''s keys)');
SELECT is((SELECT proconfig FROM pg_proc WHERE oid = 'idempotency.key_health()'::regprocedure),
          ARRAY['search_path=pg_catalog, pg_temp'], 'key_health() pins its search_path');
SELECT is_strict('idempotency', 'purge', ARRAY['integer']);
SELECT isnt_strict('idempotency', 'consume_token', ARRAY['uuid', 'text'],
                   'consume_token() is not strict: a NULL scope is an error');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace
             AND proname NOT IN ('fingerprint', 'stats', 'stats_reset', 'key_health', 'http_response', 'derive_key',
                                 'roleref_in', 'roleref_out', 'roleref_eq') AND proparallel <> 'u'),
          0, 'functions that lock and write are PARALLEL UNSAFE');
SELECT is((SELECT count(*)::int FROM pg_proc p
             WHERE pronamespace = 'idempotency'::regnamespace
               AND obj_description(p.oid, 'pg_proc') IS NULL),
          0, 'every function has a comment');
SELECT function_privs_are('idempotency', 'begin', ARRAY['text', 'jsonb', 'text', 'interval', 'interval'],
                          'public', ARRAY['EXECUTE'], 'PUBLIC may call begin()');
SELECT function_privs_are('idempotency', 'fingerprint', ARRAY['jsonb'], 'public', ARRAY['EXECUTE'],
                          'PUBLIC may call fingerprint()');

-- observability and operations
SELECT has_view('idempotency', 'stats', 'the statistics view exists');
SELECT columns_are('idempotency', 'stats', ARRAY[
  'dbid', 'database', 'userid', 'role', 'scope', 'begin_new', 'begin_retry', 'begin_replay',
  'completed', 'failed_retryable', 'failed_final', 'ik001_reused', 'ik002_in_progress',
  'ik004_not_held', 'waits', 'wait_total_ms', 'wait_max_ms', 'lease_takeovers',
  'zombies_refused', 'purged', 'forgotten', 'renewed', 'stats_since']);
SELECT table_privs_are('idempotency', 'stats', 'public', ARRAY['SELECT'],
                       'PUBLIC may read the statistics view (it shows each role its own rows)');
SELECT function_privs_are('idempotency', 'stats_reset', ARRAY[]::text[], 'public', ARRAY[]::text[],
                          'PUBLIC may not reset the statistics');
SELECT has_view('idempotency', 'key_health', 'the key health view exists');
SELECT columns_are('idempotency', 'key_health', ARRAY[
  'userid', 'role', 'scope', 'in_progress', 'completed', 'failed_retryable', 'failed_final',
  'oldest_in_progress_age', 'lapsed_leases', 'longest_lapse', 'expired', 'oldest_expired_age']);
SELECT table_privs_are('idempotency', 'key_health', 'public', ARRAY[]::text[],
                       'PUBLIC may not read key health (every role''s counts)');
SELECT table_privs_are('idempotency', 'key_health', 'pg_read_all_stats', ARRAY['SELECT'],
                       'pg_read_all_stats (and so pg_monitor) may read key health');
SELECT function_privs_are('idempotency', 'key_health', ARRAY[]::text[], 'public', ARRAY[]::text[],
                          'PUBLIC may not call key_health()');
SELECT function_privs_are('idempotency', 'key_health', ARRAY[]::text[], 'pg_read_all_stats', ARRAY['EXECUTE'],
                          'pg_read_all_stats (and so pg_monitor) may call key_health()');
SELECT volatility_is('idempotency', 'key_health', ARRAY[]::text[], 'stable');
SELECT function_returns('idempotency', 'forget', ARRAY['text', 'text'], 'boolean');
SELECT function_returns('idempotency', 'renew', ARRAY['text', 'interval', 'integer', 'text'],
                        'timestamp with time zone');
SELECT is((SELECT pg_get_function_arguments('idempotency.renew(text,interval,integer,text)'::regprocedure)),
          'key text, lease interval, attempt integer, scope text DEFAULT ''''::text',
          'renew() arguments and defaults');
SELECT is((SELECT pg_get_function_arguments('idempotency.forget(text,text)'::regprocedure)),
          'key text, scope text DEFAULT ''''::text', 'forget() arguments and defaults');
SELECT isnt_strict('idempotency', 'forget', ARRAY['text', 'text'],
                   'forget() is not strict: a NULL key is an error');

-- one round trip
SELECT has_function('idempotency', 'once', ARRAY['text', 'jsonb', 'text', 'text[]']);
SELECT has_function('idempotency', 'once', ARRAY['text', 'jsonb', 'text', '"any"']);
SELECT function_returns('idempotency', 'once', ARRAY['text', 'jsonb', 'text', 'text[]'], 'idempotency.once_result');
SELECT is((SELECT pg_get_function_arguments('idempotency.once(text,jsonb,text,text[])'::regprocedure)),
          'key text, request jsonb, sql text, VARIADIC args text[] DEFAULT ''{}''::text[]',
          'once() arguments: untyped arguments go to VARIADIC text[], which may be empty');
SELECT has_composite('idempotency', 'once_result', 'once() returns (outcome, response)');
SELECT function_returns('idempotency', 'lookup', ARRAY['text', 'text'], 'setof idempotency.lookup_result');
SELECT is((SELECT prorows FROM pg_proc WHERE oid = 'idempotency.lookup(text,text)'::regprocedure),
          1::real, 'lookup() returns at most one row');
SELECT function_returns('idempotency', 'http_response', ARRAY['integer', 'text', 'jsonb'], 'jsonb');
SELECT function_returns('idempotency', 'http_response', ARRAY['integer', 'bytea', 'jsonb'], 'jsonb');
SELECT volatility_is('idempotency', 'http_response', ARRAY['integer', 'text', 'jsonb'], 'immutable');
SELECT isnt_strict('idempotency', 'once', ARRAY['text', 'jsonb', 'text', 'text[]'],
                   'once() is not strict: a NULL key is IK003');

-- recovery points (0.5.0)
SELECT col_type_is('idempotency', 'idempotency_key', 'recovery_point', 'text', 'recovery_point is text');
SELECT col_type_is('idempotency', 'idempotency_key', 'recovery_state', 'jsonb', 'recovery_state is jsonb');
SELECT is((SELECT string_agg(attname, ', ' ORDER BY attnum)
             FROM pg_attribute WHERE attrelid = 'idempotency.lookup_result'::regclass AND attnum > 0),
          'status, attempts, created_at, updated_at, expires_at, locked_until, retry_after, recovery_point, recovery_state',
          'lookup() returns the recovery point and state last');
SELECT function_returns('idempotency', 'checkpoint', ARRAY['text', 'text', 'jsonb', 'integer', 'text'], 'void');
SELECT is((SELECT pg_get_function_arguments('idempotency.checkpoint(text,text,jsonb,integer,text)'::regprocedure)),
          'key text, point text, state jsonb, attempt integer, scope text DEFAULT ''''::text',
          'checkpoint() arguments and defaults');
SELECT volatility_is('idempotency', 'checkpoint', ARRAY['text', 'text', 'jsonb', 'integer', 'text'], 'volatile');
SELECT isnt_strict('idempotency', 'checkpoint', ARRAY['text', 'text', 'jsonb', 'integer', 'text'],
                   'checkpoint() is not strict: a NULL point is an error, a NULL state is stored');
SELECT function_returns('idempotency', 'derive_key', ARRAY['text', 'text', 'text'], 'text');
SELECT volatility_is('idempotency', 'derive_key', ARRAY['text', 'text', 'text'], 'stable');
SELECT is((SELECT proparallel::text FROM pg_proc WHERE oid = 'idempotency.derive_key(text,text,text)'::regprocedure),
          'r', 'derive_key() is PARALLEL RESTRICTED (it reads the secret as the owner)');
SELECT is((SELECT count(*)::int FROM idempotency.derive_secret WHERE length(secret) = 32), 1,
          'derive_secret holds one 32-byte secret');
SELECT table_privs_are('idempotency', 'derive_secret', 'public', ARRAY[]::text[],
                       'PUBLIC has no privilege on derive_secret');
-- Citus's route tables (src/keystore.c, the carried call): the owner's alone on a single
-- server (distribute() lets PUBLIC delete from them on Citus), always empty
SELECT table_privs_are('idempotency', 'key_route', 'public', ARRAY[]::text[],
                       'PUBLIC has no privilege on key_route');
SELECT table_privs_are('idempotency', 'token_route', 'public', ARRAY[]::text[],
                       'PUBLIC has no privilege on token_route');
SELECT is((SELECT count(*)::int FROM idempotency.key_route) + (SELECT count(*)::int FROM idempotency.token_route), 0,
          'the route tables are empty');

SELECT * FROM finish();
ROLLBACK;
