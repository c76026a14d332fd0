-- portable/src/http.sql: http_response(), the convention for replaying an
-- HTTP response byte for byte: {"status": s, "headers": {...}, "body":
-- "exact text"}.  The body is stored as a JSON string, exactly as given; a
-- binary body that is not valid text in the database encoding (or holds a
-- NUL byte) goes to "body_base64" instead.  IMMUTABLE, no table touched.

-- @body idempotency_http_response
LANGUAGE plpgsql
AS $fn$
BEGIN
    RETURN idempotency._http_response($1, pg_catalog.to_jsonb($2), NULL, $3);
END
$fn$
-- @end

-- @body idempotency_http_response_bytea
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_text pg_catalog.text;
BEGIN
    IF $2 IS NOT NULL THEN
        -- valid text in the database encoding and no NUL byte: "body"
        -- (convert_from() to the database's own encoding only verifies,
        -- and refuses a NUL byte as an invalid sequence)
        BEGIN
            v_text := pg_catalog.convert_from($2, pg_catalog.getdatabaseencoding());
        EXCEPTION WHEN character_not_in_repertoire THEN
            v_text := NULL;
        END;
        IF v_text IS NULL OR pg_catalog.position($2, '\x00'::pg_catalog.bytea) OPERATOR(pg_catalog.>) 0 THEN
            RETURN idempotency._http_response($1, NULL,
                                              pg_catalog.to_jsonb(pg_catalog.translate(pg_catalog.encode($2, 'base64'), E'\n', '')),
                                              $3);
        END IF;
    END IF;
    RETURN idempotency._http_response($1, pg_catalog.to_jsonb(v_text), NULL, $3);
END
$fn$
-- @end

-- @tail
-- http_response()'s checks and object: status 100-599 (22004 when null,
-- 22023 out of range), headers a JSON object of strings (22023), the body
-- as "body" or "body_base64" (either JSON string; none for a NULL body)
CREATE FUNCTION idempotency._http_response(status pg_catalog.int4, body pg_catalog.jsonb,
                                           body_base64 pg_catalog.jsonb, headers pg_catalog.jsonb)
RETURNS pg_catalog.jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $fn$
DECLARE
    e record;
    r pg_catalog.jsonb;
BEGIN
    IF status IS NULL THEN
        RAISE EXCEPTION 'HTTP status must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF status OPERATOR(pg_catalog.<) 100 OR status OPERATOR(pg_catalog.>) 599 THEN
        RAISE EXCEPTION 'HTTP status % is out of range', status USING ERRCODE = 'invalid_parameter_value',
            DETAIL = 'An HTTP status is between 100 and 599.';
    END IF;
    IF headers IS NOT NULL THEN
        IF pg_catalog.jsonb_typeof(headers) OPERATOR(pg_catalog.<>) 'object' THEN
            RAISE EXCEPTION 'HTTP headers must be a JSON object' USING ERRCODE = 'invalid_parameter_value',
                DETAIL = 'Give them as {"Header-Name": "value", ...}.';
        END IF;
        FOR e IN SELECT pg_catalog.jsonb_typeof(h.value) AS t FROM pg_catalog.jsonb_each(headers) AS h LOOP
            IF e.t OPERATOR(pg_catalog.<>) 'string' THEN
                RAISE EXCEPTION 'HTTP header values must be JSON strings' USING ERRCODE = 'invalid_parameter_value',
                    DETAIL = pg_catalog.format('A value of type %s was given.',
                                               CASE WHEN e.t OPERATOR(pg_catalog.=) ANY ('{number,boolean,null}'::pg_catalog.text[])
                                                    THEN e.t ELSE 'object or array' END);
            END IF;
        END LOOP;
    END IF;
    r := pg_catalog.jsonb_build_object('status', status, 'headers', coalesce(headers, '{}'::pg_catalog.jsonb));
    IF body IS NOT NULL THEN
        r := r OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object('body', body);
    ELSIF body_base64 IS NOT NULL THEN
        r := r OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object('body_base64', body_base64);
    END IF;
    RETURN r;
END
$fn$;
COMMENT ON FUNCTION idempotency._http_response(pg_catalog.int4, pg_catalog.jsonb, pg_catalog.jsonb, pg_catalog.jsonb) IS
'Portable edition, internal: the checks and object of http_response() (callable by every role, as http_response() is; it reads and writes nothing)';
-- @end
