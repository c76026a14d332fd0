-- portable/src/lifecycle.sql: expiry and purge, one-time tokens, consumer
-- deduplication — purge(), issue_token(), consume_token(), first_seen().
--
-- purge(): one batch per table is two statements, as in the C edition:
-- lock up to batch_size expired rows, skipping those another transaction
-- holds (FOR UPDATE SKIP LOCKED), then delete them by position, one
-- relation at a time (a partitioned key table has a ctid per partition),
-- rechecking expiry and owner.  It never waits for a row another
-- transaction holds.  The C edition's background worker purges every
-- role's rows; a managed service runs no worker of ours, so here the
-- installing role (the database owner, which a pg_cron job runs as) purges
-- every role's rows, and any other role its own, as in the C edition.
--
-- Tokens: issue_token() inserts a random uuid; consume_token() deletes it
-- (concurrent consumers serialise on the row: exactly one deletes it).
-- first_seen(): INSERT ... ON CONFLICT DO NOTHING; a redelivery writes
-- nothing; an expired entry is re-armed by an UPDATE guarded by its expiry.
-- All SECURITY DEFINER (application roles may not write these tables),
-- always for the caller's role (idempotency._caller()).

-- @body idempotency_purge
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_batch ALIAS FOR $1;
    v_now   pg_catalog.timestamptz := pg_catalog.now();
    v_owner pg_catalog.regrole := idempotency._caller();
    v_all   pg_catalog.bool;
    v_total pg_catalog.int8 := 0;
    v_n     pg_catalog.int8;
    b       record;
