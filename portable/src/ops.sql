-- portable/src/ops.sql: operating on one key — forget(), renew(), checkpoint().
--
-- forget() deletes one of the caller's keys so that the next begin() is
-- new.  A key in flight is refused with IK002 and nothing is deleted: one
-- this transaction began and has not finished, one whose row another
-- transaction holds (locked without waiting: forget() never queues behind
-- a request), one under a live lease.  An absent or expired key is false.
-- The row lock is kept to the end of the transaction, so a begin() of the
-- key waits for the forget() to commit or roll back.  A key another
-- transaction is beginning anew has no committed row yet: forget() tries
-- to insert the row without waiting and undoes it; a timeout is IK002.
--
-- renew() extends the lease of the caller's attempt under the checks
-- complete(..., attempt) makes (_lease_holder, which locks the row); a key
-- this transaction began without a lease is IK004 (no lease to extend).

-- @body idempotency_forget
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_key   ALIAS FOR $1;
    p_scope ALIAS FOR $2;
    v_owner pg_catalog.regrole;
    r       record;
BEGIN
    PERFORM idempotency._check_key(p_key, p_scope);
    v_owner := idempotency._caller();
    IF pg_catalog.current_setting('transaction_read_only')::pg_catalog.bool THEN
        IF pg_catalog.pg_is_in_recovery() THEN
            RAISE EXCEPTION 'cannot forget % in a read-only transaction', idempotency._describe(p_key, p_scope)
                USING ERRCODE = 'read_only_sql_transaction', HINT = 'Send it to the primary server.';
        END IF;
        RAISE EXCEPTION 'cannot forget % in a read-only transaction', idempotency._describe(p_key, p_scope)
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    SELECT k.status, k.locked_until, k.xmin AS x INTO r
      FROM idempotency.idempotency_key AS k
     WHERE k.key = p_key AND k.scope = p_scope AND k.owner = v_owner;
    IF FOUND AND r.status = 'in_progress' AND (r.locked_until IS NULL OR idempotency._mine(r.x)) THEN
        RAISE EXCEPTION 'cannot forget %: it is in progress in this transaction', idempotency._describe(p_key, p_scope)
            USING ERRCODE = 'IK002',
                  DETAIL = 'This transaction began it and has not completed or failed it yet.';
    END IF;
    BEGIN
        SELECT k.status, k.attempts, k.expires_at, k.locked_until INTO r
          FROM idempotency.idempotency_key AS k
         WHERE k.key = p_key AND k.scope = p_scope AND k.owner = v_owner
           FOR UPDATE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'cannot forget %: it is in progress in another transaction', idempotency._describe(p_key, p_scope)
            USING ERRCODE = 'IK002',
                  DETAIL = 'Another transaction holds the key; forget() does not wait for it.',
                  HINT = 'Try again when that request has finished.';
    END;
    IF NOT FOUND THEN
        -- no committed row: another transaction may be beginning the key
        -- anew (its row is not visible here).  Try the row's insert without
        -- waiting (1 ms) and undo it: a wait that times out is that
        -- transaction's row (IK002, as the C edition sees its key lock)
        BEGIN
            PERFORM pg_catalog.set_config('lock_timeout', '1', true);
            INSERT INTO idempotency.idempotency_key AS k
                   (owner, scope, key, status, attempts, created_at, updated_at, expires_at)
            VALUES (v_owner, p_scope, p_key, 'in_progress', 1, pg_catalog.now(), pg_catalog.now(), pg_catalog.now());
            RAISE EXCEPTION USING ERRCODE = 'IKPRB';    -- undo the probe (and the setting)
        EXCEPTION
            WHEN lock_not_available THEN
                RAISE EXCEPTION 'cannot forget %: it is in progress in another transaction', idempotency._describe(p_key, p_scope)
                    USING ERRCODE = 'IK002',
                          DETAIL = 'Another transaction holds the key; forget() does not wait for it.',
                          HINT = 'Try again when that request has finished.';
            WHEN unique_violation OR SQLSTATE 'IKPRB' THEN
                NULL;   -- absent, or committed just now by another transaction
        END;
        RETURN false;       -- absent, or another role's
    END IF;
    IF r.expires_at <= pg_catalog.now() THEN
        RETURN false;       -- expired (the purge takes it)
    END IF;
    IF r.status = 'in_progress' AND r.locked_until > pg_catalog.clock_timestamp() THEN
        RAISE EXCEPTION 'cannot forget %: it is in progress under a lease', idempotency._describe(p_key, p_scope)
            USING ERRCODE = 'IK002',
                  DETAIL = pg_catalog.format('Attempt %s holds it until %s.', r.attempts, r.locked_until),
                  HINT = 'Let the worker finish it, or forget it after the lease ends.';
    END IF;
    DELETE FROM idempotency.idempotency_key AS k
     WHERE k.key = p_key AND k.scope = p_scope AND k.owner = v_owner;
    IF NOT FOUND THEN
        -- the row is locked: a trigger or rule skipped the delete
        RAISE EXCEPTION '% was not deleted from table idempotency.idempotency_key', idempotency._describe(p_key, p_scope)
            USING ERRCODE = 'triggered_action_exception',
                  DETAIL = 'A trigger or rule on the table skipped the delete; the key stands.';
    END IF;
    RAISE LOG 'role "%" forgot % (status %, attempt %)', pg_catalog.pg_get_userbyid(v_owner::pg_catalog.oid), idempotency._describe(p_key, p_scope),
              r.status, r.attempts;
    RETURN true;
END
$fn$
-- @end

