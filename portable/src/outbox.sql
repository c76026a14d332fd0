-- portable/src/outbox.sql: the outbox — topics and their grants,
-- publish(), the relay API (claim(), ack(), nack(), release(), redrive()),
-- wait_for(), and the internal functions the views read.
--
-- Claims live in the rows, as the C edition keeps them without the library
-- in shared_preload_libraries (and as 0.5.0 kept them): a claim writes its
-- token, its end (available_at) and attempts + 1 into the row; ack()
-- deletes the message, as the C edition's does with the library preloaded,
-- and counts it in idempotency.outbox_acked (so a topic's retention keeps
-- nothing here); nack() writes the retry time or makes it dead; release()
-- gives it back with the attempt uncounted.  The statements are the C
-- edition's (src/outbox_relay.c, src/outbox_topics.c), run as the
-- installing role inside SECURITY DEFINER functions, for the caller's role
-- (idempotency._caller()).
--
-- Order per message key.  A keyed publish() takes its key's lock, an
-- entry in idempotency.outbox_key_lock's primary key whose row it inserts
-- and deletes at once (see _outbox_key_lock()), held to the end of the
-- transaction, and only then draws the message id: a second publisher of
-- the key waits for the first to commit or roll back, so per key, id order
-- is commit order.  Not an advisory lock: advisory lock tags show in
-- pg_locks to every role and any role can take one, so another role could
-- see or block a key; only the installing role may write the table (no
-- grant, row security on).  No row commits, so no snapshot decides the
-- lock: under REPEATABLE READ a keyed publish waits for the key as under
-- READ COMMITTED.

