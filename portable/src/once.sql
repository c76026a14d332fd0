-- portable/src/once.sql: once(key, request, sql, VARIADIC args text[]), the
-- guarded request in one statement, in PL/pgSQL.
--
-- Only the text form: PL/pgSQL cannot declare VARIADIC "any", so the
-- calling form both editions accept is this one, every argument sent as
-- text ($4::text, $5::text, ...).  As in the C edition a string argument
-- takes the type the statement gives it: the statement is PREPAREd (the
-- server decides its parameter types; a statement PREPARE does not take,
-- or more than one, is refused before anything else happens) and run by
-- EXECUTE with each argument as a quoted literal, which the prepared
-- statement's parameter type reads.  The prepared statement is kept per
-- session under a name derived from the role, the search_path and the
-- statement text (the plan is kept,
-- as the C edition keeps its plans; the server re-plans it when the
-- search_path or a table changes), and used only while its text is this
-- statement's.
--
-- SECURITY INVOKER, no SET: the work runs as the caller, with its
-- privileges, row security and search_path; every name here is qualified.
-- The key is taken and stored by begin() and complete(), which write as
-- the installing role.

-- @body idempotency_once_text
LANGUAGE plpgsql
AS $fn$
DECLARE
    p_key  ALIAS FOR $1;
    p_req  ALIAS FOR $2;
    p_sql  ALIAS FOR $3;
    p_args ALIAS FOR $4;
    v_name pg_catalog.text;
    v_nname pg_catalog.text;
    v_hash pg_catalog.text;
    v_kept pg_catalog.text;
    v_arg pg_catalog.text;
    v_vals pg_catalog.jsonb;
    v_nparams pg_catalog.int4;
    v_single_json pg_catalog.bool;
    v_lits pg_catalog.text;
    b idempotency.begin_result;
    rec record;
    v_one pg_catalog.jsonb;
    v_val pg_catalog.jsonb;
    v_cur pg_catalog.refcursor;
    v_one_msg pg_catalog.text;
    v_msg pg_catalog.text;
    v_state pg_catalog.text;
    v_rows pg_catalog.jsonb[] := '{}';
