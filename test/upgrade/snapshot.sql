-- test/upgrade/snapshot.sql — run as role app before and after pg_upgrade;
-- the two outputs must be equal byte for byte.  Writes nothing (replays and
-- rolled-back probes only).
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
\pset null '(null)'
-- what every finished key replays: outcome, status, attempts, the stored bytes
SELECT k.key, k.scope, b.outcome, b.status, b.attempts, b.response::text,
       coalesce(b.response->>'body', b.response->>'body_base64')
  FROM (VALUES ('c1', '', '{"amount": 1, "currency": "EUR"}'::jsonb),
               ('c2', '', '{"amount": 2}'), ('c3', '', '{"amount": 3}'),
               ('c4', '', '{"order": 1}'), ('c5', 'tenant-a', '{"amount": 5}'),
               ('c6', '', NULL), ('f-final', '', '{"amount": 8}')) AS k(key, scope, req),
       LATERAL idempotency.begin(k.key, k.req, k.scope) AS b
 ORDER BY 1, 2;
-- the stored rows themselves (apart from the lapsing lease)
SELECT key, scope, status, encode(request_hash, 'hex'), response::text, retryable, attempts,
       created_at, updated_at, expires_at, locked_until
  FROM idempotency.idempotency_key WHERE key <> 'l-short' ORDER BY key, scope;
-- the live lease's downstream key (derive_key(): its row's seed and
-- created_at), which a retry after the upgrade must send again
SELECT idempotency.derive_key('l-live', 'charge'), idempotency.derive_key('l-live', 'refund');
SELECT scope, message_id, first_seen_at, expires_at FROM idempotency.seen_message
 ORDER BY 1, 2;
SELECT token, scope, created_at, expires_at FROM idempotency.token ORDER BY 1;
SELECT machine, transitions::text FROM idempotency.state_machine ORDER BY 1;
-- the key locks' names (the secret's hash of role, scope and key)
BEGIN;
SELECT count(*) FROM idempotency.begin('probe-1') AS p1, idempotency.begin('probe-2', scope => 's') AS p2,
       idempotency.begin(repeat('x', 255), scope => 'tenant-a') AS p3;
SELECT classid, objid FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 18756 AND pid = pg_backend_pid()
 ORDER BY 1, 2;
ROLLBACK;
