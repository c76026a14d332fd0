-- test/privileges/harness.sql: read expect.tsv (from standard input), turn
-- it into one probe per (object, action), and judge what needs no caller:
-- every member of the extension has a decision for every caller, and no
-- role but the owner may write the extension's relations.  Run by the
-- cluster's superuser in database privileges after setup.sql; verdicts go
-- to matrix.verdict, which report.sql prints as TAP.
\set ON_ERROR_STOP 1
SET search_path = pg_catalog;

CREATE TABLE matrix.line (n serial PRIMARY KEY, line text);
-- raw lines: CSV with a delimiter and a quote no line holds, so that no
-- character of a probe is taken for an escape
\copy matrix.line (line) FROM pstdin WITH (FORMAT csv, DELIMITER E'\x01', QUOTE E'\x02')
-- on Citus, run appends citus.tsv after a line "#@ citus.tsv"; for the
-- portable edition portable-differs.tsv after "#@ portable-differs.tsv"
-- and what the edition leaves out after "#@ absent": each section's lines
-- are set apart (see below)
CREATE TABLE matrix.cline (n int PRIMARY KEY, section text, line text);
WITH mark AS (SELECT n, substr(line, 4) AS section FROM matrix.line WHERE line LIKE '#@ %'),
moved AS (DELETE FROM matrix.line AS l WHERE l.n >= (SELECT min(n) FROM mark) RETURNING l.n, l.line)
INSERT INTO matrix.cline
SELECT m.n, (SELECT k.section FROM mark AS k WHERE k.n <= m.n ORDER BY k.n DESC LIMIT 1), m.line
  FROM moved AS m
 WHERE m.line NOT LIKE '#@ %';
-- what the portable edition's script leaves out (run, from the script's
-- head): name (schema.name) and why; empty otherwise
CREATE TABLE matrix.absent AS
SELECT split_part(l.line, E'\t', 1) AS name, min(split_part(l.line, E'\t', 2)) AS why
  FROM matrix.cline AS l
 WHERE l.section = 'absent' AND coalesce(l.line, '') <> ''
 GROUP BY 1;

CREATE TABLE matrix.verdict (n serial PRIMARY KEY, ok boolean NOT NULL, description text NOT NULL);

-- the table's lines, split; the header is the first line that is neither
-- empty nor a comment
CREATE VIEW matrix.field AS
SELECT l.n, f.i, f.v
  FROM matrix.line AS l,
       LATERAL unnest(string_to_array(l.line, E'\t')) WITH ORDINALITY AS f(v, i)
 WHERE coalesce(l.line, '') !~ '^\s*(#|$)';
CREATE VIEW matrix.header AS
SELECT f.i, f.v FROM matrix.field AS f WHERE f.n = (SELECT min(n) FROM matrix.field);

-- the callers: the header's columns between action and probe
CREATE TABLE matrix.caller AS
SELECT h.i, h.v AS name FROM matrix.header AS h
 WHERE h.i > 2 AND h.i < (SELECT max(i) FROM matrix.header);
GRANT SELECT ON matrix.caller TO PUBLIC;

INSERT INTO matrix.verdict (ok, description)
SELECT coalesce(array_agg(h.v ORDER BY h.i) FILTER (WHERE h.i <= 2) = '{object,action}', false)
       AND coalesce(bool_or(h.v = 'probe' AND h.i = (SELECT max(i) FROM matrix.header)), false)
       AND count(*) > 3,
       'expect.tsv: its header is object, action, the callers, probe'
  FROM matrix.header AS h;
INSERT INTO matrix.verdict (ok, description)
SELECT r.oid IS NOT NULL, format('caller %s: role %s exists', c.name, coalesce(l.role, 'priv_' || c.name))
  FROM matrix.caller AS c
  LEFT JOIN matrix.login AS l ON l.caller = c.name
  LEFT JOIN pg_roles AS r ON r.rolname = coalesce(l.role, 'priv_' || c.name)
 ORDER BY c.i;

-- the rows: (line, object, action, probe) and one outcome per caller
CREATE TABLE matrix.row AS
SELECT f.n,
       max(f.v) FILTER (WHERE f.i = 1) AS object,
       max(f.v) FILTER (WHERE f.i = 2) AS action,
       nullif(max(f.v) FILTER (WHERE f.i = (SELECT max(i) FROM matrix.header)), '') AS probe,
       count(*) AS fields
  FROM matrix.field AS f
 WHERE f.n > (SELECT min(n) FROM matrix.field)
 GROUP BY f.n;
