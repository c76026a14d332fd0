-- the roles the regress files share, made when missing (roles belong to the
-- cluster; the database is pg_regress's new one): so one file runs alone
-- against any server, as make installcheck REGRESS=name does
SET client_min_messages = warning;
DO $$
DECLARE
  r text;
BEGIN
  FOREACH r IN ARRAY ARRAY['regress_alice', 'regress_bob', 'regress Mixed "Case" role'] LOOP
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = r) THEN
      EXECUTE format('CREATE ROLE %I NOLOGIN', r);
    END IF;
  END LOOP;
END $$;
GRANT CREATE ON SCHEMA public TO regress_alice, regress_bob, "regress Mixed ""Case"" role";
RESET client_min_messages;
