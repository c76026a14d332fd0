/* idempotency--0.4.0--0.5.0.sql: update from 0.4.0 to 0.5.0 */

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.5.0'" to load this file. \quit

-- Each feature keeps its own section below, in the order of the 0.5.0
-- install script's additions.

-- == review fixes (issue 21) ==

-- == recovery points (issue 19) ==

-- == outbox (issue 18) ==
-- Messages published in the caller's transaction (publish()), delivered by
-- relays that claim them with a visibility timeout and ack or nack them
-- (src/outbox.c holds the design, the ordering proof and the locking).
-- Topics belong to roles; grant_topic() shares one with another role.
CREATE TABLE idempotency.outbox_topic (
    id           pg_catalog.int4        NOT NULL,
    name         pg_catalog.text        COLLATE "C" NOT NULL,
    owner        pg_catalog.regrole     NOT NULL,
    max_attempts pg_catalog.int4        NOT NULL,
    backoff_base pg_catalog.interval    NOT NULL,
    backoff_max  pg_catalog.interval    NOT NULL,
    retention    pg_catalog.interval    NOT NULL,
    notify       pg_catalog.bool        NOT NULL DEFAULT true,
    created_at   pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    -- counts of purged messages, so outbox_stats keeps counting after purge
    purged_delivered pg_catalog.int8    NOT NULL DEFAULT 0,
    purged_retries   pg_catalog.int8    NOT NULL DEFAULT 0,
    CONSTRAINT outbox_topic_pkey PRIMARY KEY (id),
    CONSTRAINT outbox_topic_name_key UNIQUE (name),
    -- the NOTIFY channel is 'idempotency.outbox.' || name: at most 63 bytes
    CONSTRAINT outbox_topic_name_check CHECK (name OPERATOR(pg_catalog.~) '^[A-Za-z0-9_.:-]{1,40}$'),
    CONSTRAINT outbox_topic_max_attempts_check CHECK (max_attempts OPERATOR(pg_catalog.>=) 1)
);
CREATE SEQUENCE idempotency.outbox_topic_id_seq AS pg_catalog.int4 OWNED BY idempotency.outbox_topic.id;
ALTER TABLE idempotency.outbox_topic
    ALTER COLUMN id SET DEFAULT pg_catalog.nextval('idempotency.outbox_topic_id_seq'::pg_catalog.regclass);
COMMENT ON TABLE idempotency.outbox_topic IS
'Outbox topics: one row per topic, owned by the role that created it (create_topic)';
COMMENT ON COLUMN idempotency.outbox_topic.notify IS 'publish() wakes relays with NOTIFY at commit (PostgreSQL serialises the commits of notifying transactions; false: relays poll)';

CREATE TABLE idempotency.outbox_grant (
    topic_id    pg_catalog.int4    NOT NULL,
    grantee     pg_catalog.regrole NOT NULL,
    topic_owner pg_catalog.regrole NOT NULL,
    can_publish pg_catalog.bool    NOT NULL,
    can_consume pg_catalog.bool    NOT NULL,
    CONSTRAINT outbox_grant_pkey PRIMARY KEY (topic_id, grantee),
    CONSTRAINT outbox_grant_topic_fkey FOREIGN KEY (topic_id)
        REFERENCES idempotency.outbox_topic (id) ON DELETE CASCADE
);
COMMENT ON TABLE idempotency.outbox_grant IS
'Roles a topic''s owner let publish to or consume from the topic (grant_topic, revoke_topic)';

