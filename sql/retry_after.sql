-- retry_after: IK002's "retry after N
-- seconds" for a lease longer than 2^31 seconds (68 years) says the
-- largest int, as lookup()'s retry_after does, never a negative number.
CREATE FUNCTION retry_after(k text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  d text;
  st text;
BEGIN
  PERFORM idempotency.begin(k);
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL, st = RETURNED_SQLSTATE;
  RETURN st || ': retry after ' || substring(d from 'retry after (-?[0-9]+) seconds');
END $$;
SELECT outcome FROM idempotency.begin('review-century', ttl => '200 years', lease => '100 years');
SELECT retry_after('review-century');
SELECT retry_after FROM idempotency.lookup('review-century');
-- an ordinary lease is unchanged: an hour is at most 3600 seconds
SELECT outcome FROM idempotency.begin('review-hour', lease => '1 hour');
SELECT retry_after('review-hour') ~ '^IK002: retry after 3[56][0-9][0-9]$' AS about_an_hour;
DROP FUNCTION retry_after(text);
DELETE FROM idempotency.idempotency_key WHERE key IN ('review-century', 'review-hour');
