/* idempotency--0.4.0--0.5.0.sql: update from 0.4.0 to 0.5.0 */

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.5.0'" to load this file. \quit

-- Each feature keeps its own section below, in the order of the 0.5.0
-- install script's additions.

-- == review fixes (issue 21) ==

-- Schema idempotency must be ours.  CREATE EXTENSION uses an existing schema
-- named in the control file as it finds it, so a role with CREATE on the
-- database could have created it first: as its owner that role could drop
-- the extension's objects and put its own beside them.  Refuse a schema
-- owned by a role that is not a superuser, on which such a role (or
-- PUBLIC) may create objects, or holding objects such a role owns; a
-- schema a superuser created (a pg_dump
-- restore creates it before CREATE EXTENSION) or that DROP EXTENSION left
-- behind is taken.  An update from 0.4.0 checks the same.
DO $$
DECLARE
    bad pg_catalog.text;
BEGIN
    SELECT pg_catalog.format('it belongs to role %I', r.rolname) INTO bad
      FROM pg_catalog.pg_namespace AS n
      JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) n.nspowner
     WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency' AND NOT r.rolsuper;
    IF bad IS NULL THEN
        SELECT pg_catalog.format('role %s may create objects in it',
                                 CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                      ELSE pg_catalog.quote_ident(r.rolname) END) INTO bad
          FROM pg_catalog.pg_namespace AS n,
               pg_catalog.aclexplode(n.nspacl) AS a
          LEFT JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency'
           AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
           AND NOT coalesce(r.rolsuper, false)
         LIMIT 1;
    END IF;
    IF bad IS NULL THEN
        -- objects another role put there while it could (an overload of
        -- one of our functions would catch calls meant for ours)
        SELECT pg_catalog.format('role %I owns %s', r.rolname,
                                 pg_catalog.pg_describe_object(o.classid, o.objid, 0)) INTO bad
          FROM (SELECT 'pg_catalog.pg_class'::pg_catalog.regclass AS classid, c.oid AS objid,
                       c.relowner AS owner, c.relnamespace AS nsp FROM pg_catalog.pg_class AS c
                UNION ALL
                SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, p.oid, p.proowner, p.pronamespace
                  FROM pg_catalog.pg_proc AS p
                UNION ALL
                SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, t.oid, t.typowner, t.typnamespace
                  FROM pg_catalog.pg_type AS t
                UNION ALL
                SELECT 'pg_catalog.pg_operator'::pg_catalog.regclass, op.oid, op.oprowner, op.oprnamespace
                  FROM pg_catalog.pg_operator AS op
                UNION ALL
                SELECT 'pg_catalog.pg_collation'::pg_catalog.regclass, co.oid, co.collowner, co.collnamespace
                  FROM pg_catalog.pg_collation AS co
                UNION ALL
                SELECT 'pg_catalog.pg_conversion'::pg_catalog.regclass, cv.oid, cv.conowner, cv.connamespace
                  FROM pg_catalog.pg_conversion AS cv
                UNION ALL
                SELECT 'pg_catalog.pg_opclass'::pg_catalog.regclass, oc.oid, oc.opcowner, oc.opcnamespace
                  FROM pg_catalog.pg_opclass AS oc
                UNION ALL
                SELECT 'pg_catalog.pg_opfamily'::pg_catalog.regclass, f.oid, f.opfowner, f.opfnamespace
                  FROM pg_catalog.pg_opfamily AS f
                UNION ALL
                SELECT 'pg_catalog.pg_ts_config'::pg_catalog.regclass, tc.oid, tc.cfgowner, tc.cfgnamespace
                  FROM pg_catalog.pg_ts_config AS tc
                UNION ALL
                SELECT 'pg_catalog.pg_ts_dict'::pg_catalog.regclass, td.oid, td.dictowner, td.dictnamespace
                  FROM pg_catalog.pg_ts_dict AS td
                UNION ALL
                SELECT 'pg_catalog.pg_statistic_ext'::pg_catalog.regclass, se.oid, se.stxowner, se.stxnamespace
                  FROM pg_catalog.pg_statistic_ext AS se) AS o
          JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) o.owner
         WHERE o.nsp OPERATOR(pg_catalog.=) (SELECT n.oid FROM pg_catalog.pg_namespace AS n
                                              WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency')
           AND NOT r.rolsuper
         LIMIT 1;
    END IF;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'schema idempotency is not safe for the extension: %', bad
            USING ERRCODE = 'duplicate_schema',
                  DETAIL = 'The extension''s schema and everything in it must belong to superusers, and no other role may create objects in it: such a role could drop the extension''s tables or put its own objects beside them.',
                  HINT = 'Check what the schema holds, then drop it, or give it to a superuser (ALTER SCHEMA idempotency OWNER TO ...), revoke CREATE on it and drop the objects of other roles, and run the command again.';
    END IF;
END
$$;

-- == recovery points (issue 19) ==
-- A request that calls other systems runs in phases under one lease-mode
-- key.  Each phase commits its business writes together with
-- checkpoint(), which records the key's recovery point (a name) and state
-- (jsonb the handler chooses, e.g. the charge id) in the same transaction;
-- a retry's begin() and lookup() return them, so it resumes where the
-- last committed phase ended.  derive_key() gives the stable key to send
-- to another system's API.  Added with ALTER, here as in the update
-- script, so a fresh and an updated database have the same column order.
ALTER TABLE idempotency.idempotency_key
    ADD COLUMN recovery_point pg_catalog.text,
    ADD COLUMN recovery_state pg_catalog.jsonb;
COMMENT ON COLUMN idempotency.idempotency_key.recovery_point IS
'last recovery point checkpoint() recorded for the key (lease mode), or NULL';
COMMENT ON COLUMN idempotency.idempotency_key.recovery_state IS
'state recorded with the recovery point (jsonb the handler chooses), or NULL';

ALTER TYPE idempotency.begin_result
    ADD ATTRIBUTE recovery_point pg_catalog.text,
    ADD ATTRIBUTE recovery_state pg_catalog.jsonb;
ALTER TYPE idempotency.lookup_result
    ADD ATTRIBUTE recovery_point pg_catalog.text,
    ADD ATTRIBUTE recovery_state pg_catalog.jsonb;

CREATE FUNCTION idempotency.checkpoint(
    key     pg_catalog.text,
    point   pg_catalog.text,
    state   pg_catalog.jsonb,
    attempt pg_catalog.int4,
    scope   pg_catalog.text DEFAULT '')
RETURNS void
AS 'MODULE_PATHNAME', 'idempotency_checkpoint'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.checkpoint(pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.int4, pg_catalog.text) IS
'Record the recovery point and state of the caller''s lease attempt in this transaction (commits with the phase''s writes); a retry''s begin() returns them; IK004 if taken over or finished';

-- The secret of derive_key(): HMAC-SHA256 key, per database, readable by
-- the extension's owner only.  Separate from lock_secret on purpose: the
-- lock secret may be changed while no keys are in flight, but a changed
-- derive secret would change the downstream keys of requests still to be
-- retried (a second charge), so this one is never changed.  It is dumped
-- (pg_extension_config_dump) so that keys restored in progress derive the
-- same downstream keys; a restore adds the dumped row beside the one
-- CREATE EXTENSION made, and the oldest row is the secret.
CREATE TABLE idempotency.derive_secret (
    secret     pg_catalog.bytea       NOT NULL
        CONSTRAINT derive_secret_length CHECK (pg_catalog.length(secret) OPERATOR(pg_catalog.=) 32),
    created_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE idempotency.derive_secret IS
'Secret key of derive_key() (its oldest row); readable by the extension owner only; never change it';
REVOKE ALL ON idempotency.derive_secret FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('idempotency.derive_secret', '');
INSERT INTO idempotency.derive_secret (secret)
SELECT pg_catalog.sha256(
           pg_catalog.uuid_send(pg_catalog.gen_random_uuid()) OPERATOR(pg_catalog.||)
           pg_catalog.uuid_send(pg_catalog.gen_random_uuid()));

-- STABLE: the result depends on the secret table; PARALLEL RESTRICTED: it
-- reads that table as the extension's owner.
CREATE FUNCTION idempotency.derive_key(
    key   pg_catalog.text,
    step  pg_catalog.text,
    scope pg_catalog.text DEFAULT '')
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idempotency_derive_key'
LANGUAGE C STABLE PARALLEL RESTRICTED;

COMMENT ON FUNCTION idempotency.derive_key(pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
'Idempotency key for step of the caller''s key to send to another system: the same for every attempt, different per step, role and scope, unguessable without the database''s secret (idk_ + 26 base32 characters)';

-- checkpoint() refuses like complete() and renew(), counted with them
COMMENT ON COLUMN idempotency.stats.ik004_not_held IS 'IK004 raised: complete(), fail(), renew() or checkpoint() of a key not held';
COMMENT ON COLUMN idempotency.stats.zombies_refused IS 'complete(), fail(), renew() or checkpoint() of an attempt whose key was taken over (IK004, counted there too)';

-- == outbox (issue 18) ==

-- == Citus (issue 17) ==