CREATE SEQUENCE idempotency.outbox_message_id_seq AS pg_catalog.int8;
CREATE TABLE idempotency.outbox_message (
    id           pg_catalog.int8        NOT NULL,
    topic_id     pg_catalog.int4        NOT NULL,
    owner        pg_catalog.regrole     NOT NULL,
    message_id   pg_catalog.uuid        NOT NULL,
    message_key  pg_catalog.text        COLLATE "C",
    payload      pg_catalog.jsonb       NOT NULL,
    headers      pg_catalog.jsonb       NOT NULL,
    state        pg_catalog.text        COLLATE "C" NOT NULL,
    attempts     pg_catalog.int4        NOT NULL DEFAULT 0,
    available_at pg_catalog.timestamptz NOT NULL,
    claim        pg_catalog.uuid,
    published_at pg_catalog.timestamptz NOT NULL,
    published_by pg_catalog.regrole     NOT NULL,
    last_error   pg_catalog.jsonb,
    delivered_at pg_catalog.timestamptz,
    expires_at   pg_catalog.timestamptz,
    CONSTRAINT outbox_message_pkey PRIMARY KEY (id)
);
ALTER SEQUENCE idempotency.outbox_message_id_seq OWNED BY idempotency.outbox_message.id;
-- A queue table: every message leaves three dead row versions (claim, ack,
-- purge).  Vacuum it after a fixed number of them, not a fraction of a
-- table that is mostly empty, and without the cost delay.
ALTER TABLE idempotency.outbox_message SET (autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 10000, autovacuum_vacuum_cost_delay = 0);
COMMENT ON TABLE idempotency.outbox_message IS
'Outbox messages: written by publish() in the publisher''s transaction, claimed, acked and nacked by relays, purged after delivery';
COMMENT ON COLUMN idempotency.outbox_message.id IS 'taken after the message key''s lock: per key, id order is commit order';
COMMENT ON COLUMN idempotency.outbox_message.owner IS 'the topic''s owner (purge() by that role removes its delivered messages)';
COMMENT ON COLUMN idempotency.outbox_message.message_id IS 'stable id a relay sends downstream as Idempotency-Key';
COMMENT ON COLUMN idempotency.outbox_message.message_key IS 'messages of one key are delivered one at a time in commit order; NULL: no order';
COMMENT ON COLUMN idempotency.outbox_message.state IS 'pending (claimable or claimed), delivered, dead';
COMMENT ON COLUMN idempotency.outbox_message.attempts IS 'how many times the message was claimed';
COMMENT ON COLUMN idempotency.outbox_message.available_at IS 'pending: claimable from then (deliver_after, retry time, end of a claim''s visibility)';
COMMENT ON COLUMN idempotency.outbox_message.claim IS 'the current claim''s token; ack and nack must name it';
COMMENT ON COLUMN idempotency.outbox_message.expires_at IS 'delivered: purge removes the row after this; NULL otherwise';
-- claim(): ready messages of a topic in the order they became available
CREATE INDEX outbox_message_ready_idx ON idempotency.outbox_message (topic_id, available_at, id)
    WHERE state OPERATOR(pg_catalog.=) 'pending';
-- claim(), beyond its window: ready unkeyed messages
CREATE INDEX outbox_message_unkeyed_idx ON idempotency.outbox_message (topic_id, available_at, id)
    WHERE state OPERATOR(pg_catalog.=) 'pending' AND message_key IS NULL;
-- claim(): is an earlier message of the same key still undelivered?  And
-- each key's earliest pending message, key by key

CREATE INDEX outbox_message_key_idx ON idempotency.outbox_message (topic_id, message_key, id)
    WHERE state OPERATOR(pg_catalog.=) 'pending' AND message_key IS NOT NULL;
-- purge() finds delivered messages through this index
CREATE INDEX outbox_message_expires_at_idx ON idempotency.outbox_message (expires_at)
    WHERE expires_at IS NOT NULL;
-- the dead-letter view and redrive()
CREATE INDEX outbox_message_dead_idx ON idempotency.outbox_message (topic_id, id)
    WHERE state OPERATOR(pg_catalog.=) 'dead';

-- Row-level security: a role sees its own topics and those granted to it,
-- and the messages of the topics it owns or may consume.  Only the
-- functions write (as the extension's owner).
ALTER TABLE idempotency.outbox_grant ENABLE ROW LEVEL SECURITY;
CREATE POLICY outbox_grant_own_rows ON idempotency.outbox_grant
    FOR SELECT
    USING (grantee OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))
           OR topic_owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER)));
ALTER TABLE idempotency.outbox_topic ENABLE ROW LEVEL SECURITY;
CREATE POLICY outbox_topic_own_rows ON idempotency.outbox_topic
    FOR SELECT
    USING (owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))
           OR EXISTS (SELECT 1 FROM idempotency.outbox_grant AS g
                       WHERE g.topic_id OPERATOR(pg_catalog.=) id
                         AND g.grantee OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))));
ALTER TABLE idempotency.outbox_message ENABLE ROW LEVEL SECURITY;
CREATE POLICY outbox_message_own_rows ON idempotency.outbox_message
    FOR SELECT
    USING (owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))
           OR EXISTS (SELECT 1 FROM idempotency.outbox_grant AS g
                       WHERE g.topic_id OPERATOR(pg_catalog.=) topic_id
                         AND g.grantee OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))
                         AND g.can_consume));
