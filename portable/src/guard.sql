-- portable/src/guard.sql: the key guard in PL/pgSQL — begin(), complete(),
-- fail(), lookup(), fingerprint().  Each block is the body of the C
-- function of that symbol; build.pl puts it under the C edition's CREATE
-- FUNCTION head (name, arguments, defaults, result type, volatility).
--
-- How a key is held.  The C edition holds a key in single-transaction mode
-- by a lock of its own and writes the row at complete().  Here begin()
-- writes the in_progress row at once, in the caller's transaction: a
-- duplicate's INSERT waits on the primary key's unique index for that
-- transaction to end (then sees its row, or none after a rollback), and a
-- row already there is taken with SELECT ... FOR UPDATE.  Both waits are
-- bounded by idempotency.lock_wait through lock_timeout, set for the wait
-- only.  The primary key includes the owner, so a role can only ever wait
-- for its own keys: no other role can block, delay or detect them, and
-- nothing key-shaped shows in pg_locks (no advisory locks).  The deferred
-- trigger of internal.sql refuses a COMMIT with the row still in progress.
--
-- SECURITY DEFINER with a pinned search_path: application roles may read
-- their own rows but not write the table; these functions write it as the
-- installing role, always for the caller's role (idempotency._caller()).

-- @body idempotency_begin
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_key   ALIAS FOR $1;
    p_req   ALIAS FOR $2;
    p_scope ALIAS FOR $3;
    p_ttl   ALIAS FOR $4;
    p_lease ALIAS FOR $5;
    v_owner pg_catalog.regrole;
    v_now   pg_catalog.timestamptz;
    v_exp   pg_catalog.timestamptz;
    v_clock pg_catalog.timestamptz;
    v_lend  pg_catalog.timestamptz;
    v_hash  pg_catalog.bytea;
    v_wait  pg_catalog.int8;
    v_lt    pg_catalog.text;
    v_found pg_catalog.bool;
    v_live  pg_catalog.bool;
    v_locked pg_catalog.bool;
    v_ins   pg_catalog.bool;
    v_rows  pg_catalog.int8;
    v_con   pg_catalog.text;
    v_loops pg_catalog.int4;
    r       record;
    res     idempotency.begin_result;
