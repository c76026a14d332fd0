-- setup: the extension is installed (pg_regress --load-extension) with all
-- its objects in schema idempotency; roles used by later files.
SELECT extname, extversion, extnamespace::regnamespace AS schema, extrelocatable
  FROM pg_extension WHERE extname = 'idempotency';

SELECT p.proname, p.prosecdef, p.provolatile, p.proparallel, p.proisstrict
  FROM pg_proc p
 WHERE p.pronamespace = 'idempotency'::regnamespace
 ORDER BY p.proname;

-- the settings exist once the library is loaded (first call, or LOAD)
LOAD 'idempotency';
SELECT name, boot_val AS default, unit FROM pg_settings
 WHERE name LIKE 'idempotency.%' ORDER BY name;

-- a misspelled setting in our prefix is refused, not silently kept
SET idempotency.lock_wiat = 10;

-- the roles later files use (each of them includes this too, to run alone)
\i sql/include/roles.sql