REVOKE ALL ON idempotency.outbox_topic, idempotency.outbox_grant, idempotency.outbox_message FROM PUBLIC;
GRANT SELECT ON idempotency.outbox_topic, idempotency.outbox_grant, idempotency.outbox_message TO PUBLIC;
REVOKE ALL ON SEQUENCE idempotency.outbox_topic_id_seq, idempotency.outbox_message_id_seq FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_topic', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_topic_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_grant', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_message', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_message_id_seq', '');

CREATE FUNCTION idempotency.create_topic(
    topic        pg_catalog.text,
    max_attempts pg_catalog.int4     DEFAULT 10,
    backoff_base pg_catalog.interval DEFAULT '1 second',
    backoff_max  pg_catalog.interval DEFAULT '1 hour',
    retention    pg_catalog.interval DEFAULT '1 hour',
    notify       pg_catalog.bool     DEFAULT true)
RETURNS pg_catalog.int4
AS 'MODULE_PATHNAME', 'idempotency_create_topic'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.create_topic(pg_catalog.text, pg_catalog.int4, pg_catalog.interval, pg_catalog.interval, pg_catalog.interval, pg_catalog.bool) IS
'Create an outbox topic owned by the calling role; returns its id';

CREATE FUNCTION idempotency.alter_topic(
    topic        pg_catalog.text,
    max_attempts pg_catalog.int4     DEFAULT NULL,
    backoff_base pg_catalog.interval DEFAULT NULL,
    backoff_max  pg_catalog.interval DEFAULT NULL,
    retention    pg_catalog.interval DEFAULT NULL,
    notify       pg_catalog.bool     DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idempotency_alter_topic'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.alter_topic(pg_catalog.text, pg_catalog.int4, pg_catalog.interval, pg_catalog.interval, pg_catalog.interval, pg_catalog.bool) IS
'Change the settings of one of the caller''s topics (NULL keeps a setting)';

CREATE FUNCTION idempotency.drop_topic(
    topic pg_catalog.text,
    force pg_catalog.bool DEFAULT false)
RETURNS void
AS 'MODULE_PATHNAME', 'idempotency_drop_topic'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.drop_topic(pg_catalog.text, pg_catalog.bool) IS
'Drop one of the caller''s topics with its grants and messages; refuses while messages are undelivered unless force';

CREATE FUNCTION idempotency.grant_topic(
    topic   pg_catalog.text,
    grantee pg_catalog.regrole,
    publish pg_catalog.bool DEFAULT true,
    consume pg_catalog.bool DEFAULT true)
RETURNS void
AS 'MODULE_PATHNAME', 'idempotency_grant_topic'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.grant_topic(pg_catalog.text, pg_catalog.regrole, pg_catalog.bool, pg_catalog.bool) IS
'Let another role publish to and/or consume from one of the caller''s topics (replaces an earlier grant)';

CREATE FUNCTION idempotency.revoke_topic(
    topic   pg_catalog.text,
    grantee pg_catalog.regrole)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'idempotency_revoke_topic'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.revoke_topic(pg_catalog.text, pg_catalog.regrole) IS
'Take back what grant_topic() gave a role on one of the caller''s topics; false if it had nothing';

CREATE FUNCTION idempotency.publish(
    topic         pg_catalog.text,
    payload       pg_catalog.jsonb,
    message_key   pg_catalog.text     DEFAULT NULL,
    headers       pg_catalog.jsonb    DEFAULT '{}',
    deliver_after pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.uuid
AS 'MODULE_PATHNAME', 'idempotency_publish'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.publish(pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, pg_catalog.jsonb, pg_catalog.interval) IS
'Record a message in the caller''s transaction (delivered after commit, gone on rollback); returns its message id';

CREATE TYPE idempotency.outbox_claim AS (
    id           pg_catalog.int8,
    message_id   pg_catalog.uuid,
    topic        pg_catalog.text,
    message_key  pg_catalog.text,
    payload      pg_catalog.jsonb,
    headers      pg_catalog.jsonb,
    attempt      pg_catalog.int4,
    published_at pg_catalog.timestamptz,
    claim        pg_catalog.uuid,
    claimed_until pg_catalog.timestamptz
);

CREATE FUNCTION idempotency.claim(
    topic      pg_catalog.text,
    batch_size pg_catalog.int4     DEFAULT 10,
    visibility pg_catalog.interval DEFAULT '30 seconds')
RETURNS SETOF idempotency.outbox_claim
AS 'MODULE_PATHNAME', 'idempotency_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 10;
COMMENT ON FUNCTION idempotency.claim(pg_catalog.text, pg_catalog.int4, pg_catalog.interval) IS
'Claim up to batch_size ready messages of a topic for visibility (no other relay gets them meanwhile); one per message key, in commit order';

CREATE FUNCTION idempotency.ack(
    claim pg_catalog.uuid,
    ids   pg_catalog.int8[])
RETURNS pg_catalog.int4
AS 'MODULE_PATHNAME', 'idempotency_ack'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.ack(pg_catalog.uuid, pg_catalog.int8[]) IS
'Mark messages of a claim delivered; returns how many (a message claimed again since is not acked)';

CREATE FUNCTION idempotency.nack(
    claim    pg_catalog.uuid,
    ids      pg_catalog.int8[],
    error    pg_catalog.jsonb    DEFAULT NULL,
    retry_in pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.int4
AS 'MODULE_PATHNAME', 'idempotency_nack'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.nack(pg_catalog.uuid, pg_catalog.int8[], pg_catalog.jsonb, pg_catalog.interval) IS
'Give messages of a claim back after a failed delivery: retried after retry_in (default: capped exponential backoff), dead after max_attempts';

CREATE FUNCTION idempotency.release(
    claim pg_catalog.uuid,
    ids   pg_catalog.int8[])
RETURNS pg_catalog.int4
AS 'MODULE_PATHNAME', 'idempotency_release'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.release(pg_catalog.uuid, pg_catalog.int8[]) IS
'Give messages of a claim back unattempted (a relay stopping): claimable at once, the attempt not counted';

CREATE FUNCTION idempotency.redrive(
    topic pg_catalog.text,
    ids   pg_catalog.int8[] DEFAULT NULL)
RETURNS pg_catalog.int4
AS 'MODULE_PATHNAME', 'idempotency_redrive'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.redrive(pg_catalog.text, pg_catalog.int8[]) IS
'Send dead messages of a topic again (all of them, or those ids) with their attempts reset; returns how many';

CREATE VIEW idempotency.outbox_dead WITH (security_invoker = true) AS
SELECT m.id, m.message_id, t.name AS topic, m.message_key, m.payload, m.headers,
       m.attempts, m.last_error, m.published_at
  FROM idempotency.outbox_message AS m
  JOIN idempotency.outbox_topic AS t ON t.id OPERATOR(pg_catalog.=) m.topic_id
 WHERE m.state OPERATOR(pg_catalog.=) 'dead';
COMMENT ON VIEW idempotency.outbox_dead IS
'Dead letters: messages that failed max_attempts times, of the topics the caller owns or consumes; redrive() sends them again';
GRANT SELECT ON idempotency.outbox_dead TO PUBLIC;

-- Not security_invoker: it shows only counts, so roles in pg_read_all_stats
-- (a monitoring role, postgres_exporter) see every topic; other roles see
-- the topics they own or are granted.
CREATE VIEW idempotency.outbox_stats AS
SELECT t.name AS topic, t.owner,
       t.purged_delivered OPERATOR(pg_catalog.+) pg_catalog.count(m.id) AS published,
       t.purged_delivered OPERATOR(pg_catalog.+)
           pg_catalog.count(m.id) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'delivered') AS delivered,
       t.purged_retries OPERATOR(pg_catalog.+)
           COALESCE(pg_catalog.sum(GREATEST(m.attempts OPERATOR(pg_catalog.-) 1, 0)), 0) AS retried,
       pg_catalog.count(m.id) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'dead') AS dead,
       pg_catalog.count(m.id) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'pending'
                                        AND m.claim IS NOT NULL
                                        AND m.available_at OPERATOR(pg_catalog.>) pg_catalog.now()) AS in_flight,
       pg_catalog.count(m.id) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'pending') AS undelivered,
       pg_catalog.now() OPERATOR(pg_catalog.-)
           pg_catalog.min(m.published_at) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'pending') AS oldest_undelivered_age
  FROM idempotency.outbox_topic AS t
  LEFT JOIN idempotency.outbox_message AS m ON m.topic_id OPERATOR(pg_catalog.=) t.id
 WHERE t.owner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER))
    OR EXISTS (SELECT 1 FROM idempotency.outbox_grant AS g
                WHERE g.topic_id OPERATOR(pg_catalog.=) t.id
                  AND g.grantee OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER)))
    OR pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE')
 GROUP BY t.id;
COMMENT ON VIEW idempotency.outbox_stats IS
'Per topic the caller owns or is granted (every topic for pg_read_all_stats): messages published, delivered, retried (claims after the first), dead, in flight, undelivered, and the age of the oldest undelivered';
GRANT SELECT ON idempotency.outbox_stats TO PUBLIC;

-- == Citus (issue 17) ==
