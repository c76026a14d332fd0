-- test/privileges/report.sql: every verdict as a TAP line: first what
-- harness.sql judged, then each (object, action, caller) of expect.tsv
-- against what the caller got.  Run by the cluster's superuser, with
-- psql -v offset=N (lines are numbered from N + 1) -v pass=TEXT (put
-- before each description); run prints the plan.
\set ON_ERROR_STOP 1
SET search_path = pg_catalog;
INSERT INTO matrix.verdict (ok, description)
SELECT r.outcome IS NOT DISTINCT FROM e.outcome,
       format('%s: %s %s %s%s', e.caller, e.object, e.action,
              CASE WHEN r.outcome IS NULL THEN format('expected %s, got no result', e.outcome)
                   WHEN r.outcome = e.outcome THEN '= ' || e.outcome
                   ELSE format('expected %s, got %s', e.outcome, r.outcome) END,
              coalesce(' (' || e.note || ')', ''))
  FROM matrix.expect AS e
  JOIN matrix.probe AS p ON p.n = e.n AND p.sql IS NOT NULL
  LEFT JOIN matrix.result AS r ON (r.caller, r.object, r.action) = (e.caller, e.object, e.action)
 WHERE e.outcome IS NOT NULL
   AND e.object IN (SELECT object FROM matrix.members())
 ORDER BY e.n, e.i;
SELECT format('%sok %s - %s%s', CASE WHEN v.ok THEN '' ELSE 'not ' END,
              (:'offset')::bigint + row_number() OVER (ORDER BY v.n), :'pass', v.description)
  FROM matrix.verdict AS v
 ORDER BY v.n;
