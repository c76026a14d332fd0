-- portable/src/stats.sql: stats() and stats_reset() (the idempotency.stats
-- view over stats() is the C edition's, unchanged).
--
-- The C edition counts events (begin() outcomes, errors, waits, purges,
-- forget(), renew()) in shared memory.  The portable edition has no shared
-- memory, and counting in a table would add a write, a dead row version
-- and a lock on a hot counter row to every call: those columns are NULL.
-- What the key table itself says is given: one row per role and scope of
-- the live (unexpired) keys, with completed, failed_retryable and
-- failed_final the number of keys now in that state (so they fall when
-- keys expire or are forgotten, where the C edition's counters only grow).
-- A role sees its own rows; superusers and members of pg_read_all_stats
-- every role's, as in the C edition.

-- @body idempotency_stats
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
RETURN QUERY
SELECT d.oid, k.owner::pg_catalog.oid, k.scope,
       NULL::pg_catalog.int8, NULL::pg_catalog.int8, NULL::pg_catalog.int8,
       pg_catalog.count(*) FILTER (WHERE k.status OPERATOR(pg_catalog.=) 'completed'),
       pg_catalog.count(*) FILTER (WHERE k.status OPERATOR(pg_catalog.=) 'failed' AND k.retryable),
       pg_catalog.count(*) FILTER (WHERE k.status OPERATOR(pg_catalog.=) 'failed' AND NOT k.retryable),
       NULL::pg_catalog.int8, NULL::pg_catalog.int8, NULL::pg_catalog.int8, NULL::pg_catalog.int8,
       NULL::pg_catalog.int8, NULL::pg_catalog.int8, NULL::pg_catalog.int8, NULL::pg_catalog.int8,
       NULL::pg_catalog.int8, NULL::pg_catalog.float8, NULL::pg_catalog.float8, NULL::pg_catalog.timestamptz
  FROM idempotency.idempotency_key AS k,
       pg_catalog.pg_database AS d
 WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
   AND k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
   AND (k.owner OPERATOR(pg_catalog.=) idempotency._caller()
        OR pg_catalog.pg_has_role(idempotency._caller()::pg_catalog.oid, 'pg_read_all_stats', 'USAGE'))
 GROUP BY d.oid, k.owner::pg_catalog.oid, k.scope;
END
$fn$
-- @end

-- Nothing to discard: every figure stats() gives is read from the key
-- table at the call.
-- @body idempotency_stats_reset
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
END
$fn$
-- @end