CREATE TABLE matrix.expect AS
SELECT r.n, r.object, r.action, c.name AS caller, c.i, nullif(btrim(f.v), '') AS outcome
  FROM matrix.row AS r
 CROSS JOIN matrix.caller AS c
  LEFT JOIN matrix.field AS f ON f.n = r.n AND f.i = c.i;

-- why an outcome differs from expect.tsv's (on Citus: citus.tsv), shown in
-- its TAP line
ALTER TABLE matrix.expect ADD COLUMN note text;
CREATE TABLE matrix.writers (object text PRIMARY KEY, writers text NOT NULL);

\if :{?citus}
\set variant citus.tsv
\set variant_note 'Citus: '
\endif
\if :{?portable}
\set variant portable-differs.tsv
\set variant_note 'portable edition: '
\endif
\if :{?variant}
-- On a Citus coordinator (run -v citus=1): citus.tsv's outcomes replace
-- expect.tsv's for the callers it names, each with its reason; a line that
-- replaces none fails (its difference has gone).  The portable edition
-- (run -v portable=1): portable-differs.tsv's, the same way.
CREATE TABLE matrix.citus AS
SELECT l.n - (SELECT min(n) FROM matrix.cline) AS n, f[1] AS object, f[2] AS action, string_to_array(f[3], ' ') AS callers, f[4] AS outcome, f[5] AS why
  FROM matrix.cline AS l, LATERAL string_to_array(l.line, E'\t') AS f
 WHERE l.section = :'variant' AND coalesce(l.line, '') !~ '^\s*(#|$)' AND f[1] <> 'object'
   -- a sixth column names an object the line holds for while the
   -- portable edition leaves it out (rows that its absence leaves unmade)
   AND (coalesce(f[6], '') = '' OR f[6] IN (SELECT a.name FROM matrix.absent AS a));
-- (outside Citus, its lines are not read at all)
INSERT INTO matrix.writers SELECT c.object, c.outcome FROM matrix.citus AS c WHERE c.action = 'writers';
INSERT INTO matrix.verdict (ok, description)
SELECT count(e.*) > 0 OR c.action = 'writers',
       format('%s line %s: %s %s (%s) replaces %s outcomes of expect.tsv', :'variant', c.n, c.object, c.action,
              array_to_string(c.callers, ' '), count(e.*))
  FROM matrix.citus AS c
  LEFT JOIN matrix.expect AS e ON e.object = c.object AND e.action = c.action AND e.caller = ANY (c.callers)
 GROUP BY c.n, c.object, c.action, c.callers, c.outcome
 ORDER BY c.n;
UPDATE matrix.expect AS e
   SET outcome = c.outcome, note = :'variant_note' || c.why
  FROM matrix.citus AS c
 WHERE e.object = c.object AND e.action = c.action AND e.caller = ANY (c.callers);
\endif