-- @body idempotency_renew
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_key     ALIAS FOR $1;
    p_lease   ALIAS FOR $2;
    p_attempt ALIAS FOR $3;
    p_scope   ALIAS FOR $4;
    v_owner   pg_catalog.regrole;
    v_clock   pg_catalog.timestamptz := pg_catalog.clock_timestamp();
    v_end     pg_catalog.timestamptz;
    r         record;
BEGIN
    PERFORM idempotency._check_key(p_key, p_scope);
    v_owner := idempotency._caller();
    IF p_lease IS NULL THEN
        RAISE EXCEPTION 'lease must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF p_attempt IS NULL THEN
        RAISE EXCEPTION 'attempt must not be null' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass the attempts value that begin() returned.';
    END IF;
    v_end := v_clock + p_lease;
    IF v_end <= v_clock THEN
        RAISE EXCEPTION 'lease must be positive' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.current_setting('transaction_read_only')::pg_catalog.bool THEN
        IF pg_catalog.pg_is_in_recovery() THEN
            RAISE EXCEPTION 'cannot renew % in a read-only transaction', idempotency._describe(p_key, p_scope)
                USING ERRCODE = 'read_only_sql_transaction', HINT = 'Send it to the primary server.';
        END IF;
        RAISE EXCEPTION 'cannot renew % in a read-only transaction', idempotency._describe(p_key, p_scope)
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    -- a key this transaction began without a lease has no lease to renew:
    -- its row is written at begin() here (the C edition has none before
    -- complete()), and a lease would let it commit unfinished, past the
    -- commit check
    SELECT k.status, k.locked_until, k.xmin AS x INTO r
      FROM idempotency.idempotency_key AS k
     WHERE k.key = p_key AND k.scope = p_scope AND k.owner = v_owner;
    IF FOUND AND r.status = 'in_progress' AND r.locked_until IS NULL AND idempotency._mine(r.x) THEN
        RAISE EXCEPTION '% is not held by attempt %', idempotency._describe(p_key, p_scope), p_attempt
            USING ERRCODE = 'IK004',
                  DETAIL = 'This transaction began it without a lease; it must be completed or failed in this transaction.',
                  HINT = 'Begin the key with lease => an interval to run it under a lease that renew() extends.';
    END IF;
    PERFORM idempotency._lease_holder(p_key, p_scope, p_attempt, v_owner);     -- IK004
    UPDATE idempotency.idempotency_key AS k
       SET status = 'in_progress', locked_until = v_end,
           expires_at = GREATEST(k.expires_at, v_end), updated_at = pg_catalog.now(),
           derive_seed = coalesce(k.derive_seed, idempotency._frozen_seed(k.owner, k.created_at))
     WHERE k.key = p_key AND k.scope = p_scope AND k.owner = v_owner;
    RETURN v_end;
END
$fn$
-- @end

-- checkpoint(key, point, state, attempt, scope): the recovery point of
-- the caller's lease attempt, written in the caller's transaction (it
-- commits with the phase's writes); the attempt must hold the lease
-- (_lease_holder, which locks the row: a takeover waits for the phase).
-- A key begun in this transaction without a lease has no point to resume
-- from: IK004.

-- @body idempotency_checkpoint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_key     ALIAS FOR $1;
    p_point   ALIAS FOR $2;
    p_state   ALIAS FOR $3;
    p_attempt ALIAS FOR $4;
    p_scope   ALIAS FOR $5;
    v_owner   pg_catalog.regrole;
    r         record;
BEGIN
    PERFORM idempotency._check_key(p_key, p_scope);
    -- the point: not null (22004), not empty, at most max_key_length
    -- characters (22023)
    PERFORM idempotency._check_name(p_point, 'recovery point');
    IF p_attempt IS NULL THEN
        RAISE EXCEPTION 'attempt must not be null' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass the attempts value that begin() returned.';
    END IF;
    v_owner := idempotency._caller();
    SELECT k.status, k.locked_until, k.xmin AS x INTO r
      FROM idempotency.idempotency_key AS k
     WHERE k.key = p_key AND k.scope = p_scope AND k.owner = v_owner;
    IF FOUND AND r.status = 'in_progress' AND r.locked_until IS NULL AND idempotency._mine(r.x) THEN
        RAISE EXCEPTION '% is not held by a lease', idempotency._describe(p_key, p_scope)
            USING ERRCODE = 'IK004',
                  DETAIL = 'This transaction began it without a lease; its work commits at once, so there is no point to resume from.',
                  HINT = 'Begin the key with lease => an interval to run it in phases.';
    END IF;
    PERFORM idempotency._lease_holder(p_key, p_scope, p_attempt, v_owner);     -- IK004
    IF pg_catalog.pg_is_in_recovery() THEN
        RAISE EXCEPTION 'cannot store % during recovery', idempotency._describe(p_key, p_scope)
            USING ERRCODE = 'read_only_sql_transaction',
                  DETAIL = 'This server is a hot standby; it can replay finished keys but not store new ones.',
                  HINT = 'Send requests that do work to the primary server.';
    END IF;
    IF pg_catalog.current_setting('transaction_read_only')::pg_catalog.bool THEN
        RAISE EXCEPTION 'cannot store % in a read-only transaction', idempotency._describe(p_key, p_scope)
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    UPDATE idempotency.idempotency_key AS k
       SET recovery_point = p_point, recovery_state = p_state, updated_at = pg_catalog.now(),
           derive_seed = coalesce(k.derive_seed, idempotency._frozen_seed(k.owner, k.created_at))
     WHERE k.key = p_key AND k.scope = p_scope AND k.owner = v_owner;
END
$fn$
-- @end
