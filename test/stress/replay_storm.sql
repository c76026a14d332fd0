-- a duplicate storm: every client replays the same finished key at once
SELECT (outcome <> 'replay')::int AS odd
  FROM idempotency.begin('stress-1', jsonb_build_object('k', 1)) \gset
\if :odd
INSERT INTO outcome_log VALUES ('storm: not a replay');
\endif