BEGIN
    -- IK003, then 22023 for a bad ttl or lease, before anything else as
    -- in the C edition.  One quick test for the common call (no ttl, no
    -- lease, max_key_length unset, a key and scope of at most its default
    -- 255 in bytes): each PL/pgSQL statement sets up its expression once
    -- per transaction, and each function in it costs a catalog lookup and
    -- a privilege check there, so the path of a replay has as few
    -- statements and functions as it can.  The default ttl is read only
    -- when a row is written.
    IF (p_ttl IS NULL AND p_lease IS NULL AND p_key <> ''
        AND pg_catalog.octet_length(p_key) + pg_catalog.octet_length(p_scope) <= 255
        AND pg_catalog.current_setting('idempotency.max_key_length', true) IS NULL) IS NOT TRUE THEN
        -- (the key's test in full: _check_key() only when it fails)
        IF p_key IS NULL OR p_scope IS NULL OR p_key = ''
           OR pg_catalog.octet_length(p_key) + pg_catalog.octet_length(p_scope)
              > LEAST(coalesce(NULLIF(pg_catalog.current_setting('idempotency.max_key_length', true), '')::pg_catalog.int4, 255), 1024) THEN
            PERFORM idempotency._check_key(p_key, p_scope);
        END IF;
        IF p_ttl IS NOT NULL THEN
            v_exp := pg_catalog.now() + p_ttl;
            IF v_exp <= pg_catalog.now() THEN
                RAISE EXCEPTION 'ttl must be positive' USING ERRCODE = 'invalid_parameter_value';
            END IF;
        END IF;
        IF p_lease IS NOT NULL THEN
            v_clock := pg_catalog.clock_timestamp();
            v_lend := v_clock + p_lease;
            IF v_lend <= v_clock THEN
                RAISE EXCEPTION 'lease must be positive' USING ERRCODE = 'invalid_parameter_value';
            END IF;
        END IF;
    END IF;
    v_owner := idempotency._caller();

    -- a replay: a live finished key, and the same request (or none given;
    -- the fingerprint, a function of ours, only when one is); anything
    -- else is decided below, on the row read again
    SELECT k.status, k.request_hash, k.response, k.retryable, k.attempts, k.created_at,
           k.expires_at, k.locked_until, k.recovery_point, k.recovery_state, k.xmin AS x,
           k.expires_at > pg_catalog.now() AND (k.status = 'completed' OR (k.status = 'failed' AND NOT k.retryable)) AS fin
      INTO r
      FROM idempotency.idempotency_key AS k
     WHERE k.key = p_key AND k.scope = p_scope AND k.owner = v_owner;
    IF r.fin THEN
        IF p_req IS NULL OR r.request_hash IS NULL THEN
            RETURN ROW('replay', r.status, r.response, r.attempts, r.created_at,
                       r.recovery_point, r.recovery_state)::idempotency.begin_result;
        END IF;
        v_hash := idempotency.fingerprint(p_req);
        IF r.request_hash = v_hash THEN
            RETURN ROW('replay', r.status, r.response, r.attempts, r.created_at,
                       r.recovery_point, r.recovery_state)::idempotency.begin_result;
        END IF;
    END IF;
    v_found := FOUND;
    v_now := pg_catalog.now();
    v_locked := false;
    v_loops := 0;
    LOOP
        v_live := v_found AND r.expires_at > v_now;

        -- this transaction holds it already (a lease row: if this
        -- transaction wrote it; a row without one is never committed in
        -- progress, so it is this transaction's)
        IF v_live AND r.status = 'in_progress'
           AND (r.locked_until IS NULL OR idempotency._mine(r.x)) THEN
            RAISE EXCEPTION '% is already in progress in this transaction', idempotency._describe(p_key, p_scope)
                USING ERRCODE = 'IK002',
                      DETAIL = 'This transaction began it and has not completed or failed it yet.',
                      HINT = 'Call idempotency.complete() or idempotency.fail() before beginning it again.';
        END IF;

        IF p_req IS NOT NULL AND v_hash IS NULL THEN
            v_hash := idempotency.fingerprint(p_req);
        END IF;
        IF v_live AND v_hash IS NOT NULL AND r.request_hash IS NOT NULL AND r.request_hash <> v_hash THEN
            RAISE EXCEPTION '% was already used with a different request', idempotency._describe(p_key, p_scope)
                USING ERRCODE = 'IK001',
                      DETAIL = 'The key''s stored request and this one differ; neither, nor anything computed from them, is shown.',
                      HINT = 'Use a new idempotency key for a new request (HTTP 422).';
        END IF;

        -- replay: finished, nothing to write
        IF v_live AND (r.status = 'completed' OR (r.status = 'failed' AND NOT r.retryable)) THEN
            RETURN ROW('replay', r.status, r.response, r.attempts, r.created_at,
                       r.recovery_point, r.recovery_state)::idempotency.begin_result;
        END IF;

        -- a live lease keeps everybody else out; a lapsed one is taken over
        IF v_live AND r.status = 'in_progress' AND r.locked_until IS NOT NULL THEN
            IF v_clock IS NULL THEN
                v_clock := pg_catalog.clock_timestamp();
            END IF;
            IF r.locked_until > v_clock THEN
                RAISE EXCEPTION '% is in progress under a lease', idempotency._describe(p_key, p_scope)
                    USING ERRCODE = 'IK002',
                          DETAIL = pg_catalog.format('Attempt %s holds it until %s; retry after %s seconds.', r.attempts,
                                     pg_catalog.to_char(pg_catalog.date_trunc('second', r.locked_until AT TIME ZONE 'UTC')
                                                        + CASE WHEN pg_catalog.date_trunc('second', r.locked_until) = r.locked_until
                                                               THEN '0'::pg_catalog.interval ELSE '1 second'::pg_catalog.interval END,
                                                        'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                                     LEAST(GREATEST(pg_catalog.ceil(EXTRACT(EPOCH FROM r.locked_until - v_clock)), 0), 2147483647)::pg_catalog.int4),
                          HINT = 'Retry after the lease ends (HTTP 409 with Retry-After); the first begin() after that takes the key over.';
            END IF;
        END IF;

        -- new or retry: the outcome of the work must be storable here
        IF pg_catalog.current_setting('transaction_read_only')::pg_catalog.bool THEN
            RAISE EXCEPTION 'cannot begin work under % in a read-only transaction', idempotency._describe(p_key, p_scope)
                USING ERRCODE = 'read_only_sql_transaction',
                      DETAIL = CASE WHEN pg_catalog.pg_is_in_recovery()
                                    THEN 'This server is a hot standby: it replays finished keys, but the outcome of new work could not be stored here.'
                                    ELSE 'The outcome of the work could not be stored.' END,
                      HINT = CASE WHEN pg_catalog.pg_is_in_recovery()
                                  THEN 'Send requests that do work to the primary server.'
                                  ELSE 'Begin new keys in a read-write transaction.' END;
        END IF;

        IF v_exp IS NULL THEN
            -- (unset, the default without a call: _setting_ms()'s default,
            -- make_interval(secs => 86400.0), is 24 hours)
            v_exp := v_now + CASE WHEN pg_catalog.current_setting('idempotency.default_ttl', true) IS NULL
                                  THEN '86400 seconds'::pg_catalog.interval
                                  ELSE pg_catalog.make_interval(secs => idempotency._setting_ms('idempotency.default_ttl', 1000, 86400000) / 1000.0) END;
        END IF;

        -- Take the key: lock the row that is there, or insert the row.  A
        -- transaction holding either makes this wait, at most lock_wait.
        IF NOT v_locked OR NOT v_found THEN
            v_wait := CASE WHEN pg_catalog.current_setting('idempotency.lock_wait', true) IS NULL THEN 5000
                           ELSE idempotency._setting_ms('idempotency.lock_wait', 1, 5000) END;
            v_lt := pg_catalog.current_setting('lock_timeout');
            BEGIN
                PERFORM pg_catalog.set_config('lock_timeout',
                                              CASE WHEN v_wait = 0 THEN '1' ELSE LEAST(v_wait, 2147483647)::pg_catalog.text END,
                                              true);
                IF v_found THEN
                    SELECT k.status, k.request_hash, k.response, k.retryable, k.attempts, k.created_at,
                           k.expires_at, k.locked_until, k.recovery_point, k.recovery_state, k.xmin AS x,
                           NULL::pg_catalog.bool AS fin
                      INTO r
                      FROM idempotency.idempotency_key AS k
                     WHERE k.key = p_key AND k.scope = p_scope AND k.owner = v_owner
                       FOR UPDATE;
                    v_found := FOUND;
                    v_locked := true;
                    v_ins := false;
                ELSE
                    INSERT INTO idempotency.idempotency_key AS k
                           (owner, scope, key, status, request_hash, response, retryable, attempts,
                            created_at, updated_at, expires_at, locked_until, derive_seed)
                    VALUES (v_owner, p_scope, p_key, 'in_progress', v_hash, NULL, NULL, 1,
                            v_now, v_now, GREATEST(v_exp, v_lend), v_lend, idempotency._new_seed());
                    GET DIAGNOSTICS v_rows = ROW_COUNT;
                    IF v_rows <> 1 THEN
                        RAISE EXCEPTION '% was not stored in table idempotency.idempotency_key', idempotency._describe(p_key, p_scope)
                            USING ERRCODE = 'triggered_action_exception',
                                  DETAIL = 'A trigger or rule on the table skipped the row, so a duplicate could not find it.';
                    END IF;
                    v_ins := true;
                END IF;
                PERFORM pg_catalog.set_config('lock_timeout', v_lt, true);
            EXCEPTION
                WHEN lock_not_available THEN
                    RAISE EXCEPTION '% is in progress in another transaction', idempotency._describe(p_key, p_scope)
                        USING ERRCODE = 'IK002',
                              DETAIL = pg_catalog.format('Another transaction holds it; this request waited %s ms (idempotency.lock_wait).', v_wait),
                              HINT = 'Retry after the first request has finished (HTTP 409 with Retry-After).';
                WHEN unique_violation THEN
                    GET STACKED DIAGNOSTICS v_con = CONSTRAINT_NAME;
                    IF v_con <> 'idempotency_key_pkey' THEN
                        RAISE;      -- a unique index a DBA added
                    END IF;
                    -- another transaction's row came first (this one waited
                    -- for it to commit): look again, unless this
                    -- transaction's snapshot cannot see it
                    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
                        RAISE EXCEPTION 'could not serialize access due to concurrent use of %', idempotency._describe(p_key, p_scope)
                            USING ERRCODE = 'serialization_failure',
                                  DETAIL = 'Another transaction stored a result for this key after this transaction took its snapshot.',
                                  HINT = 'Retry the transaction; it will see the stored result.';
                    END IF;
                    v_ins := false;
                    v_locked := false;
                WHEN serialization_failure THEN
                    RAISE EXCEPTION 'could not serialize access due to concurrent use of %', idempotency._describe(p_key, p_scope)
                        USING ERRCODE = 'serialization_failure',
                              DETAIL = 'Another transaction stored a result for this key after this transaction took its snapshot.',
                              HINT = 'Retry the transaction; it will see the stored result.';
            END;
            IF v_ins THEN
                res.outcome := 'new';
                res.status := 'in_progress';
                res.attempts := 1;
                res.created_at := v_now;
                RETURN res;
            END IF;
            -- locked the row (look at it again as it is now), or another
            -- transaction's row came first (look again); each turn follows a
            -- change another transaction committed
            v_loops := v_loops + 1;
            IF v_loops > 1000 THEN
                RAISE EXCEPTION 'could not take % after 1000 attempts', idempotency._describe(p_key, p_scope)
                    USING ERRCODE = 'lock_not_available';
            END IF;
            IF NOT v_locked THEN
                SELECT k.status, k.request_hash, k.response, k.retryable, k.attempts, k.created_at,
                       k.expires_at, k.locked_until, k.recovery_point, k.recovery_state, k.xmin AS x,
                       NULL::pg_catalog.bool AS fin
                  INTO r
                  FROM idempotency.idempotency_key AS k
                 WHERE k.key = p_key AND k.scope = p_scope AND k.owner = v_owner;
                v_found := FOUND;
            END IF;
            CONTINUE;
        END IF;

        -- the row is locked by this transaction: new work over an expired
        -- row (its recovery point goes), or a retry of a live one
        UPDATE idempotency.idempotency_key AS k
           SET status = 'in_progress',
               request_hash = coalesce(v_hash, CASE WHEN v_live THEN r.request_hash END),
               response = CASE WHEN v_live THEN r.response END,
               retryable = NULL,
               attempts = CASE WHEN v_live THEN r.attempts + 1 ELSE 1 END,
               created_at = CASE WHEN v_live THEN r.created_at ELSE v_now END,
               updated_at = v_now,
               expires_at = GREATEST(v_exp, v_lend),
               locked_until = v_lend,
               recovery_point = CASE WHEN v_live THEN r.recovery_point END,
               recovery_state = CASE WHEN v_live THEN r.recovery_state END,
               -- a new life draws a new seed; a retry keeps the row's
               -- (and freezes one for a row restored from 0.5.0)
               derive_seed = CASE WHEN v_live THEN coalesce(k.derive_seed, idempotency._frozen_seed(k.owner, k.created_at))
                                  ELSE idempotency._new_seed() END
         WHERE k.key = p_key AND k.scope = p_scope AND k.owner = v_owner;
        res.outcome := CASE WHEN v_live THEN 'retry' ELSE 'new' END;
        res.status := 'in_progress';
        res.response := CASE WHEN v_live THEN r.response END;
        res.attempts := CASE WHEN v_live THEN r.attempts + 1 ELSE 1 END;
        res.created_at := CASE WHEN v_live THEN r.created_at ELSE v_now END;
        res.recovery_point := CASE WHEN v_live THEN r.recovery_point END;
        res.recovery_state := CASE WHEN v_live THEN r.recovery_state END;
        RETURN res;
    END LOOP;
END
$fn$
-- @end

-- @body idempotency_complete
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    PERFORM idempotency._finish($1, $3, 'completed', $2, NULL, $4);
END
$fn$
-- @end

-- @body idempotency_fail
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF $4 IS NULL THEN
        RAISE EXCEPTION 'retryable must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM idempotency._finish($1, $3, 'failed', $2, $4, $5);
END
$fn$
-- @end

-- @body idempotency_lookup
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_key   ALIAS FOR $1;
    p_scope ALIAS FOR $2;
    v_clock pg_catalog.timestamptz := pg_catalog.clock_timestamp();
BEGIN
    -- (begin()'s quick test of the key, then the full one)
    IF (p_key OPERATOR(pg_catalog.<>) ''
        AND pg_catalog.octet_length(p_key) OPERATOR(pg_catalog.+) pg_catalog.octet_length(p_scope) OPERATOR(pg_catalog.<=) 255
        AND pg_catalog.current_setting('idempotency.max_key_length', true) IS NULL) IS NOT TRUE THEN
        IF p_key IS NULL OR p_scope IS NULL OR p_key OPERATOR(pg_catalog.=) ''
           OR pg_catalog.octet_length(p_key) OPERATOR(pg_catalog.+) pg_catalog.octet_length(p_scope)
              OPERATOR(pg_catalog.>) LEAST(coalesce(NULLIF(pg_catalog.current_setting('idempotency.max_key_length', true), '')::pg_catalog.int4, 255), 1024) THEN
            PERFORM idempotency._check_key(p_key, p_scope);
        END IF;
    END IF;
    -- Only rows: a key another transaction holds in single-transaction
    -- mode is a row that transaction has not committed, invisible here
    -- (the C edition sees its lock and answers in_progress).
    RETURN QUERY
    SELECT k.status, k.attempts, k.created_at, k.updated_at, k.expires_at, k.locked_until,
           CASE WHEN k.status = 'completed' OR (k.status = 'failed' AND NOT k.retryable) THEN NULL
                WHEN k.status = 'in_progress' AND k.locked_until IS NOT NULL
                THEN LEAST(GREATEST(pg_catalog.ceil(EXTRACT(EPOCH FROM k.locked_until - v_clock)), 0), 2147483647)::pg_catalog.int4
                ELSE 0 END,
           k.recovery_point, k.recovery_state
      FROM idempotency.idempotency_key AS k
     WHERE k.key = p_key AND k.scope = p_scope AND k.owner = idempotency._caller()
       AND k.expires_at > pg_catalog.now();
END
$fn$
-- @end

-- @body idempotency_fingerprint
LANGUAGE plpgsql
AS $fn$
BEGIN
    -- a large value (its size bounds its depth: at least 8 bytes a level;
    -- a compressed one says nothing) is encoded without recursion
    IF pg_catalog.pg_column_size($1) OPERATOR(pg_catalog.>) 800 OR pg_catalog.pg_column_compression($1) IS NOT NULL THEN
        IF pg_catalog.jsonb_typeof($1) OPERATOR(pg_catalog.=) ANY ('{object,array}'::pg_catalog.text[]) THEN
            RETURN pg_catalog.sha256(idempotency._fp_flat($1));
        END IF;
        RETURN pg_catalog.sha256('\x7200000001'::pg_catalog.bytea OPERATOR(pg_catalog.||) idempotency._fp_flat($1)
                                 OPERATOR(pg_catalog.||) '\x5d00000000'::pg_catalog.bytea);
    END IF;
    -- a scalar at the top is jsonb's one-element raw-scalar array
    IF pg_catalog.jsonb_typeof($1) OPERATOR(pg_catalog.=) ANY ('{object,array}'::pg_catalog.text[]) THEN
        RETURN pg_catalog.sha256(idempotency._fp_value($1));
    END IF;
    RETURN pg_catalog.sha256('\x7200000001'::pg_catalog.bytea OPERATOR(pg_catalog.||) idempotency._fp_value($1)
                             OPERATOR(pg_catalog.||) '\x5d00000000'::pg_catalog.bytea);
END
$fn$
-- @end

-- @tail
-- The attempt that holds a key's lease: the row locked (a takeover waits
-- for this transaction), IK004 unless the key is live, in progress and at
-- that attempt.  For complete(), fail() and renew() of a lease begun in
-- an earlier transaction.
CREATE FUNCTION idempotency._lease_holder(p_key pg_catalog.text, p_scope pg_catalog.text,
                                          p_attempt pg_catalog.int4, p_owner pg_catalog.regrole)
RETURNS record
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
#variable_conflict use_column
DECLARE
    v_msg pg_catalog.text := pg_catalog.format('%s is not held by attempt %s', idempotency._describe(p_key, p_scope), p_attempt);
    r record;
BEGIN
    IF pg_catalog.current_setting('transaction_read_only')::pg_catalog.bool THEN
        -- no row lock in a read-only transaction: the checks only (the
        -- caller refuses to write after them, 25006)
        SELECT k.status, k.attempts, k.expires_at, k.locked_until INTO r
          FROM idempotency.idempotency_key AS k
         WHERE k.key OPERATOR(pg_catalog.=) p_key AND k.scope OPERATOR(pg_catalog.=) p_scope
           AND k.owner OPERATOR(pg_catalog.=) p_owner;
    ELSE
        SELECT k.status, k.attempts, k.expires_at, k.locked_until INTO r
          FROM idempotency.idempotency_key AS k
         WHERE k.key OPERATOR(pg_catalog.=) p_key AND k.scope OPERATOR(pg_catalog.=) p_scope
           AND k.owner OPERATOR(pg_catalog.=) p_owner
           FOR UPDATE;
    END IF;
    IF NOT FOUND OR r.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() THEN
        RAISE EXCEPTION '%', v_msg USING ERRCODE = 'IK004',
            DETAIL = 'No such key exists for this role, or it expired.';
    ELSIF r.status OPERATOR(pg_catalog.<>) 'in_progress' AND r.attempts OPERATOR(pg_catalog.=) p_attempt THEN
        RAISE EXCEPTION '%', v_msg USING ERRCODE = 'IK004',
            DETAIL = pg_catalog.format('This attempt (%s) already %s the key; the stored outcome stands.', p_attempt, r.status),
            HINT = 'A second complete() or fail() of the same attempt, e.g. after a lost acknowledgement, changes nothing.';
    ELSIF r.status OPERATOR(pg_catalog.<>) 'in_progress' AND r.attempts OPERATOR(pg_catalog.>) p_attempt THEN
        RAISE EXCEPTION '%', v_msg USING ERRCODE = 'IK004',
            DETAIL = pg_catalog.format('Attempt %s took the key over after the lease of attempt %s ended, and %s it; this result is discarded.',
                                       r.attempts, p_attempt, r.status),
            HINT = 'Make leases longer than the work takes.';
    ELSIF r.status OPERATOR(pg_catalog.<>) 'in_progress' THEN
        RAISE EXCEPTION '%', v_msg USING ERRCODE = 'IK004',
            DETAIL = pg_catalog.format('The key is already %s, at attempt %s.', r.status, r.attempts);
    ELSIF r.attempts OPERATOR(pg_catalog.>) p_attempt THEN
        RAISE EXCEPTION '%', v_msg USING ERRCODE = 'IK004',
            DETAIL = pg_catalog.format('Attempt %s took the key over after the lease of attempt %s ended; this result is discarded.',
                                       r.attempts, p_attempt),
            HINT = 'Make leases longer than the work takes.';
    ELSIF r.attempts OPERATOR(pg_catalog.<>) p_attempt THEN
        RAISE EXCEPTION '%', v_msg USING ERRCODE = 'IK004',
            DETAIL = pg_catalog.format('The key is at attempt %s.', r.attempts);
    END IF;
    RETURN r;
END
$fn$;
COMMENT ON FUNCTION idempotency._lease_holder(pg_catalog.text, pg_catalog.text, pg_catalog.int4, pg_catalog.regrole) IS
'Portable edition, internal: lock the key''s row and check that attempt holds its lease (IK004 otherwise)';
REVOKE ALL ON FUNCTION idempotency._lease_holder(pg_catalog.text, pg_catalog.text, pg_catalog.int4, pg_catalog.regrole) FROM PUBLIC;

-- complete() and fail(): store the outcome of a key this transaction began,
-- or (attempt given) of a lease attempt begun earlier.  IK004 otherwise.
CREATE FUNCTION idempotency._finish(p_key pg_catalog.text, p_scope pg_catalog.text, p_status pg_catalog.text,
                                    p_payload pg_catalog.jsonb, p_retryable pg_catalog.bool, p_attempt pg_catalog.int4)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
#variable_conflict use_column
DECLARE
    v_owner pg_catalog.regrole;
    v_msg pg_catalog.text;
    r record;
BEGIN
    -- (begin()'s quick test of the key, then the full one)
    IF (p_key OPERATOR(pg_catalog.<>) ''
        AND pg_catalog.octet_length(p_key) OPERATOR(pg_catalog.+) pg_catalog.octet_length(p_scope) OPERATOR(pg_catalog.<=) 255
        AND pg_catalog.current_setting('idempotency.max_key_length', true) IS NULL) IS NOT TRUE THEN
        IF p_key IS NULL OR p_scope IS NULL OR p_key OPERATOR(pg_catalog.=) ''
           OR pg_catalog.octet_length(p_key) OPERATOR(pg_catalog.+) pg_catalog.octet_length(p_scope)
              OPERATOR(pg_catalog.>) LEAST(coalesce(NULLIF(pg_catalog.current_setting('idempotency.max_key_length', true), '')::pg_catalog.int4, 255), 1024) THEN
            PERFORM idempotency._check_key(p_key, p_scope);
        END IF;
    END IF;
    v_owner := idempotency._caller();
    -- The common case in one statement: a key begun in this transaction
    -- (the row in progress, without a lease -- such a row is never
    -- committed in progress, so it is this transaction's -- or with one
    -- this transaction wrote), at the attempt given if one is: what the
    -- look below lets through to the same UPDATE.  Anything else updates
    -- nothing and goes the long way (its errors, a lease begun earlier).
    -- Not in a read-only transaction, where the checks come before the
    -- refusal of the write (25006).
    IF pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'off' THEN
        UPDATE idempotency.idempotency_key AS k
           SET status = p_status, response = p_payload, retryable = p_retryable,
               locked_until = NULL, updated_at = pg_catalog.now(),
               derive_seed = coalesce(k.derive_seed, idempotency._frozen_seed(k.owner, k.created_at))
         WHERE k.key OPERATOR(pg_catalog.=) p_key AND k.scope OPERATOR(pg_catalog.=) p_scope
           AND k.owner OPERATOR(pg_catalog.=) v_owner
           AND k.status OPERATOR(pg_catalog.=) 'in_progress'
           AND (k.locked_until IS NULL OR idempotency._mine(k.xmin))
           AND (p_attempt IS NULL OR k.attempts OPERATOR(pg_catalog.=) p_attempt);
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    SELECT k.status, k.attempts, k.expires_at, k.locked_until, k.xmin AS x INTO r
      FROM idempotency.idempotency_key AS k
     WHERE k.key OPERATOR(pg_catalog.=) p_key AND k.scope OPERATOR(pg_catalog.=) p_scope
       AND k.owner OPERATOR(pg_catalog.=) v_owner;
    IF FOUND AND r.status OPERATOR(pg_catalog.=) 'in_progress'
       AND (r.locked_until IS NULL OR idempotency._mine(r.x)) THEN
        -- begun in this transaction
        IF p_attempt IS NOT NULL AND p_attempt OPERATOR(pg_catalog.<>) r.attempts THEN
            v_msg := pg_catalog.format('%s is not held by attempt %s', idempotency._describe(p_key, p_scope), p_attempt);
            RAISE EXCEPTION '%', v_msg USING ERRCODE = 'IK004',
                DETAIL = pg_catalog.format('This transaction began attempt %s.', r.attempts);
        END IF;
    ELSIF p_attempt IS NOT NULL THEN
        -- a lease begun earlier: the row locked, so that a takeover cannot
        -- slip in between this check and the write
        PERFORM idempotency._lease_holder(p_key, p_scope, p_attempt, v_owner);
    ELSIF FOUND AND idempotency._mine(r.x) THEN
        RAISE EXCEPTION '% is not held by this transaction', idempotency._describe(p_key, p_scope)
            USING ERRCODE = 'IK004',
                  DETAIL = pg_catalog.format('This transaction already %s it.', r.status);
    ELSE
        RAISE EXCEPTION '% is not held by this transaction', idempotency._describe(p_key, p_scope)
            USING ERRCODE = 'IK004',
                  DETAIL = pg_catalog.format('%s() needs a begin() in the same transaction, by the same role, that returned new or retry.',
                                             CASE WHEN p_status OPERATOR(pg_catalog.=) 'completed' THEN 'complete' ELSE 'fail' END),
                  HINT = 'A begin() in a savepoint that was rolled back no longer holds its key. For a key begun with a lease in another transaction, pass attempt => the attempts value that begin() returned.';
    END IF;

    UPDATE idempotency.idempotency_key AS k
       SET status = p_status, response = p_payload, retryable = p_retryable,
           locked_until = NULL, updated_at = pg_catalog.now(),
           derive_seed = coalesce(k.derive_seed, idempotency._frozen_seed(k.owner, k.created_at))
     WHERE k.key OPERATOR(pg_catalog.=) p_key AND k.scope OPERATOR(pg_catalog.=) p_scope
       AND k.owner OPERATOR(pg_catalog.=) v_owner;
END
$fn$;
COMMENT ON FUNCTION idempotency._finish(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.bool, pg_catalog.int4) IS
'Portable edition, internal: complete() and fail(): store the outcome of a key held by this transaction or by a lease attempt (IK004 otherwise)';
REVOKE ALL ON FUNCTION idempotency._finish(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.bool, pg_catalog.int4) FROM PUBLIC;
-- @end