BEGIN
    IF p_batch < 1 THEN
        RAISE EXCEPTION 'batch_size must be at least 1' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- the installing role (this function's owner) purges every role's rows
    -- (inside this SECURITY DEFINER function, CURRENT_USER is its owner)
    v_all := v_owner = pg_catalog.quote_ident(CURRENT_USER)::pg_catalog.regrole;

    FOR b IN SELECT s.rel, pg_catalog.array_agg(s.tid) AS tids
               FROM (SELECT k.tableoid AS rel, k.ctid AS tid FROM idempotency.idempotency_key AS k
                      WHERE k.expires_at <= v_now AND (v_all OR k.owner = v_owner)
                      LIMIT p_batch FOR UPDATE SKIP LOCKED) AS s
              GROUP BY s.rel LOOP
        DELETE FROM idempotency.idempotency_key AS t
         WHERE t.ctid = ANY (b.tids) AND t.tableoid = b.rel
           AND t.expires_at <= v_now AND (v_all OR t.owner = v_owner);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_total := v_total + v_n;
    END LOOP;

    FOR b IN SELECT s.rel, pg_catalog.array_agg(s.tid) AS tids
               FROM (SELECT k.tableoid AS rel, k.ctid AS tid FROM idempotency.token AS k
                      WHERE k.expires_at <= v_now AND (v_all OR k.owner = v_owner)
                      LIMIT p_batch FOR UPDATE SKIP LOCKED) AS s
              GROUP BY s.rel LOOP
        DELETE FROM idempotency.token AS t
         WHERE t.ctid = ANY (b.tids) AND t.tableoid = b.rel
           AND t.expires_at <= v_now AND (v_all OR t.owner = v_owner);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_total := v_total + v_n;
    END LOOP;

    FOR b IN SELECT s.rel, pg_catalog.array_agg(s.tid) AS tids
               FROM (SELECT k.tableoid AS rel, k.ctid AS tid FROM idempotency.seen_message AS k
                      WHERE k.expires_at <= v_now AND (v_all OR k.owner = v_owner)
                      LIMIT p_batch FOR UPDATE SKIP LOCKED) AS s
              GROUP BY s.rel LOOP
        DELETE FROM idempotency.seen_message AS t
         WHERE t.ctid = ANY (b.tids) AND t.tableoid = b.rel
           AND t.expires_at <= v_now AND (v_all OR t.owner = v_owner);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_total := v_total + v_n;
    END LOOP;

    -- delivered outbox messages (a dump of the C edition may hold some):
    -- their topics' purged_* counters count them; the topic rows are
    -- locked first, skipping any another transaction holds, and only
    -- messages of the topics locked are taken
    FOR b IN WITH tp AS MATERIALIZED (
                 SELECT p.id FROM idempotency.outbox_topic AS p
                  WHERE p.id IN (SELECT c.topic_id FROM (
                          SELECT m.topic_id FROM idempotency.outbox_message AS m
                           WHERE m.expires_at <= v_now AND (v_all OR m.owner = v_owner)
                           LIMIT p_batch) AS c)
                    FOR NO KEY UPDATE OF p SKIP LOCKED)
             SELECT s.rel, pg_catalog.array_agg(s.tid) AS tids
               FROM (SELECT m.tableoid AS rel, m.ctid AS tid FROM idempotency.outbox_message AS m
                      WHERE m.expires_at <= v_now AND (v_all OR m.owner = v_owner)
                        AND m.topic_id IN (SELECT tp.id FROM tp)
                      LIMIT p_batch FOR UPDATE OF m SKIP LOCKED) AS s
              GROUP BY s.rel LOOP
        WITH d AS (
            DELETE FROM idempotency.outbox_message AS t
             WHERE t.ctid = ANY (b.tids) AND t.tableoid = b.rel
               AND t.expires_at <= v_now AND (v_all OR t.owner = v_owner)
            RETURNING t.topic_id, t.attempts),
        u AS (
            UPDATE idempotency.outbox_topic AS p
               SET purged_delivered = p.purged_delivered + a.n,
                   purged_retries = p.purged_retries + a.r
              FROM (SELECT d.topic_id, pg_catalog.count(*) AS n,
                           pg_catalog.sum(GREATEST(d.attempts - 1, 0)) AS r
                      FROM d GROUP BY d.topic_id) AS a
             WHERE p.id = a.topic_id)
        SELECT pg_catalog.count(*) INTO v_n FROM d;
        v_total := v_total + v_n;
    END LOOP;

    -- the acked counts (idempotency.outbox_acked, written by ack()) are
    -- added to their topics' purged_* columns, as the C edition's purge
    -- adds those of shared memory: the topics' rows locked first, skipping
    -- any another transaction holds (an open alter_topic(); its counts wait
    -- for the next purge), and only the counts of the topics locked taken.
    -- Not counted in what purge() returns (no row of the caller's expired).
    WITH tp AS MATERIALIZED (
        SELECT p.id FROM idempotency.outbox_topic AS p
         WHERE (v_all OR p.owner = v_owner)
           AND p.id IN (SELECT a.topic_id FROM idempotency.outbox_acked AS a)
           FOR NO KEY UPDATE OF p SKIP LOCKED),
    d AS (
        DELETE FROM idempotency.outbox_acked AS a
         WHERE a.topic_id IN (SELECT tp.id FROM tp)
        RETURNING a.topic_id, a.delivered, a.retried)
    UPDATE idempotency.outbox_topic AS p
       SET purged_delivered = p.purged_delivered + s.n,
           purged_retries = p.purged_retries + s.r
      FROM (SELECT d.topic_id, pg_catalog.sum(d.delivered) AS n, pg_catalog.sum(d.retried) AS r
              FROM d GROUP BY d.topic_id) AS s
     WHERE p.id = s.topic_id;

    RETURN v_total;
END
$fn$
-- @end

-- @body idempotency_issue_token
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_scope ALIAS FOR $1;
    p_ttl   ALIAS FOR $2;
    v_now   pg_catalog.timestamptz := pg_catalog.now();
    v_exp   pg_catalog.timestamptz;
    v_token pg_catalog.uuid := pg_catalog.gen_random_uuid();
    v_n     pg_catalog.int8;
BEGIN
    PERFORM idempotency._check_scope(p_scope);
    v_exp := idempotency._expiry(p_ttl, v_now);
    -- the token made here is the one returned, not one read back: what a
    -- DBA's trigger does to the stored row cannot change what the caller
    -- gets, and a trigger that skips the row is an error
    INSERT INTO idempotency.token (token, owner, scope, created_at, expires_at)
    VALUES (v_token, idempotency._caller(), p_scope, v_now, v_exp);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n <> 1 THEN
        RAISE EXCEPTION 'the token was not stored in table idempotency.token'
            USING ERRCODE = 'triggered_action_exception',
                  DETAIL = 'A trigger on the table skipped the row.';
    END IF;
    RETURN v_token;
END
$fn$
-- @end

-- @body idempotency_consume_token
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_token ALIAS FOR $1;
    p_scope ALIAS FOR $2;
BEGIN
    PERFORM idempotency._check_scope(p_scope);
    IF p_token IS NULL THEN
        RETURN false;       -- an unknown token
    END IF;
    DELETE FROM idempotency.token AS t
     WHERE t.token = p_token AND t.owner = idempotency._caller()
       AND t.scope = p_scope AND t.expires_at > pg_catalog.now();
    RETURN FOUND;
END
$fn$
-- @end

-- @body idempotency_first_seen
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_scope ALIAS FOR $1;
    p_id    ALIAS FOR $2;
    p_ttl   ALIAS FOR $3;
    v_now   pg_catalog.timestamptz := pg_catalog.now();
    v_exp   pg_catalog.timestamptz;
    v_owner pg_catalog.regrole;
BEGIN
    PERFORM idempotency._check_key(p_id, p_scope, 'message id');
    v_owner := idempotency._caller();
    v_exp := idempotency._expiry(p_ttl, v_now);
    INSERT INTO idempotency.seen_message AS m (owner, scope, message_id, first_seen_at, expires_at)
    VALUES (v_owner, p_scope, p_id, v_now, v_exp)
    ON CONFLICT (owner, scope, message_id) DO NOTHING;
    IF FOUND THEN
        RETURN true;
    END IF;
    -- seen before: first again only if expired
    UPDATE idempotency.seen_message AS m
       SET first_seen_at = v_now, expires_at = v_exp
     WHERE m.owner = v_owner AND m.scope = p_scope AND m.message_id = p_id
       AND m.expires_at <= v_now;
    RETURN FOUND;
END
$fn$
-- @end

-- @tail
-- IK003 for a scope given alone (issue_token(), consume_token())
CREATE FUNCTION idempotency._check_scope(scope pg_catalog.text)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED
AS $fn$
DECLARE
    maxlen pg_catalog.int4 := coalesce(NULLIF(pg_catalog.current_setting('idempotency.max_key_length', true), ''), '255')::pg_catalog.int4;
BEGIN
    IF scope IS NULL THEN
        RAISE EXCEPTION 'idempotency scope must not be null' USING ERRCODE = 'IK003',
            HINT = 'Use '''' (the default) for no scope.';
    END IF;
    IF pg_catalog.length(scope) OPERATOR(pg_catalog.>) maxlen THEN
        RAISE EXCEPTION 'idempotency scope is too long' USING ERRCODE = 'IK003',
            DETAIL = pg_catalog.format('The idempotency scope has %s characters; idempotency.max_key_length allows %s.',
                                       pg_catalog.length(scope), maxlen);
    END IF;
END
$fn$;
COMMENT ON FUNCTION idempotency._check_scope(pg_catalog.text) IS
'Portable edition, internal: IK003 for a null or too long scope';

-- now + ttl (NULL: idempotency.default_ttl); 22023 if not positive
CREATE FUNCTION idempotency._expiry(ttl pg_catalog.interval, t0 pg_catalog.timestamptz)
RETURNS pg_catalog.timestamptz
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED
AS $fn$
DECLARE
    v pg_catalog.timestamptz;
BEGIN
    IF ttl IS NULL THEN
        RETURN t0 OPERATOR(pg_catalog.+)
               pg_catalog.make_interval(secs => idempotency._setting_ms('idempotency.default_ttl', 1000, 86400000) OPERATOR(pg_catalog./) 1000.0);
    END IF;
    v := t0 OPERATOR(pg_catalog.+) ttl;
    IF v OPERATOR(pg_catalog.<=) t0 THEN
        RAISE EXCEPTION 'ttl must be positive' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN v;
END
$fn$;
COMMENT ON FUNCTION idempotency._expiry(pg_catalog.interval, pg_catalog.timestamptz) IS
'Portable edition, internal: now + ttl, or + idempotency.default_ttl when ttl is NULL; 22023 unless positive';
REVOKE ALL ON FUNCTION idempotency._check_scope(pg_catalog.text),
    idempotency._expiry(pg_catalog.interval, pg_catalog.timestamptz) FROM PUBLIC;
-- @end