-- a line has every column (an editor may drop an empty probe's tab)
INSERT INTO matrix.verdict (ok, description)
SELECT false, format('expect.tsv line %s: %s columns, the header has %s', r.n, r.fields, h.k)
  FROM matrix.row AS r, (SELECT count(*) AS k FROM matrix.header) AS h
 WHERE r.fields NOT IN (h.k, h.k - 1)
 ORDER BY r.n;
INSERT INTO matrix.verdict (ok, description)
SELECT false, format('expect.tsv line %s: %s %s is on line %s too', r.n, r.object, r.action, min(o.n))
  FROM matrix.row AS r
  JOIN matrix.row AS o ON o.object = r.object AND o.action = r.action AND o.n < r.n
 GROUP BY r.n, r.object, r.action
 ORDER BY r.n;

-- The probes each caller runs.  A line's probe column, or (for tables,
-- views, sequences and types) the probe of its kind and action; a function
-- has no probe of its kind: each of its lines says how to call it.
CREATE TABLE matrix.probe AS
SELECT r.n, r.object, r.action,
       coalesce(r.probe,
                CASE m.kind || ' ' || r.action
                WHEN 'table select' THEN format('SELECT count(*) FROM %s', m.objid::regclass)
                WHEN 'view select' THEN format('SELECT count(*) FROM %s', m.objid::regclass)
                WHEN 'sequence select' THEN format('SELECT count(*) FROM %s', m.objid::regclass)
                -- INSERT privilege alone: no row, no SELECT needed
                WHEN 'table insert' THEN format('INSERT INTO %s SELECT (NULL::%s).* WHERE false',
                                                m.objid::regclass, m.objid::regclass)
                -- the rows the caller may update or delete (row security)
                WHEN 'table update' THEN format('UPDATE %s SET %I = %I', m.objid::regclass, a.attname, a.attname)
                WHEN 'table delete' THEN format('DELETE FROM %s', m.objid::regclass)
                WHEN 'table truncate' THEN format('TRUNCATE %s', m.objid::regclass)
                -- locks that would hold up the functions' writes and the purge
                WHEN 'table lock' THEN format('LOCK TABLE %s IN SHARE MODE', m.objid::regclass)
                WHEN 'table rowlock' THEN format('SELECT count(*) FROM (SELECT FROM %s FOR KEY SHARE) AS s',
                                                 m.objid::regclass)
                WHEN 'sequence nextval' THEN format('SELECT pg_catalog.nextval(%L::pg_catalog.regclass) > 0',
                                                    m.objid::regclass)
                -- USAGE on a type: a column of it
                WHEN 'type use' THEN format('CREATE TEMP TABLE matrix_probe (c %s)', m.objid::regtype)
                WHEN 'composite type use' THEN format('CREATE TEMP TABLE matrix_probe (c %s)', m.objid::regtype)
                WHEN 'domain use' THEN format('CREATE TEMP TABLE matrix_probe (c %s)', m.objid::regtype)
                END) AS sql
  FROM matrix.row AS r
  LEFT JOIN matrix.members() AS m ON m.object = r.object
  LEFT JOIN pg_attribute AS a ON a.attrelid = m.objid AND m.classid = 'pg_class'::regclass
                             AND a.attnum = 1;
GRANT SELECT ON matrix.probe TO PUBLIC;

INSERT INTO matrix.verdict (ok, description)
SELECT false, format('expect.tsv line %s: %s %s: no probe (a function''s line needs one)', p.n, p.object, p.action)
  FROM matrix.probe AS p
 WHERE p.sql IS NULL AND p.object IN (SELECT object FROM matrix.members())
 ORDER BY p.n;

-- Every member of the extension, found in pg_depend (not listed by hand),
-- has its lines, each with a decision for every caller: one verdict each.
-- Casts and operators have no privileges of their own (their functions'
-- EXECUTE is probed); any other kind without probes here fails.
WITH need (kind, action) AS (
    VALUES ('table', 'select'), ('table', 'insert'), ('table', 'update'), ('table', 'delete'),
           ('table', 'truncate'), ('table', 'lock'), ('table', 'rowlock'),
           ('view', 'select'),
           ('sequence', 'select'), ('sequence', 'nextval'),
           ('type', 'use'), ('composite type', 'use'), ('domain', 'use'),
           ('function', NULL)),
missing AS (
    SELECT m.object, m.kind,
           (SELECT string_agg(format('no line for %s', nd.action), '; ' ORDER BY nd.action)
              FROM need AS nd
             WHERE nd.kind = m.kind AND nd.action IS NOT NULL
               AND NOT EXISTS (SELECT FROM matrix.row AS r
                                WHERE r.object = m.object AND r.action = nd.action)) AS lines,
           (SELECT string_agg(format('%s: no decision for %s', e.action, e.caller), '; ' ORDER BY e.n, e.i)
              FROM matrix.expect AS e
             WHERE e.object = m.object AND e.outcome IS NULL) AS undecided,
           EXISTS (SELECT FROM matrix.row AS r WHERE r.object = m.object) AS any_line,
           EXISTS (SELECT FROM need AS nd WHERE nd.kind = m.kind) AS known_kind
      FROM matrix.members() AS m
     WHERE m.kind NOT IN ('cast', 'operator', 'operator class', 'operator family'))