-- A topic is held by its publishers: publish() takes the topic's row FOR
-- KEY SHARE to the end of the transaction, and drop_topic() (and
-- create_topic() taking over a dropped owner's topic) deletes the row, so
-- a drop waits for the publishers in flight and a publisher that comes
-- after it finds no topic (42704), or, in a transaction whose snapshot
-- still shows the topic, 40001, as in the C edition.
--
-- wait_for() polls: see its body.

-- @head
-- ---------------------------------------------------------------------
-- The acked counts.  ack() deletes the messages it delivers, as the C
-- edition does with the library preloaded (one dead row version per
-- message, no index entry added), and counts them here: a row per ack
-- statement and topic, which outbox_stats adds to the topic's purged_*
-- columns (build.pl rewrites the view to read this table where the C
-- edition reads shared memory), and purge() folds into those columns.
-- Rows, not a counter in the topic's row: concurrent acks of a topic
-- insert without waiting for each other, and the counts obey snapshots
-- and rollbacks as the deletes do.  Created before the shared statements:
-- the view reads it.  Its row security and grant follow the topics' (at
-- the tail).
-- ---------------------------------------------------------------------
CREATE TABLE idempotency.outbox_acked (
    topic_id  pg_catalog.int4 NOT NULL,
    delivered pg_catalog.int8 NOT NULL,
    retried   pg_catalog.int8 NOT NULL
);
CREATE INDEX outbox_acked_topic_idx ON idempotency.outbox_acked (topic_id);
-- (a replica identity, the whole row: the table has no key, and a
-- publication of every table publishes its deletes, which fail without one)
ALTER TABLE idempotency.outbox_acked REPLICA IDENTITY FULL;
ALTER TABLE idempotency.outbox_acked SET (autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
COMMENT ON TABLE idempotency.outbox_acked IS
'Portable edition: messages delivered (and their claims after the first) per ack() statement and topic, until purge() adds them to the topic''s purged_delivered and purged_retries';
DO $cd$ BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension AS e
                WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency') THEN
        -- (the rows of the topics the dump writes: outbox_topic's condition
        -- leaves out a dropped owner's topic)
        PERFORM pg_catalog.pg_extension_config_dump('idempotency.outbox_acked',
            'WHERE EXISTS (SELECT FROM idempotency.outbox_topic AS t
                             JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) t.owner::pg_catalog.oid
                            WHERE t.id OPERATOR(pg_catalog.=) outbox_acked.topic_id)');
    END IF;
END $cd$;
-- @end

-- @tail
-- ---------------------------------------------------------------------
-- The acked counts are read as the topics are: a role sees the rows of
-- the topics row security shows it, a member of pg_read_all_stats every
-- row (as _outbox_counts() answers in the C edition); nobody but the
-- installing role writes them.
-- ---------------------------------------------------------------------
ALTER TABLE idempotency.outbox_acked ENABLE ROW LEVEL SECURITY;
CREATE POLICY outbox_acked_visible ON idempotency.outbox_acked
    FOR SELECT
    USING (pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE')
           OR EXISTS (SELECT 1 FROM idempotency.outbox_topic AS t
                       WHERE t.id OPERATOR(pg_catalog.=) outbox_acked.topic_id));
REVOKE ALL ON idempotency.outbox_acked FROM PUBLIC;
GRANT SELECT ON idempotency.outbox_acked TO PUBLIC;
-- A count belongs to an existing topic, for the reason messages do (below):
-- drop_topic() in a REPEATABLE READ or SERIALIZABLE transaction deletes
-- the counts its snapshot shows, then the topic; the key's check finds a
-- count an ack committed after that snapshot, so the drop fails with 40001
-- instead of leaving the count without a topic.
ALTER TABLE idempotency.outbox_acked ADD CONSTRAINT outbox_acked_topic_fkey
    FOREIGN KEY (topic_id) REFERENCES idempotency.outbox_topic (id);

-- ---------------------------------------------------------------------
-- The outbox's own table: its primary key holds the per-key locks of
-- publish() and redrive(), taken before they draw a message id; its rows
-- never commit (each is deleted by the transaction that inserts it).  No
-- role but the installing one writes it.
-- ---------------------------------------------------------------------
CREATE TABLE idempotency.outbox_key_lock (
    topic_id    pg_catalog.int4 NOT NULL,
    message_key pg_catalog.text COLLATE "C" NOT NULL,
    CONSTRAINT outbox_key_lock_pkey PRIMARY KEY (topic_id, message_key)
);
ALTER TABLE idempotency.outbox_key_lock ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON idempotency.outbox_key_lock FROM PUBLIC;
COMMENT ON TABLE idempotency.outbox_key_lock IS
'Portable edition, internal: the per-key locks of publish() (per key, id order is commit order), entries of its primary key whose rows never commit; no role but the installing one may read it';

-- A message belongs to an existing topic.  What it buys: drop_topic() in a
-- REPEATABLE READ or SERIALIZABLE transaction deletes the messages its
-- snapshot shows, then the topic; the key's check runs with the newest
-- snapshot and finds a message a publisher committed after that snapshot
-- was taken (the C edition looks with the newest snapshot itself), so the
-- drop fails with 40001 instead of leaving the message without a topic.
-- publish() holds the topic's row FOR KEY SHARE anyway, which is the lock
-- the key's check takes.
ALTER TABLE idempotency.outbox_message ADD CONSTRAINT outbox_message_topic_fkey
    FOREIGN KEY (topic_id) REFERENCES idempotency.outbox_topic (id);

-- NOTIFY for a topic created with notify => true, sent at commit and not
-- at PREPARE TRANSACTION (a transaction that has executed NOTIFY cannot be
-- prepared; a prepared transaction notifies nobody, as in the C edition):
-- publish() and redrive() put a row here, a deferred trigger takes it out
-- at COMMIT or PREPARE and notifies at COMMIT only.  The row never
-- commits.
CREATE TABLE idempotency.outbox_notify (
    topic pg_catalog.text COLLATE "C" NOT NULL
);
ALTER TABLE idempotency.outbox_notify ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON idempotency.outbox_notify FROM PUBLIC;
COMMENT ON TABLE idempotency.outbox_notify IS
'Portable edition, internal: the topics a transaction notifies at commit (rows never commit: a deferred trigger takes them out at COMMIT or PREPARE TRANSACTION)';
CREATE FUNCTION idempotency._outbox_notify()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    DELETE FROM idempotency.outbox_notify AS q WHERE q.ctid OPERATOR(pg_catalog.=) NEW.ctid;
    IF pg_catalog.current_query() OPERATOR(pg_catalog.!~*) '^\s*prepare\s+transaction' THEN
        -- once per transaction and topic: NOTIFY folds equal notifications
        PERFORM pg_catalog.pg_notify('idempotency.outbox.' OPERATOR(pg_catalog.||) NEW.topic, '');
    END IF;
    RETURN NULL;
END
$fn$;
COMMENT ON FUNCTION idempotency._outbox_notify() IS
'Portable edition, internal: deferred trigger that NOTIFYs a topic at COMMIT (not at PREPARE TRANSACTION)';
CREATE CONSTRAINT TRIGGER outbox_notify_at_commit
    AFTER INSERT ON idempotency.outbox_notify
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    EXECUTE FUNCTION idempotency._outbox_notify();

-- 22004/22023: the topic argument (1 to 40 of [A-Za-z0-9_.:-])
CREATE FUNCTION idempotency._outbox_topic_arg(topic pg_catalog.text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $fn$
BEGIN
    IF topic IS NULL THEN
        RAISE EXCEPTION 'topic must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF topic OPERATOR(pg_catalog.!~) '^[A-Za-z0-9_.:-]{1,40}$' THEN
        RAISE EXCEPTION 'invalid topic name "%"', topic USING ERRCODE = 'invalid_parameter_value',
            DETAIL = 'A topic name has 1 to 40 characters, each a letter, digit, ''_'', ''.'', '':'' or ''-''.';
    END IF;
END
$fn$;
COMMENT ON FUNCTION idempotency._outbox_topic_arg(pg_catalog.text) IS
'Portable edition, internal: 22004/22023 for a null or malformed topic name';

-- 22023 unless iv >= 0 (> 0 when positive)
CREATE FUNCTION idempotency._outbox_interval(iv pg_catalog.interval, name pg_catalog.text, positive pg_catalog.bool)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $fn$
BEGIN
    IF iv OPERATOR(pg_catalog.<) '0'::pg_catalog.interval
       OR positive AND iv OPERATOR(pg_catalog.=) '0'::pg_catalog.interval THEN
        RAISE EXCEPTION '% must be %', name, CASE WHEN positive THEN 'positive' ELSE 'zero or positive' END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;
COMMENT ON FUNCTION idempotency._outbox_interval(pg_catalog.interval, pg_catalog.text, pg_catalog.bool) IS
'Portable edition, internal: 22023 for a negative (or, when positive, zero) interval';

-- a topic's row, locked FOR KEY SHARE (lock 'key share') or FOR UPDATE
CREATE FUNCTION idempotency._outbox_topic_locked(name pg_catalog.text, lock pg_catalog.text)
RETURNS idempotency.outbox_topic
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
DECLARE
    t idempotency.outbox_topic;
BEGIN
    IF lock OPERATOR(pg_catalog.=) 'key share' THEN
        SELECT * INTO t FROM idempotency.outbox_topic AS o
         WHERE o.name OPERATOR(pg_catalog.=) _outbox_topic_locked.name FOR KEY SHARE;
    ELSE
        SELECT * INTO t FROM idempotency.outbox_topic AS o
         WHERE o.name OPERATOR(pg_catalog.=) _outbox_topic_locked.name FOR UPDATE;
    END IF;
    RETURN t;
END
$fn$;
COMMENT ON FUNCTION idempotency._outbox_topic_locked(pg_catalog.text, pg_catalog.text) IS
'Portable edition, internal: a topic''s row, locked FOR KEY SHARE or FOR UPDATE';

-- The topic and the caller's right on it ('own', 'publish', 'consume'):
-- 42704 if there is no such topic or its owner was dropped (NULL instead
-- when missing_ok), 42501 if the caller lacks the right.  lock: 'key share'
-- (publish(), grant_topic(): held to the end of the transaction, see the
-- file's head) or 'update' (drop_topic), else none.
CREATE FUNCTION idempotency._outbox_topic(name pg_catalog.text, want pg_catalog.text,
                                          missing_ok pg_catalog.bool DEFAULT false,
                                          lock pg_catalog.text DEFAULT NULL)
RETURNS idempotency.outbox_topic
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
DECLARE
    t    idempotency.outbox_topic;
    me   pg_catalog.regrole := idempotency._caller();
    g    record;
    ok   pg_catalog.bool;
BEGIN
    IF lock IS NULL THEN
        SELECT * INTO t FROM idempotency.outbox_topic AS o WHERE o.name OPERATOR(pg_catalog.=) _outbox_topic.name;
    ELSIF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        -- a drop in flight is waited for; the row is then gone (or not)
        t := idempotency._outbox_topic_locked(name, lock);
    ELSE
        BEGIN
            t := idempotency._outbox_topic_locked(name, lock);
        EXCEPTION WHEN serialization_failure THEN
            -- the transaction's snapshot still shows a topic dropped since
            RAISE EXCEPTION 'could not serialize access due to concurrent drop_topic()'
                USING ERRCODE = 'serialization_failure',
                      DETAIL = pg_catalog.format('Topic was dropped "%s" after this transaction''s snapshot was taken.', name),
                      HINT = 'Retry the transaction.';
        END;
    END IF;
    IF t.id IS NULL THEN
        IF missing_ok THEN
            RETURN NULL;
        END IF;
        RAISE EXCEPTION 'topic "%" does not exist', name USING ERRCODE = 'undefined_object',
            HINT = 'Create it with idempotency.create_topic().';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) t.owner::pg_catalog.oid) THEN
        IF missing_ok THEN
            RETURN NULL;
        END IF;
        RAISE EXCEPTION 'topic "%" does not exist', name USING ERRCODE = 'undefined_object',
            DETAIL = 'The role that owned it was dropped; its grants give nothing.',
            HINT = 'Create it anew with idempotency.create_topic(), which takes the name over.';
    END IF;
    IF t.owner OPERATOR(pg_catalog.=) me OR want IS NULL THEN
        RETURN t;
    END IF;
    IF want OPERATOR(pg_catalog.<>) 'own' THEN
        SELECT gr.can_publish, gr.can_consume INTO g FROM idempotency.outbox_grant AS gr
         WHERE gr.topic_id OPERATOR(pg_catalog.=) t.id AND gr.grantee OPERATOR(pg_catalog.=) me;
        ok := CASE want WHEN 'publish' THEN coalesce(g.can_publish, false)
                        ELSE coalesce(g.can_consume, false) END;
        IF ok THEN
            RETURN t;
        END IF;
    END IF;
    RAISE EXCEPTION 'permission denied for topic "%"', name USING ERRCODE = 'insufficient_privilege',
        DETAIL = pg_catalog.format('Role %s may not %s this topic.', pg_catalog.pg_get_userbyid(me::pg_catalog.oid),
                                   CASE want WHEN 'own' THEN 'change or drop' WHEN 'publish' THEN 'publish to'
                                             ELSE 'consume from' END),
        HINT = CASE want WHEN 'own' THEN 'Only the topic''s owner may.'
                         ELSE 'The topic''s owner can allow it with idempotency.grant_topic().' END;
END
$fn$;
COMMENT ON FUNCTION idempotency._outbox_topic(pg_catalog.text, pg_catalog.text, pg_catalog.bool, pg_catalog.text) IS
'Portable edition, internal: a topic and the caller''s right on it (42704, 42501), optionally locked';

-- The lock of (topic, message key) for this transaction: an entry in the
-- primary key of outbox_key_lock that no other transaction may pass until
-- this one ends.  The row is inserted and deleted at once, so it never
-- commits; its index entry stays, and a unique check reads a row version
-- whose inserter is still in progress as a conflict whatever its xmax
-- (PostgreSQL's HeapTupleSatisfiesDirty: "in insertion by other"), so a
-- second publisher's insert of the key waits for this transaction to end,
-- then finds the version dead and inserts its own.  Nothing depends on
-- the caller's snapshot: under REPEATABLE READ or SERIALIZABLE a key
-- another transaction published (or holds) since the snapshot is waited
-- for or free, never a 40001 (a lock on a committed row would be
-- invisible to that snapshot, or changed since it).  This transaction's
-- own earlier entry of the key (inserted and deleted by it) is no
-- conflict.  A rolled-back savepoint gives the key up with its message.
CREATE FUNCTION idempotency._outbox_key_lock(topic_id pg_catalog.int4, message_key pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
DECLARE
    v_tid pg_catalog.tid;
BEGIN
    INSERT INTO idempotency.outbox_key_lock AS k (topic_id, message_key)
    VALUES (_outbox_key_lock.topic_id, _outbox_key_lock.message_key)
    RETURNING k.ctid INTO v_tid;
    DELETE FROM idempotency.outbox_key_lock AS k WHERE k.ctid OPERATOR(pg_catalog.=) v_tid;
END
$fn$;
COMMENT ON FUNCTION idempotency._outbox_key_lock(pg_catalog.int4, pg_catalog.text) IS
'Portable edition, internal: lock (topic, message key) to the end of the transaction, by an entry in outbox_key_lock''s primary key whose row never commits';

-- Delete a topic's row after its messages, and its acked counts.  With READ COMMITTED the
-- statement before (a new snapshot, after the row lock waited for the
-- publishers) saw every message; with a transaction snapshot the foreign
-- key's check, which looks with the newest snapshot, finds a message
-- committed after it was taken: 40001, as the C edition says it.
CREATE FUNCTION idempotency._outbox_drop_row(id pg_catalog.int4, name pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
BEGIN
    DELETE FROM idempotency.outbox_acked AS a WHERE a.topic_id OPERATOR(pg_catalog.=) _outbox_drop_row.id;
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        DELETE FROM idempotency.outbox_topic AS o WHERE o.id OPERATOR(pg_catalog.=) _outbox_drop_row.id;
        RETURN;
    END IF;
    BEGIN
        DELETE FROM idempotency.outbox_topic AS o WHERE o.id OPERATOR(pg_catalog.=) _outbox_drop_row.id;
    EXCEPTION WHEN foreign_key_violation OR serialization_failure THEN
        RAISE EXCEPTION 'could not serialize access due to concurrent publish()'
            USING ERRCODE = 'serialization_failure',
                  DETAIL = pg_catalog.format('A message was published to topic "%s" after this transaction''s snapshot was taken.', name),
                  HINT = 'Retry the transaction.';
    END;
END
$fn$;
COMMENT ON FUNCTION idempotency._outbox_drop_row(pg_catalog.int4, pg_catalog.text) IS
'Portable edition, internal: delete a topic''s row after its messages (40001 for a message published after a transaction snapshot)';

-- 22004 for a NULL ids array or one with NULLs
CREATE FUNCTION idempotency._outbox_ids_arg(ids pg_catalog.int8[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $fn$
BEGIN
    IF ids IS NULL THEN
        RAISE EXCEPTION 'ids must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF pg_catalog.array_position(ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'ids must not contain nulls' USING ERRCODE = 'null_value_not_allowed';
    END IF;
END
$fn$;
COMMENT ON FUNCTION idempotency._outbox_ids_arg(pg_catalog.int8[]) IS
'Portable edition, internal: 22004 for a null ids array or one with nulls';

-- the full transaction id of a row's xmin, from the 64-bit xid c near it
-- (the epoch taken from c, the nearest full xid to it is the one)
CREATE FUNCTION idempotency._outbox_full_xid(x pg_catalog.xid, c pg_catalog.int8)
RETURNS pg_catalog.int8
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $fn$
SELECT c OPERATOR(pg_catalog.-)
       ((((c OPERATOR(pg_catalog.%) 4294967296) OPERATOR(pg_catalog.-) (x::pg_catalog.text::pg_catalog.int8))
         OPERATOR(pg_catalog.+) 6442450944) OPERATOR(pg_catalog.%) 4294967296
        OPERATOR(pg_catalog.-) 2147483648)
$fn$;
COMMENT ON FUNCTION idempotency._outbox_full_xid(pg_catalog.xid, pg_catalog.int8) IS
'Portable edition, internal: the 64-bit transaction id of a 32-bit one, from a 64-bit one near it';

-- ack() ('a'), nack() ('n') and release() ('r') of the messages ids of a
-- claim, for the caller's role: one statement for the three, the right to
-- consume checked on each message's topic (its owner, or a grantee while
-- the owner exists).  Under REPEATABLE READ or SERIALIZABLE a message that
-- another transaction changed after the snapshot (its claim lapsed and
-- was taken over, or acked, or dropped) cannot be updated (40001); it is
-- no longer this claim's, so it counts 0, as in READ COMMITTED and in the
-- C edition: after such a failure the ids are settled one at a time, each
-- in a subtransaction of its own.  READ COMMITTED takes no subtransaction.
CREATE FUNCTION idempotency._outbox_settle(kind pg_catalog."char", claim pg_catalog.uuid, ids pg_catalog.int8[],
                                           error pg_catalog.jsonb, retry_in pg_catalog.interval,
                                           one pg_catalog.bool DEFAULT false)
RETURNS pg_catalog.int4
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
#variable_conflict use_column
DECLARE
    p_kind  ALIAS FOR $1;
    p_claim ALIAS FOR $2;
    p_ids   ALIAS FOR $3;
    p_error ALIAS FOR $4;
    p_retry ALIAS FOR $5;
    me      pg_catalog.regrole := idempotency._caller();
    v_now   pg_catalog.timestamptz := pg_catalog.clock_timestamp();
    v_id    pg_catalog.int8;
    v_detail pg_catalog.text;
    n       pg_catalog.int4;
BEGIN
    IF NOT $6 AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        BEGIN
            RETURN idempotency._outbox_settle(p_kind, p_claim, p_ids, p_error, p_retry, true);
        EXCEPTION WHEN serialization_failure THEN
            -- a dependency among serializable transactions (the
            -- predicate locks' failure, whose untranslated detail names
            -- its reason) is the transaction's to retry, not a message
            -- changed since the snapshot
            GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
            IF pg_catalog.starts_with(v_detail, 'Reason code: ') THEN
                RAISE;
            END IF;
        END;
        n := 0;
        FOREACH v_id IN ARRAY p_ids LOOP
            BEGIN
                n := n OPERATOR(pg_catalog.+)
                     idempotency._outbox_settle(p_kind, p_claim, ARRAY[v_id], p_error, p_retry, true);
            EXCEPTION WHEN serialization_failure THEN
                -- changed since the snapshot: no longer this claim's
                GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
                IF pg_catalog.starts_with(v_detail, 'Reason code: ') THEN
                    RAISE;
                END IF;
            END;
        END LOOP;
        RETURN n;
    END IF;
    IF p_kind OPERATOR(pg_catalog.=) 'a' THEN
        -- the claim's topic row FOR KEY SHARE first, as publish() takes
        -- it: the count row's foreign key takes that lock too, and taken
        -- after the messages' row locks it would deadlock with a
        -- drop_topic() that holds the topic and waits for the messages
        -- (a claim's messages are of one topic)
        PERFORM FROM idempotency.outbox_topic AS t
         WHERE t.id OPERATOR(pg_catalog.=) (SELECT m.topic_id FROM idempotency.outbox_message AS m
                                             WHERE m.id OPERATOR(pg_catalog.=) ANY (p_ids)
                                               AND m.claim OPERATOR(pg_catalog.=) p_claim LIMIT 1)
           FOR KEY SHARE OF t;
        -- delivered: the rows go, their count and retries stay (one row
        -- per topic; none when nothing was acked)
        WITH d AS (
            DELETE FROM idempotency.outbox_message AS m
             USING idempotency.outbox_topic AS t
             WHERE m.id OPERATOR(pg_catalog.=) ANY (p_ids)
               AND m.claim OPERATOR(pg_catalog.=) p_claim
               AND m.state OPERATOR(pg_catalog.=) 'pending'
               AND t.id OPERATOR(pg_catalog.=) m.topic_id
               AND (t.owner OPERATOR(pg_catalog.=) me
                    OR (EXISTS (SELECT 1 FROM idempotency.outbox_grant AS g
                                 WHERE g.topic_id OPERATOR(pg_catalog.=) t.id AND g.grantee OPERATOR(pg_catalog.=) me AND g.can_consume)
                        AND EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) t.owner::pg_catalog.oid)))
            RETURNING m.topic_id, m.attempts),
        c AS (
            INSERT INTO idempotency.outbox_acked AS a (topic_id, delivered, retried)
            SELECT d.topic_id, pg_catalog.count(*), pg_catalog.sum(GREATEST(d.attempts OPERATOR(pg_catalog.-) 1, 0))
              FROM d GROUP BY d.topic_id
            RETURNING a.delivered)
        SELECT COALESCE(pg_catalog.sum(c.delivered), 0) INTO n FROM c;
        RETURN n;
    END IF;
    UPDATE idempotency.outbox_message AS m
       SET claim = NULL,
           state = CASE WHEN p_kind OPERATOR(pg_catalog.=) 'n' AND m.attempts OPERATOR(pg_catalog.>=) t.max_attempts THEN 'dead'
                        ELSE 'pending' END,
           last_error = CASE WHEN p_kind OPERATOR(pg_catalog.=) 'n' THEN p_error ELSE m.last_error END,
           attempts = CASE WHEN p_kind OPERATOR(pg_catalog.=) 'r' THEN GREATEST(m.attempts OPERATOR(pg_catalog.-) 1, 0) ELSE m.attempts END,
           available_at = CASE WHEN p_kind OPERATOR(pg_catalog.=) 'r' THEN v_now
               ELSE v_now OPERATOR(pg_catalog.+) coalesce(p_retry,
                   CASE WHEN t.backoff_max OPERATOR(pg_catalog./) pg_catalog.power(2::pg_catalog.float8,
                                                              LEAST(GREATEST(m.attempts OPERATOR(pg_catalog.-) 1, 0), 30)::pg_catalog.float8)
                             OPERATOR(pg_catalog.<=) t.backoff_base
                   THEN t.backoff_max
                   ELSE LEAST(t.backoff_max, t.backoff_base OPERATOR(pg_catalog.*) pg_catalog.power(2::pg_catalog.float8,
                                                              LEAST(GREATEST(m.attempts OPERATOR(pg_catalog.-) 1, 0), 30)::pg_catalog.float8)) END) END
      FROM idempotency.outbox_topic AS t
     WHERE m.id OPERATOR(pg_catalog.=) ANY (p_ids)
       AND m.claim OPERATOR(pg_catalog.=) p_claim
       AND m.state OPERATOR(pg_catalog.=) 'pending'
       AND t.id OPERATOR(pg_catalog.=) m.topic_id
       AND (t.owner OPERATOR(pg_catalog.=) me
            OR (EXISTS (SELECT 1 FROM idempotency.outbox_grant AS g
                         WHERE g.topic_id OPERATOR(pg_catalog.=) t.id AND g.grantee OPERATOR(pg_catalog.=) me AND g.can_consume)
                AND EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) t.owner::pg_catalog.oid)));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$fn$;
COMMENT ON FUNCTION idempotency._outbox_settle(pg_catalog."char", pg_catalog.uuid, pg_catalog.int8[], pg_catalog.jsonb, pg_catalog.interval, pg_catalog.bool) IS
'Portable edition, internal: ack(), nack() and release() of a claim''s messages (a message changed since a transaction snapshot counts 0)';

REVOKE ALL ON FUNCTION idempotency._outbox_topic_arg(pg_catalog.text),
    idempotency._outbox_interval(pg_catalog.interval, pg_catalog.text, pg_catalog.bool),
    idempotency._outbox_topic_locked(pg_catalog.text, pg_catalog.text),
    idempotency._outbox_topic(pg_catalog.text, pg_catalog.text, pg_catalog.bool, pg_catalog.text),
    idempotency._outbox_key_lock(pg_catalog.int4, pg_catalog.text),
    idempotency._outbox_ids_arg(pg_catalog.int8[]),
    idempotency._outbox_full_xid(pg_catalog.xid, pg_catalog.int8),
    idempotency._outbox_notify(),
    idempotency._outbox_drop_row(pg_catalog.int4, pg_catalog.text),
    idempotency._outbox_settle(pg_catalog."char", pg_catalog.uuid, pg_catalog.int8[], pg_catalog.jsonb, pg_catalog.interval, pg_catalog.bool) FROM PUBLIC;
-- @end

-- ---------------------------------------------------------------------
-- Topics
-- ---------------------------------------------------------------------

-- @body idempotency_create_topic
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_topic ALIAS FOR $1;
    v_id    pg_catalog.int4;
    v_old   pg_catalog.int4;
BEGIN
    PERFORM idempotency._outbox_topic_arg(p_topic);
    IF $2 IS NULL THEN RAISE EXCEPTION 'max_attempts must not be null' USING ERRCODE = 'null_value_not_allowed'; END IF;
    IF $3 IS NULL THEN RAISE EXCEPTION 'backoff_base must not be null' USING ERRCODE = 'null_value_not_allowed'; END IF;
    IF $4 IS NULL THEN RAISE EXCEPTION 'backoff_max must not be null' USING ERRCODE = 'null_value_not_allowed'; END IF;
    IF $5 IS NULL THEN RAISE EXCEPTION 'retention must not be null' USING ERRCODE = 'null_value_not_allowed'; END IF;
    IF $6 IS NULL THEN RAISE EXCEPTION 'notify must not be null' USING ERRCODE = 'null_value_not_allowed'; END IF;
    IF $2 < 1 THEN
        RAISE EXCEPTION 'max_attempts must be at least 1' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM idempotency._outbox_interval($3, 'backoff_base', false);
    PERFORM idempotency._outbox_interval($4, 'backoff_max', false);
    PERFORM idempotency._outbox_interval($5, 'retention', false);
    FOR i IN 0..1 LOOP
        INSERT INTO idempotency.outbox_topic AS t
               (name, owner, max_attempts, backoff_base, backoff_max, retention, notify)
        VALUES (p_topic, idempotency._caller(), $2, $3, $4, $5, $6)
        ON CONFLICT (name) DO NOTHING RETURNING t.id INTO v_id;
        IF v_id IS NOT NULL THEN
            RETURN v_id;
        END IF;
        -- a topic whose owner was dropped belongs to no role: take its name
        -- over, dropping it with its grants and messages (as drop_topic(force))
        v_old := NULL;
        IF i = 0 THEN
            BEGIN
                SELECT t.id INTO v_old FROM idempotency.outbox_topic AS t
                 WHERE t.name = p_topic
                   AND NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid = t.owner::pg_catalog.oid)
                   FOR UPDATE OF t;
            EXCEPTION WHEN serialization_failure THEN
                RAISE EXCEPTION 'could not serialize access due to concurrent publish()'
                    USING ERRCODE = 'serialization_failure',
                          DETAIL = pg_catalog.format('A message was published to topic "%s" after this transaction''s snapshot was taken.', p_topic),
                          HINT = 'Retry the transaction.';
            END;
        END IF;
        IF v_old IS NULL THEN
            RAISE EXCEPTION 'topic "%" already exists', p_topic USING ERRCODE = 'duplicate_object',
                DETAIL = 'Topic names are shared by every role of the database.';
        END IF;
        DELETE FROM idempotency.outbox_message AS m WHERE m.topic_id = v_old;
        PERFORM idempotency._outbox_drop_row(v_old, p_topic);
    END LOOP;
    RAISE EXCEPTION 'topic "%" already exists', p_topic USING ERRCODE = 'duplicate_object',
        DETAIL = 'Topic names are shared by every role of the database.';
END
$fn$
-- @end

-- @body idempotency_alter_topic
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    t idempotency.outbox_topic;
BEGIN
    PERFORM idempotency._outbox_topic_arg($1);
    IF $2 < 1 THEN
        RAISE EXCEPTION 'max_attempts must be at least 1' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $3 IS NOT NULL THEN PERFORM idempotency._outbox_interval($3, 'backoff_base', false); END IF;
    IF $4 IS NOT NULL THEN PERFORM idempotency._outbox_interval($4, 'backoff_max', false); END IF;
    IF $5 IS NOT NULL THEN PERFORM idempotency._outbox_interval($5, 'retention', false); END IF;
    t := idempotency._outbox_topic($1, 'own');
    UPDATE idempotency.outbox_topic AS o
       SET max_attempts = coalesce($2, o.max_attempts),
           backoff_base = coalesce($3, o.backoff_base),
           backoff_max = coalesce($4, o.backoff_max),
           retention = coalesce($5, o.retention),
           notify = coalesce($6, o.notify)
     WHERE o.id = t.id;
    IF NOT FOUND THEN
        -- dropped by a drop_topic() that committed after the look above
        RAISE EXCEPTION 'topic "%" does not exist', $1 USING ERRCODE = 'undefined_object',
            HINT = 'Create it with idempotency.create_topic().';
    END IF;
END
$fn$
-- @end

-- @body idempotency_drop_topic
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    t idempotency.outbox_topic;
    n pg_catalog.int8;
BEGIN
    PERFORM idempotency._outbox_topic_arg($1);
    -- the row lock waits for the publishers in flight (FOR KEY SHARE) and
    -- another drop; it returns the row as it is after them (or none)
    t := idempotency._outbox_topic($1, 'own', false, 'update');
    IF NOT coalesce($2, false) THEN
        SELECT pg_catalog.count(*) INTO n FROM idempotency.outbox_message AS m
         WHERE m.topic_id = t.id AND m.state = 'pending';
        IF n > 0 THEN
            RAISE EXCEPTION 'topic "%" has undelivered messages', $1 USING ERRCODE = 'object_in_use',
                DETAIL = CASE WHEN n = 1 THEN pg_catalog.format('%s message of the topic is not delivered yet.', n)
                              ELSE pg_catalog.format('%s messages of the topic are not delivered yet.', n) END,
                HINT = 'Use drop_topic(topic, force => true) to drop them too.';
        END IF;
    END IF;
    DELETE FROM idempotency.outbox_message AS m WHERE m.topic_id = t.id;
    PERFORM idempotency._outbox_drop_row(t.id, $1);
END
$fn$
-- @end

-- @body idempotency_grant_topic
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    t idempotency.outbox_topic;
BEGIN
    PERFORM idempotency._outbox_topic_arg($1);
    IF $2 IS NULL THEN RAISE EXCEPTION 'grantee must not be null' USING ERRCODE = 'null_value_not_allowed'; END IF;
    IF $3 IS NULL THEN RAISE EXCEPTION 'publish must not be null' USING ERRCODE = 'null_value_not_allowed'; END IF;
    IF $4 IS NULL THEN RAISE EXCEPTION 'consume must not be null' USING ERRCODE = 'null_value_not_allowed'; END IF;
    -- locked as publish() locks it: a drop_topic() in flight is waited for,
    -- and the grant's foreign key then finds the topic still there
    t := idempotency._outbox_topic($1, 'own', false, 'key share');
    INSERT INTO idempotency.outbox_grant AS g (topic_id, grantee, topic_owner, can_publish, can_consume)
    VALUES (t.id, $2, t.owner, $3, $4)
    ON CONFLICT (topic_id, grantee) DO UPDATE
       SET can_publish = excluded.can_publish, can_consume = excluded.can_consume;
END
$fn$
-- @end

-- @body idempotency_revoke_topic
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    t idempotency.outbox_topic;
BEGIN
    PERFORM idempotency._outbox_topic_arg($1);
    IF $2 IS NULL THEN RAISE EXCEPTION 'grantee must not be null' USING ERRCODE = 'null_value_not_allowed'; END IF;
    t := idempotency._outbox_topic($1, 'own');
    DELETE FROM idempotency.outbox_grant AS g WHERE g.topic_id = t.id AND g.grantee = $2;
    RETURN FOUND;
END
$fn$
-- @end

-- ---------------------------------------------------------------------
-- publish(topic, payload, message_key, headers, deliver_after)
-- ---------------------------------------------------------------------

-- @body idempotency_publish
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_topic   ALIAS FOR $1;
    p_payload ALIAS FOR $2;
    p_key     ALIAS FOR $3;
    p_headers ALIAS FOR $4;
    p_after   ALIAS FOR $5;
    v_now     pg_catalog.timestamptz := pg_catalog.now();
    v_avail   pg_catalog.timestamptz := pg_catalog.now();
    v_mid     pg_catalog.uuid;
    v_id      pg_catalog.int8;
    v_n       pg_catalog.int8;
    t         idempotency.outbox_topic;
BEGIN
    PERFORM idempotency._outbox_topic_arg(p_topic);
    IF p_payload IS NULL THEN
        RAISE EXCEPTION 'payload must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF p_headers IS NOT NULL AND pg_catalog.jsonb_typeof(p_headers) <> 'object' THEN
        RAISE EXCEPTION 'headers must be a JSON object' USING ERRCODE = 'invalid_parameter_value',
            DETAIL = 'A message''s headers are {"name": "value", ...}.';
    END IF;
    IF p_after IS NOT NULL THEN
        PERFORM idempotency._outbox_interval(p_after, 'deliver_after', false);
        v_avail := v_now + p_after;
    END IF;
    IF pg_catalog.current_setting('transaction_read_only')::pg_catalog.bool THEN
        -- what the C edition says at nextval(), after the same checks
        t := idempotency._outbox_topic(p_topic, 'publish');
        IF p_key IS NOT NULL THEN
            PERFORM idempotency._check_key(p_key, p_topic, 'message key');
        END IF;
        RAISE EXCEPTION 'cannot execute nextval() in a read-only transaction'
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    -- the topic, held to the end of the transaction (drop_topic() waits)
    t := idempotency._outbox_topic(p_topic, 'publish', false, 'key share');
    -- keyed: the key's lock before the id (per key, id order is commit order)
    IF p_key IS NOT NULL THEN
        PERFORM idempotency._check_key(p_key, p_topic, 'message key');
        PERFORM idempotency._outbox_key_lock(t.id, p_key);
    END IF;
    v_id := pg_catalog.nextval('idempotency.outbox_message_id_seq'::pg_catalog.regclass);
    v_mid := pg_catalog.gen_random_uuid();
    INSERT INTO idempotency.outbox_message
           (id, topic_id, owner, message_id, message_key, payload, headers,
            available_at, published_at, published_by, state)
    VALUES (v_id, t.id, t.owner, v_mid, p_key, p_payload, coalesce(p_headers, '{}'::pg_catalog.jsonb),
            v_avail, v_now, idempotency._caller(), 'pending');
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n <> 1 THEN
        RAISE EXCEPTION 'the message was not stored in table idempotency.outbox_message'
            USING ERRCODE = 'triggered_action_exception',
                  DETAIL = 'A trigger on the table skipped the row.';
    END IF;
    IF t.notify THEN
        INSERT INTO idempotency.outbox_notify (topic) VALUES (p_topic);
    END IF;
    RETURN v_mid;
END
$fn$
-- @end

-- ---------------------------------------------------------------------
-- The relay API
-- ---------------------------------------------------------------------

-- claim(topic, batch_size, visibility): the C edition's statements for
-- claims in the rows.  First the window: the first max(64, 4 x batch_size)
-- ready messages in availability order, those unkeyed or the earliest
-- pending message of their key; when that was full and gave fewer than
-- batch_size, also beyond it (every key's earliest pending message, by a
-- skip through the key index, and the ready unkeyed ones).  Candidates are
-- locked FOR UPDATE SKIP LOCKED in availability order and re-checked; a
-- lapsed claim at max_attempts makes its message dead instead, and the
-- statement runs again for the places those took.
-- @body idempotency_claim
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    p_topic  ALIAS FOR $1;
    p_batch  ALIAS FOR $2;
    p_vis    ALIAS FOR $3;
    t        idempotency.outbox_topic;
    v_now    pg_catalog.timestamptz;
    v_until  pg_catalog.timestamptz;
    v_claim  pg_catalog.uuid := pg_catalog.gen_random_uuid();
    v_window pg_catalog.int4;
    v_got    pg_catalog.int4 := 0;
    v_dead   pg_catalog.int4;
    v_full   pg_catalog.bool;
    v_pass   pg_catalog.int4;
    v_ids    pg_catalog.tid[];
    v_n      pg_catalog.int4;
BEGIN
    -- each check's function raises its error; called only when it will
    IF p_topic IS NULL OR p_topic OPERATOR(pg_catalog.!~) '^[A-Za-z0-9_.:-]{1,40}$' THEN
        PERFORM idempotency._outbox_topic_arg(p_topic);
    END IF;
    IF p_batch IS NULL THEN
        RAISE EXCEPTION 'batch_size must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF p_vis IS NULL THEN
        RAISE EXCEPTION 'visibility must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF p_batch < 1 OR p_batch > 10000 THEN
        RAISE EXCEPTION 'batch_size must be between 1 and 10000' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_vis OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval THEN
        PERFORM idempotency._outbox_interval(p_vis, 'visibility', true);
    END IF;
    v_window := GREATEST(64, p_batch * 4);
    v_now := pg_catalog.clock_timestamp();
    v_until := v_now + p_vis;
    t := idempotency._outbox_topic(p_topic, 'consume');

    -- pass 1: the window; pass 2: beyond it, when the window was full
    FOR v_pass IN 1..2 LOOP
        IF v_pass = 2 THEN
            EXIT WHEN v_got >= p_batch;
            SELECT pg_catalog.count(*) >= v_window INTO v_full FROM (
                SELECT 1 FROM idempotency.outbox_message AS w0
                 WHERE w0.topic_id = t.id AND w0.state = 'pending' AND w0.available_at <= v_now
                 LIMIT v_window) AS w;
            EXIT WHEN NOT v_full;
        END IF;
        LOOP
            v_dead := 0;
            -- the candidates, locked FOR UPDATE SKIP LOCKED in availability
            -- order and re-checked on the locked row
            IF v_pass = 1 THEN
                -- the window, read in its order only as far as the locks
                -- need: unkeyed messages and the earliest pending one of
                -- their key
                SELECT ARRAY(
                    SELECT q.ctid
                      FROM (SELECT w0.id, w0.message_key, w0.available_at
                              FROM idempotency.outbox_message AS w0
                             WHERE w0.topic_id = t.id AND w0.state = 'pending'
                               AND w0.available_at <= v_now
                             ORDER BY w0.available_at, w0.id LIMIT v_window) AS w
                      JOIN idempotency.outbox_message AS q ON q.id = w.id
                     WHERE (w.message_key IS NULL OR NOT EXISTS (
                            SELECT 1 FROM idempotency.outbox_message AS p
                             WHERE p.topic_id = t.id AND p.message_key = w.message_key
                               AND p.state = 'pending' AND p.id < w.id))
                       AND q.state = 'pending' AND q.available_at <= v_now
                     ORDER BY w.available_at, w.id
                     LIMIT p_batch - v_got FOR UPDATE OF q SKIP LOCKED) INTO v_ids;
            ELSE
                -- beyond the window: every key's earliest pending message,
                -- by a skip through the key index, and the ready unkeyed ones
                SELECT ARRAY(
                    WITH RECURSIVE
                    k(key) AS (
                        (SELECT s.message_key FROM idempotency.outbox_message AS s
                          WHERE s.topic_id = t.id AND s.state = 'pending'
                            AND s.message_key IS NOT NULL
                          ORDER BY s.message_key LIMIT 1)
                        UNION ALL
                        SELECT (SELECT s.message_key FROM idempotency.outbox_message AS s
                                 WHERE s.topic_id = t.id AND s.state = 'pending'
                                   AND s.message_key > k.key
                                 ORDER BY s.message_key LIMIT 1)
                          FROM k WHERE k.key IS NOT NULL),
                    cand AS (
                        SELECT (SELECT h.id FROM idempotency.outbox_message AS h
                                 WHERE h.topic_id = t.id AND h.state = 'pending'
                                   AND h.message_key = k.key
                                 ORDER BY h.id LIMIT 1)
                          FROM k WHERE k.key IS NOT NULL
                        UNION ALL
                        (SELECT u.id FROM idempotency.outbox_message AS u
                          WHERE u.topic_id = t.id AND u.state = 'pending'
                            AND u.message_key IS NULL AND u.available_at <= v_now
                          ORDER BY u.available_at, u.id LIMIT p_batch - v_got))
                    SELECT q.ctid FROM idempotency.outbox_message AS q
                     WHERE q.id = ANY (ARRAY(SELECT cand.id FROM cand))
                       AND q.state = 'pending' AND q.available_at <= v_now
                     ORDER BY q.available_at, q.id
                     LIMIT p_batch - v_got FOR UPDATE SKIP LOCKED) INTO v_ids;
            END IF;
            EXIT WHEN pg_catalog.cardinality(v_ids) = 0;
            -- every locked row is updated (re-checked under the lock), found
            -- by its position: the lock returns the row version it holds,
            -- the newest, which no one can change before this transaction
            -- ends (a TID scan, not a second primary-key descent per row);
            -- those claimed go out, those at max_attempts went dead
            RETURN QUERY
                WITH c AS (
                    UPDATE idempotency.outbox_message AS m
                       SET attempts = CASE WHEN m.attempts >= t.max_attempts THEN m.attempts
                                      ELSE m.attempts + 1 END,
                           claim = CASE WHEN m.attempts >= t.max_attempts THEN NULL ELSE v_claim END,
                           available_at = v_until,
                           state = CASE WHEN m.attempts >= t.max_attempts THEN 'dead' ELSE 'pending' END,
                           last_error = CASE WHEN m.claim IS NULL THEN m.last_error
                                        ELSE '{"error": "visibility timeout: the claim lapsed without ack or nack"}'::pg_catalog.jsonb END
                     WHERE m.ctid = ANY (v_ids)
                       AND m.state = 'pending' AND m.available_at <= v_now
                    RETURNING m.id, m.message_id, m.message_key, m.payload, m.headers,
                              m.attempts, m.published_at, m.state)
                SELECT c.id, c.message_id, p_topic, c.message_key, c.payload, c.headers,
                       c.attempts, c.published_at, v_claim, v_until
                  FROM c WHERE c.state = 'pending' ORDER BY c.id;
            GET DIAGNOSTICS v_n = ROW_COUNT;
            v_got := v_got + v_n;
            v_dead := pg_catalog.cardinality(v_ids) - v_n;
            EXIT WHEN v_dead = 0 OR v_got >= p_batch;
        END LOOP;
    END LOOP;
    RETURN;
END
$fn$
-- @end

-- @body idempotency_ack
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $fn$
BEGIN
    IF $2 IS NULL OR pg_catalog.array_position($2, NULL) IS NOT NULL THEN
        PERFORM idempotency._outbox_ids_arg($2);
    END IF;
    RETURN idempotency._outbox_settle('a', $1, $2, NULL, NULL);
END
$fn$
-- @end

-- nack(): the retry after retry_in, by default backoff_base * 2^(attempt - 1)
-- capped at backoff_max (capped before it is doubled, so it cannot leave
-- the interval's range), dead at max_attempts
-- @body idempotency_nack
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $fn$
BEGIN
    IF $4 IS NOT NULL THEN
        PERFORM idempotency._outbox_interval($4, 'retry_in', false);
    END IF;
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'claim must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF $2 IS NULL OR pg_catalog.array_position($2, NULL) IS NOT NULL THEN
        PERFORM idempotency._outbox_ids_arg($2);
    END IF;
    RETURN idempotency._outbox_settle('n', $1, $2, $3, $4);
END
$fn$
-- @end

-- @body idempotency_release
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $fn$
BEGIN
    IF $2 IS NULL OR pg_catalog.array_position($2, NULL) IS NOT NULL THEN
        PERFORM idempotency._outbox_ids_arg($2);
    END IF;
    RETURN idempotency._outbox_settle('r', $1, $2, NULL, NULL);
END
$fn$
-- @end

-- redrive(): a redriven message takes a new id, drawn after its key's lock
-- as publish() draws one (its message_id stays), so it goes out after
-- every message of its key published before, never beside one that is out.
-- The dead messages are locked first: a concurrent redrive of them waits,
-- then finds them pending.
-- @body idempotency_redrive
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    t     idempotency.outbox_topic;
    v_now pg_catalog.timestamptz := pg_catalog.clock_timestamp();
    v_old pg_catalog.int8[] := '{}';
    v_new pg_catalog.int8[] := '{}';
    r     record;
    n     pg_catalog.int4;
BEGIN
    PERFORM idempotency._outbox_topic_arg($1);
    IF $2 IS NOT NULL THEN
        PERFORM idempotency._outbox_ids_arg($2);
    END IF;
    t := idempotency._outbox_topic($1, 'consume');
    FOR r IN SELECT m.id, m.message_key FROM idempotency.outbox_message AS m
              WHERE m.topic_id = t.id AND m.state = 'dead'
                AND ($2 IS NULL OR m.id = ANY ($2))
              ORDER BY m.id FOR UPDATE LOOP
        IF r.message_key IS NOT NULL THEN
            PERFORM idempotency._outbox_key_lock(t.id, r.message_key);
        END IF;
        v_old := v_old || r.id;
        v_new := v_new || pg_catalog.nextval('idempotency.outbox_message_id_seq'::pg_catalog.regclass);
    END LOOP;
    IF pg_catalog.cardinality(v_old) = 0 THEN
        RETURN 0;
    END IF;
    UPDATE idempotency.outbox_message AS m
       SET id = x.new_id, state = 'pending', attempts = 0, claim = NULL, available_at = v_now
      FROM ROWS FROM (pg_catalog.unnest(v_old), pg_catalog.unnest(v_new)) AS x(old_id, new_id)
     WHERE m.id = x.old_id AND m.state = 'dead';
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 AND t.notify THEN
        INSERT INTO idempotency.outbox_notify (topic) VALUES ($1);
    END IF;
    RETURN n;
END
$fn$
-- @end

-- ---------------------------------------------------------------------
-- wait_for(topics, timeout, since): polling
--
-- A function cannot LISTEN (a backend takes notifications between
-- transactions, not inside a statement), and NOTIFY would serialise every
-- publishing transaction's commit on a cluster-wide lock; so wait_for()
-- polls, in the statement the relay sends (any driver, PgBouncer in
-- transaction mode), and publishers write nothing for it.  What it looks
-- for: a pending, unclaimed, ready message of one of the topics whose row
-- version was written by a transaction that had not committed when the
-- cursor was taken (a publish, a release, a redrive, a nack with a retry
-- due).  The cursor is the snapshot the call (or the one that returned
-- it) took: its xmax, then the transactions in progress then, as int8s;
-- a commit after it is never missed, and one before it never wakes.  Each
-- look is one index scan per topic; between looks the wait sleeps 5 ms,
-- doubled after each empty look up to 100 ms, so a commit is seen within
-- about 100 ms by a relay that has waited a while.
-- ---------------------------------------------------------------------

-- @body idempotency_wait_for
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_topics  ALIAS FOR $1;
    p_timeout ALIAS FOR $2;
    p_since   ALIAS FOR $3;
    o_woken   ALIAS FOR $4;
    o_cursor  ALIAS FOR $5;
    v_ids     pg_catalog.int4[] := '{}';
    v_names   pg_catalog.text[] := '{}';
    v_snap    pg_catalog.pg_snapshot;
    v_cur     pg_catalog.int8[];
    v_xmax    pg_catalog.int8;
    v_xip     pg_catalog.int8[];
    v_end     pg_catalog.timestamptz;
    v_sleep   pg_catalog.float8 := 0.005;
    v_left    pg_catalog.float8;
    t         idempotency.outbox_topic;
    i         pg_catalog.int4;
BEGIN
    IF p_topics IS NULL THEN
        RAISE EXCEPTION 'topics must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF pg_catalog.array_ndims(p_topics) > 1 THEN
        RAISE EXCEPTION 'topics must be a one-dimensional array' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF coalesce(pg_catalog.cardinality(p_topics), 0) NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'topics must name 1 to 100 topics' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.array_position(p_topics, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'topics must not contain nulls' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF p_timeout IS NULL THEN
        RAISE EXCEPTION 'timeout must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM idempotency._outbox_interval(p_timeout, 'timeout', false);
    IF p_since IS NOT NULL THEN
        IF pg_catalog.array_position(p_since, NULL) IS NOT NULL THEN
            RAISE EXCEPTION 'since must not contain nulls' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        -- a snapshot: xmax a normal transaction id not in the future, the
        -- transactions in progress normal ones below it
        IF coalesce(pg_catalog.cardinality(p_since), 0) < 1 OR pg_catalog.array_ndims(p_since) > 1
           OR p_since[1] < 3
           OR p_since[1] > pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::pg_catalog.text::pg_catalog.int8
           OR EXISTS (SELECT FROM pg_catalog.unnest(p_since[2:]) AS s(x) WHERE s.x < 3 OR s.x >= p_since[1]) THEN
            RAISE EXCEPTION 'since is not a cursor wait_for() returned' USING ERRCODE = 'invalid_parameter_value',
                HINT = 'Pass the cursor an earlier call with the same topics returned.';
        END IF;
    END IF;
    FOR i IN 1..pg_catalog.cardinality(p_topics) LOOP
        PERFORM idempotency._outbox_topic_arg(p_topics[i]);
        t := idempotency._outbox_topic(p_topics[i], 'consume');
        IF NOT t.id = ANY (v_ids) THEN
            v_ids := v_ids || t.id;
            v_names := v_names || t.name;
        END IF;
    END LOOP;

    -- the cursor: this call's snapshot, as its xmax and the transactions
    -- in progress
    v_snap := pg_catalog.pg_current_snapshot();
    v_cur := ARRAY[pg_catalog.pg_snapshot_xmax(v_snap)::pg_catalog.text::pg_catalog.int8]
             || ARRAY(SELECT x::pg_catalog.text::pg_catalog.int8 FROM pg_catalog.pg_snapshot_xip(v_snap) AS x);
    IF p_since IS NULL THEN
        p_since := v_cur;
    END IF;
    v_xmax := p_since[1];
    v_xip := p_since[2:];
    v_end := pg_catalog.clock_timestamp() + p_timeout;
    LOOP
        -- each statement here has a snapshot of its own (READ COMMITTED)
        o_woken := ARRAY(
            SELECT tn.name FROM ROWS FROM (pg_catalog.unnest(v_ids), pg_catalog.unnest(v_names)) WITH ORDINALITY AS tn(id, name, o)
             WHERE EXISTS (
                   SELECT 1 FROM idempotency.outbox_message AS m
                    WHERE m.topic_id = tn.id AND m.state = 'pending'
                      AND m.available_at <= pg_catalog.clock_timestamp()
                      AND m.claim IS NULL
                      AND (idempotency._outbox_full_xid(m.xmin, v_xmax) >= v_xmax
                           OR idempotency._outbox_full_xid(m.xmin, v_xmax) = ANY (v_xip))
                      -- not this transaction's own (uncommitted) rows
                      AND pg_catalog.pg_xact_status(idempotency._outbox_full_xid(m.xmin, v_xmax)::pg_catalog.text::pg_catalog.xid8)
                          = 'committed')
             ORDER BY tn.o);
        IF pg_catalog.cardinality(o_woken) > 0 THEN
            v_snap := pg_catalog.pg_current_snapshot();
            o_cursor := ARRAY[pg_catalog.pg_snapshot_xmax(v_snap)::pg_catalog.text::pg_catalog.int8]
                      || ARRAY(SELECT x::pg_catalog.text::pg_catalog.int8 FROM pg_catalog.pg_snapshot_xip(v_snap) AS x);
            RETURN;
        END IF;
        v_left := EXTRACT(epoch FROM v_end - pg_catalog.clock_timestamp())::pg_catalog.float8;
        EXIT WHEN v_left <= 0;
        PERFORM pg_catalog.pg_sleep(LEAST(v_sleep, v_left));
        v_sleep := LEAST(v_sleep * 2, 0.1);
    END LOOP;
    -- nothing: the cursor stays where it was (a commit since is not missed)
    o_woken := '{}';
    o_cursor := p_since;
    RETURN;
END
$fn$
-- @end

-- ---------------------------------------------------------------------
-- What the views read from the C edition's shared memory: here claims are
-- in the rows, and the acked counts in idempotency.outbox_acked
-- ---------------------------------------------------------------------

-- @body idempotency_outbox_claimed
LANGUAGE sql
AS $fn$ SELECT false $fn$
-- @end

-- @body idempotency_outbox_attempt
LANGUAGE sql
AS $fn$ SELECT NULL::pg_catalog.int4 $fn$
-- @end

-- the acked counts not yet added to the topic's row, through the table's
-- row security (the topics the caller sees; every topic for
-- pg_read_all_stats); outbox_stats reads the table itself
-- @body idempotency_outbox_counts
LANGUAGE sql
AS $fn$
SELECT COALESCE(pg_catalog.sum(a.delivered), 0)::pg_catalog.int8, COALESCE(pg_catalog.sum(a.retried), 0)::pg_catalog.int8
  FROM idempotency.outbox_acked AS a
 WHERE a.topic_id OPERATOR(pg_catalog.=) $1
$fn$
-- @end

-- @body idempotency_outbox_claim
LANGUAGE sql
AS $fn$ SELECT NULL::pg_catalog.uuid, NULL::pg_catalog.timestamptz, NULL::pg_catalog.int4 $fn$
-- @end
