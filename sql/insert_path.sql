-- insert_path: insert_once()'s probe spells a
-- left-out key column's default as SQL, with names resolved on the current
-- search_path; its plan must not be shared with another search_path (or
-- role), where the same text means another function or none.  The INSERT
-- always uses the table's own default.
CREATE SCHEMA review_shadow;
CREATE FUNCTION public.review_region() RETURNS text
  LANGUAGE sql IMMUTABLE AS $$ SELECT 'eu' $$;
CREATE FUNCTION review_shadow.review_region() RETURNS text
  LANGUAGE sql IMMUTABLE AS $$ SELECT 'us' $$;
CREATE TABLE public.review_codes (
  region text NOT NULL DEFAULT review_region(),
  id int NOT NULL,
  note text,
  PRIMARY KEY (region, id));
SHOW search_path;
SELECT inserted, row FROM idempotency.insert_once('review_codes', '{"id": 1, "note": "first"}');
SELECT inserted, row FROM idempotency.insert_once('review_codes', '{"id": 1, "note": "again"}');
-- a search_path where review_region() is another function
SET search_path = review_shadow, public;
SELECT inserted, row FROM idempotency.insert_once('public.review_codes', '{"id": 1, "note": "shadowed"}');
\echo :LAST_ERROR_SQLSTATE
-- a search_path without the default's schema
SET search_path = review_shadow;
SELECT inserted, row FROM idempotency.insert_once('public.review_codes', '{"id": 1, "note": "elsewhere"}');
\echo :LAST_ERROR_SQLSTATE
RESET search_path;
SELECT inserted, row FROM idempotency.insert_once('review_codes', '{"id": 2, "note": "second"}');
SELECT * FROM public.review_codes ORDER BY id;
DROP TABLE public.review_codes;
DROP FUNCTION public.review_region();
DROP SCHEMA review_shadow CASCADE;
