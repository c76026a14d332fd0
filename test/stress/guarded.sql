-- one request: begin(); do the work only when told to; complete()
\set k random(1, 300)
BEGIN;
SELECT outcome, (outcome <> 'replay')::int AS do_work
  FROM idempotency.begin('stress-' || :k::int, jsonb_build_object('k', :k::int)) \gset
INSERT INTO outcome_log VALUES (:outcome);
\if :do_work
INSERT INTO business (key, client) VALUES ('stress-' || :k::int, :client_id);
SELECT idempotency.complete('stress-' || :k::int, jsonb_build_object('by', :client_id::int));
\endif
END;
