/* idempotency--0.4.0--0.5.0.sql: update from 0.4.0 to 0.5.0 */

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.5.0'" to load this file. \quit

-- Each feature keeps its own section below, in the order of the 0.5.0
-- install script's additions.

-- == review fixes (issue 21) ==

-- Schema idempotency must be ours.  CREATE EXTENSION uses an existing schema
-- named in the control file as it finds it, so a role with CREATE on the
-- database could have created it first: as its owner that role could drop
-- the extension's objects and put its own beside them.  Refuse a schema
-- owned by a role that is not a superuser, or on which such a role (or
-- PUBLIC) may create objects; a schema a superuser created (a pg_dump
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
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'schema idempotency is not safe for the extension: %', bad
            USING ERRCODE = 'duplicate_schema',
                  DETAIL = 'The extension''s schema must belong to a superuser and no other role may create objects in it: its owner could drop the extension''s tables and put its own objects beside them.',
                  HINT = 'Check what the schema holds, then drop it or give it to a superuser (ALTER SCHEMA idempotency OWNER TO ...) and revoke CREATE on it, and run the command again.';
    END IF;
END
$$;

-- == recovery points (issue 19) ==

-- == outbox (issue 18) ==

-- == Citus (issue 17) ==