BEGIN
    -- (each PL/pgSQL statement costs its expression's set-up once per
    -- transaction: the path of a replay has as few as it can)
    IF p_sql IS NULL OR pg_catalog.array_ndims(p_args) OPERATOR(pg_catalog.>) 1 THEN
        IF p_sql IS NULL THEN
            RAISE EXCEPTION 'the statement of once() must not be null' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        RAISE EXCEPTION 'the arguments of once() must be a one-dimensional array' USING ERRCODE = 'array_subscript_error';
    END IF;
    -- the statement, prepared once per session: as the query of a
    -- SELECT over a WITH (so that a cursor can read the rows of an
    -- INSERT/UPDATE/DELETE ... RETURNING too), else as it is (a statement
    -- without RETURNING: no rows).  A statement kept under one of its
    -- names is used only if it is this text's: the name is a hash, and
    -- prepared statements outlive a transaction, so under a pooler in
    -- transaction mode the server session may come with statements another
    -- client prepared under these names.  The name hashes the role and
    -- the search_path with the text: the server analysed the statement
    -- (names, schemas' USAGE) for them, so another role or search_path
    -- prepares its own, as the C edition keys its plans by both.
    v_hash := pg_catalog.md5(pg_catalog.concat_ws(E'\n', CURRENT_USER::pg_catalog.text,
                                                  pg_catalog.current_setting('search_path'), p_sql));
    v_name := 'idempotency_once_r_' OPERATOR(pg_catalog.||) v_hash;
    v_nname := 'idempotency_once_n_' OPERATOR(pg_catalog.||) v_hash;
    SELECT s.name, coalesce(pg_catalog.cardinality(s.parameter_types), 0) INTO v_kept, v_nparams
      FROM pg_catalog.pg_prepared_statements AS s
     WHERE (s.name OPERATOR(pg_catalog.=) v_name
            AND s.statement OPERATOR(pg_catalog.=) pg_catalog.format(E'PREPARE %I AS WITH w AS (%s\n) SELECT * FROM w', v_name, p_sql))
        OR (s.name OPERATOR(pg_catalog.=) v_nname
            AND s.statement OPERATOR(pg_catalog.=) pg_catalog.format('PREPARE %I AS %s', v_nname, p_sql));
    IF v_kept IS NOT NULL THEN
        v_name := v_kept;
    ELSE
        -- another text under these names (another client's, or a
        -- statement prepared by hand): not ours to run
        IF EXISTS (SELECT FROM pg_catalog.pg_prepared_statements AS s
                    WHERE s.name OPERATOR(pg_catalog.=) v_name) THEN
            EXECUTE pg_catalog.format('DEALLOCATE %I', v_name);
        END IF;
        IF EXISTS (SELECT FROM pg_catalog.pg_prepared_statements AS s
                    WHERE s.name OPERATOR(pg_catalog.=) v_nname) THEN
            EXECUTE pg_catalog.format('DEALLOCATE %I', v_nname);
        END IF;
        -- Exactly one statement (42601, as the C edition), checked
        -- before anything runs: PL/pgSQL's EXECUTE runs every
        -- statement of a text.  Opening a cursor on a PREPARE parses
        -- the text and fails without running it, saying why; its
        -- message for a text of one statement is learnt from a probe,
        -- so the server's language does not matter.
        BEGIN
            OPEN v_cur FOR EXECUTE 'PREPARE idempotency_once_probe AS SELECT 1';
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_one_msg = MESSAGE_TEXT;
        END;
        BEGIN
            OPEN v_cur FOR EXECUTE pg_catalog.format('PREPARE idempotency_once_probe AS %s', p_sql);
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_msg = MESSAGE_TEXT, v_state = RETURNED_SQLSTATE;
        END;
        IF (v_msg OPERATOR(pg_catalog.=) v_one_msg) IS NOT TRUE THEN
            IF v_state OPERATOR(pg_catalog.=) '42P11' THEN
                RAISE EXCEPTION 'idempotency.once() runs exactly one SQL statement' USING ERRCODE = 'syntax_error',
                    HINT = 'Put several writes into one statement with a WITH clause, or call a function.';
            END IF;
            RAISE EXCEPTION USING MESSAGE = v_msg, ERRCODE = v_state;
        END IF;
        BEGIN
            EXECUTE pg_catalog.format(E'PREPARE %I AS WITH w AS (%s\n) SELECT * FROM w', v_name, p_sql);
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE;
            IF v_state OPERATOR(pg_catalog.=) '0A000' THEN
                -- INSERT, UPDATE, DELETE without RETURNING; MERGE
                v_name := v_nname;
                EXECUTE pg_catalog.format('PREPARE %I AS %s', v_name, p_sql);
            ELSIF v_state OPERATOR(pg_catalog.=) '42601' THEN
                -- one statement PREPARE takes, but no query (SELECT INTO)
                RAISE EXCEPTION 'idempotency.once() cannot run this statement' USING ERRCODE = 'feature_not_supported',
                    DETAIL = 'The work must be one SELECT, INSERT, UPDATE, DELETE or MERGE statement.';
            ELSE
                RAISE;
            END IF;
        END;
        SELECT coalesce(pg_catalog.cardinality(s.parameter_types), 0) INTO v_nparams
          FROM pg_catalog.pg_prepared_statements AS s
         WHERE s.name OPERATOR(pg_catalog.=) v_name;
    END IF;
    IF coalesce(pg_catalog.cardinality(p_args), 0) OPERATOR(pg_catalog.<>) v_nparams THEN
        RAISE EXCEPTION 'the statement of once() takes % arguments, % given', v_nparams, coalesce(pg_catalog.cardinality(p_args), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    b := idempotency.begin(p_key, p_req);
    IF b.outcome OPERATOR(pg_catalog.=) 'replay' THEN
        RETURN ROW('replay', b.response)::idempotency.once_result;
    END IF;

    -- is the result one json or jsonb column?  PostgreSQL 16 says
    -- (pg_prepared_statements.result_types); 15 does not, and the rows
    -- tell below
    IF pg_catalog.current_setting('server_version_num')::pg_catalog.int4 OPERATOR(pg_catalog.>=) 160000 THEN
        EXECUTE 'SELECT pg_catalog.cardinality(s.result_types) OPERATOR(pg_catalog.=) 1
                        AND s.result_types[1] OPERATOR(pg_catalog.=) ANY (''{json,jsonb}''::pg_catalog.regtype[])
                   FROM pg_catalog.pg_prepared_statements AS s WHERE s.name OPERATOR(pg_catalog.=) $1'
           INTO v_single_json USING v_name;
    END IF;

    -- the work, as the caller; its rows become the response: a single
    -- json or jsonb column as it is, else each row as an object; one row
    -- its value, several an array, none null
    -- (each argument a quoted literal, in the array's order; simple
    -- expressions, no query)
    v_lits := '';
    IF v_nparams OPERATOR(pg_catalog.>) 0 THEN
        FOREACH v_arg IN ARRAY p_args LOOP
            v_lits := v_lits OPERATOR(pg_catalog.||) CASE WHEN v_lits OPERATOR(pg_catalog.=) '' THEN '(' ELSE ', ' END
                      OPERATOR(pg_catalog.||) pg_catalog.quote_nullable(v_arg);
        END LOOP;
        v_lits := v_lits OPERATOR(pg_catalog.||) ')';
    END IF;
    IF pg_catalog.left(v_name, 19) OPERATOR(pg_catalog.=) 'idempotency_once_n_' THEN
        EXECUTE pg_catalog.format('EXECUTE %I%s', v_name, v_lits);
    ELSE
    FOR rec IN EXECUTE pg_catalog.format('EXECUTE %I%s', v_name, v_lits) LOOP
        v_one := pg_catalog.to_jsonb(rec);
        -- the row's values ('$.*': in the order jsonb_each gives them), a
        -- simple expression where a query over jsonb_each() would be one
        -- more plan to run per row
        IF v_single_json IS NULL THEN
            v_vals := pg_catalog.jsonb_path_query_array(v_one, '$.*'::pg_catalog.jsonpath);
        END IF;
        IF v_single_json THEN
            -- the column as it is: SQL NULL stays NULL, as in the C edition
            IF rec IS NULL THEN
                v_one := NULL;
            ELSE
                SELECT e.value INTO v_one FROM pg_catalog.jsonb_each(v_one) AS e;
            END IF;
        ELSIF v_single_json IS NULL
              AND pg_catalog.jsonb_array_length(v_vals) OPERATOR(pg_catalog.=) 1 THEN
            -- PostgreSQL 15: a single column is json or jsonb when its
            -- text is that of its JSON value (an object, array or string;
            -- a bare number, boolean or null in a json column is taken
            -- for a column of another type)
            v_val := v_vals OPERATOR(pg_catalog.->) 0;
            IF pg_catalog.jsonb_typeof(v_val) OPERATOR(pg_catalog.=) ANY ('{object,array,string}'::pg_catalog.text[])
               AND (rec::pg_catalog.text OPERATOR(pg_catalog.=) ROW(v_val::pg_catalog.text)::pg_catalog.text
                    OR rec::pg_catalog.text OPERATOR(pg_catalog.=)
                       ROW((SELECT j.value FROM pg_catalog.json_each(pg_catalog.to_json(rec)) AS j)::pg_catalog.text)::pg_catalog.text) THEN
                v_one := v_val;
            END IF;
        END IF;
        v_rows := v_rows OPERATOR(pg_catalog.||) v_one;
    END LOOP;
    END IF;
    v_one := CASE pg_catalog.cardinality(v_rows)
                 WHEN 0 THEN NULL
                 WHEN 1 THEN v_rows[1]
                 ELSE pg_catalog.to_jsonb(v_rows) END;
    PERFORM idempotency.complete(p_key, v_one);
    RETURN ROW(b.outcome, v_one)::idempotency.once_result;
END
$fn$
-- @end
