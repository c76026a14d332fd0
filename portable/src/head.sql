-- portable/src/head.sql: what runs before the shared statements of the
-- install script: the schema, and the check that it is ours.

-- @head
-- The schema.  A plain install (psql -f, no extension) creates it and
-- records the version in its comment; CREATE EXTENSION through pg_tle
-- (pgtle.install_extension(..., schema => 'idempotency')) has created it
-- already, and pg_extension records the version.
DO $head$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension AS e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency') THEN
        -- a fresh install only: a schema of that name already there is an
        -- error (42P06), whoever made it
        CREATE SCHEMA idempotency;
        COMMENT ON SCHEMA idempotency IS 'idempotency @VERSION@ (portable edition)';
    END IF;
END
$head$;

-- Schema idempotency must be ours: the role installing (the database owner
-- on a managed service) owns it, and no other role may create objects in
-- it or owns objects there.  A role that could would drop the tables or
-- put its own functions beside ours.  (The C edition asks for a superuser;
-- here no superuser may exist.)
DO $head$
DECLARE
    bad pg_catalog.text;
BEGIN
    SELECT pg_catalog.format('it belongs to role %I', r.rolname) INTO bad
      FROM pg_catalog.pg_namespace AS n
      JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) n.nspowner
     WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency'
       AND r.rolname OPERATOR(pg_catalog.<>) CURRENT_USER AND NOT r.rolsuper;
    IF bad IS NULL THEN
        SELECT pg_catalog.format('role %s may create objects in it',
                                 CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                      ELSE pg_catalog.quote_ident(r.rolname) END) INTO bad
          FROM pg_catalog.pg_namespace AS n,
               pg_catalog.aclexplode(n.nspacl) AS a
          LEFT JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency'
           AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
           AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner
           AND NOT coalesce(r.rolsuper, false)
         LIMIT 1;
    END IF;
    IF bad IS NULL THEN
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
                  FROM pg_catalog.pg_operator AS op) AS o
          JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) o.owner
         WHERE o.nsp OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
           AND r.rolname OPERATOR(pg_catalog.<>) CURRENT_USER AND NOT r.rolsuper
         LIMIT 1;
    END IF;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'schema idempotency is not safe for the extension: %', bad
            USING ERRCODE = 'duplicate_schema',
                  DETAIL = 'The schema and everything in it must belong to the role that installs the portable edition, and no other role may create objects in it.',
                  HINT = 'Drop the schema, or give it and its objects to the installing role and revoke CREATE on it from other roles, and run the install again.';
    END IF;
END
$head$;
-- @end