INSERT INTO matrix.verdict (ok, description)
SELECT x.any_line AND x.known_kind AND x.lines IS NULL AND x.undecided IS NULL,
       format('%s: decided for every caller%s', x.object,
              CASE WHEN NOT x.known_kind THEN format(' (a %s: the harness has no probes for its kind)', x.kind)
                   WHEN NOT x.any_line THEN ' (no line in expect.tsv)'
                   WHEN x.lines IS NOT NULL OR x.undecided IS NOT NULL
                   THEN ' (' || concat_ws('; ', x.lines, x.undecided) || ')'
                   ELSE '' END)
  FROM missing AS x
 ORDER BY x.kind, x.object;

-- a line for something the extension does not have: a failure, unless
-- the portable edition's script says it leaves it out (matrix.absent,
-- by its name: "function idempotency.stats()" is idempotency.stats)
INSERT INTO matrix.verdict (ok, description)
SELECT a.name IS NOT NULL,
       CASE WHEN a.name IS NOT NULL THEN format('%s: not in the portable edition (%s)', r.object, a.why)
            ELSE format('expect.tsv line %s: the extension has no %s', min(r.n), r.object) END
  FROM matrix.row AS r
  LEFT JOIN matrix.absent AS a ON a.name = substring(r.object FROM '^[a-z ]+ ([^ (]+)')
 WHERE r.object NOT IN (SELECT object FROM matrix.members())
 GROUP BY r.object, a.name, a.why
 ORDER BY min(r.n);

-- No direct writes: no role but a relation's
-- owner holds a privilege to write it: not PUBLIC, not an application
-- role, not priv_granted.  (A write privilege a table's row security would
-- still refuse counts too: it is one policy away from a write.)
-- (On Citus, citus.tsv names the writers a table has there instead.)
INSERT INTO matrix.verdict (ok, description)
SELECT w.writers IS NOT DISTINCT FROM x.writers,
       CASE WHEN x.writers IS NOT NULL
            THEN format('%s: on Citus, no role but its owner may write it except as citus.tsv says (%s; got %s)',
                        m.object, x.writers, coalesce(w.writers, 'none'))
            ELSE format('%s: no role but its owner may write it%s', m.object,
                        CASE WHEN w.writers IS NOT NULL THEN ' (' || w.writers || ')' ELSE '' END) END
  FROM matrix.members() AS m
  JOIN pg_class AS c ON c.oid = m.objid AND m.classid = 'pg_class'::regclass
  LEFT JOIN matrix.writers AS x ON x.object = m.object
  LEFT JOIN LATERAL (
       -- the table's grants and its columns' (a column grant of UPDATE is
       -- a write too: "UPDATE (k) to PUBLIC")
       SELECT string_agg(format('%s%s to %s', a.privilege_type,
                                CASE WHEN a.col IS NOT NULL THEN format(' (%s)', a.col) ELSE '' END,
                                CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END),
                         ', ' ORDER BY a.privilege_type, a.col NULLS FIRST, a.grantee) AS writers
         FROM (SELECT t.privilege_type, t.grantee, NULL::name AS col FROM aclexplode(c.relacl) AS t
               UNION ALL
               SELECT t.privilege_type, t.grantee, att.attname
                 FROM pg_attribute AS att, aclexplode(att.attacl) AS t
                WHERE att.attrelid = c.oid AND att.attnum > 0 AND NOT att.attisdropped) AS a
        WHERE a.grantee <> c.relowner
          AND a.privilege_type IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'TRIGGER',
                                   'REFERENCES', 'MAINTAIN', 'USAGE')) AS w ON true
 ORDER BY m.object;

-- nobody but the owner may create objects in schema idempotency (an
-- overload of one of its functions would catch calls meant for it)
INSERT INTO matrix.verdict (ok, description)
SELECT NOT EXISTS (SELECT FROM aclexplode(n.nspacl) AS a
                    WHERE a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner),
       'schema idempotency: no role but its owner may create objects in it'
  FROM pg_namespace AS n
 WHERE n.nspname = 'idempotency';

-- SECURITY DEFINER only with search_path pinned (SPEC section 5)
INSERT INTO matrix.verdict (ok, description)
SELECT NOT p.prosecdef OR coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false),
       format('%s: SECURITY INVOKER, or DEFINER with search_path = pg_catalog, pg_temp', m.object)
  FROM matrix.members() AS m
  JOIN pg_proc AS p ON p.oid = m.objid AND m.classid = 'pg_proc'::regclass
 ORDER BY m.object;
