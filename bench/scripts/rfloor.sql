-- bench/scripts/rfloor.sql: the least any PL/pgSQL replay does, for the
-- floor of the replay targets (bench/portable.sh's scenario p_rfloor,
-- portable/instructions.sh's kind rfloor); not a product.  One SECURITY
-- DEFINER function with a pinned search_path (an application role may read
-- only its own keys), the caller taken from the session user, one indexed
-- SELECT of the key row, the row returned; no check of the key, the
-- request, the state or the expiry.
CREATE FUNCTION rfloor_begin(k text) RETURNS idempotency.begin_result LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE o regrole; r record;
BEGIN
  o := quote_ident(session_user::text)::regrole;
  SELECT t.status, t.response INTO r FROM idempotency.idempotency_key AS t WHERE t.key = k AND t.scope = '' AND t.owner = o;
  RETURN ROW('replay', r.status, r.response, NULL, NULL, NULL, NULL)::idempotency.begin_result;
END $$;
