-- portable/src/helpers.sql: the write helpers — create_machine(),
-- transition(), update_versioned(), insert_once().
--
-- As in the C edition (src/machine.c, versioned.c, insert_once.c,
-- target.c): transition(), update_versioned() and insert_once() run as the
-- caller (SECURITY INVOKER: the caller's privileges and row security on
-- the target); create_machine() writes idempotency.state_machine, which no
-- application role may write, so it is SECURITY DEFINER and the machine's
-- owner is idempotency._caller().  Statements are built from catalog facts
-- only: the table and its columns are checked against pg_class and
-- pg_attribute and quoted with format('%I'), types are written so that
-- they name the same type on any search_path (_helper_type_sql), operators
-- are the type's default btree operators as OPERATOR(schema.op), every
-- value is a parameter (EXECUTE ... USING).  JSON values are cast to the
-- column types by jsonb_populate_record(): on the row itself for
-- update_versioned(), on a NULL of the table's row type for insert_once()
-- (by a column list of the named columns when a column the row leaves out
-- has a constrained domain, which a NULL base would check).
--
-- search_path: the three invoker functions pin it to pg_catalog, pg_temp
-- (set_config(..., true), their first statement) for their own work, and
-- give the caller's back only around the statements on the target (the
-- to_state and id casts, the UPDATE or INSERT and its probe, the deparsed
-- default of a key column), so a trigger on the target sees the caller's
-- search_path as in the C edition, while a look-alike operator, function or
-- type earlier on it changes nothing the helper wrote.  The caller's value
-- is set again before every return; an error rolls the setting back with
-- the (sub)transaction.  The helpers keep no plans per target as the C
-- edition does: each call builds its statements from the catalog (so an
-- ALTER TABLE between calls is always followed, and nothing accumulates in
-- the session).

-- @body idempotency_create_machine
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_machine     ALIAS FOR $1;
    p_transitions ALIAS FOR $2;
    v_owner pg_catalog.regrole;
    v_from  pg_catalog.text;
    v_targets pg_catalog.jsonb;
    v_t     pg_catalog.jsonb;
    v_twice pg_catalog.bool;
    v_clip  pg_catalog.text;
    v_n     pg_catalog.int8;
    v_hint CONSTANT pg_catalog.text := 'Write transitions as an object from each state to an array of the states it may move to, e.g. {"pending": ["paid", "cancelled"], "paid": ["shipped"]}.';
BEGIN
    IF p_machine IS NULL OR p_machine = '' THEN
        RAISE EXCEPTION 'state machine name must not be null or empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(p_machine) > 1024 THEN
        -- the first 40 bytes, never half a character
        v_clip := left(p_machine, 40);
        WHILE octet_length(v_clip) > 40 LOOP
            v_clip := left(v_clip, -1);
        END LOOP;
        RAISE EXCEPTION 'state machine name "%..." is too long', v_clip
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('The name is %s bytes; the limit is %s.', octet_length(p_machine), 1024);
    END IF;
    IF p_transitions IS NULL THEN
        RAISE EXCEPTION 'invalid transitions for state machine "%"', p_machine
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'The transitions are NULL.', HINT = v_hint;
    END IF;
    IF jsonb_typeof(p_transitions) <> 'object' OR p_transitions = '{}'::jsonb THEN
        RAISE EXCEPTION 'invalid transitions for state machine "%"', p_machine
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'The transitions must be a non-empty JSON object.', HINT = v_hint;
    END IF;
    -- the states in the object's order (as the C edition's iterator)
    FOR v_from, v_targets IN SELECT e.key, e.value FROM jsonb_each(p_transitions) AS e LOOP
        IF v_from = '' THEN
            RAISE EXCEPTION 'invalid transitions for state machine "%"', p_machine
                USING ERRCODE = 'invalid_parameter_value', DETAIL = 'A state name is empty.', HINT = v_hint;
        END IF;
        IF jsonb_typeof(v_targets) = 'object' THEN
            RAISE EXCEPTION 'invalid transitions for state machine "%"', p_machine
                USING ERRCODE = 'invalid_parameter_value', HINT = v_hint,
                      DETAIL = format('The transitions of state "%s" must be an array, not an object.', v_from);
        ELSIF jsonb_typeof(v_targets) <> 'array' THEN
            RAISE EXCEPTION 'invalid transitions for state machine "%"', p_machine
                USING ERRCODE = 'invalid_parameter_value', HINT = v_hint,
                      DETAIL = format('The transitions of state "%s" must be an array of state names.', v_from);
        END IF;
        -- the first element, in array order, that is not a non-empty
        -- string or repeats an earlier one (the C edition's one pass)
        SELECT d.value, d.k > 1 INTO v_t, v_twice
          FROM (SELECT e.value, e.n,
                       CASE WHEN jsonb_typeof(e.value) = 'string' AND e.value <> '""'::jsonb
                            THEN pg_catalog.row_number() OVER (PARTITION BY e.value ORDER BY e.n) ELSE 0 END AS k
                  FROM jsonb_array_elements(v_targets) WITH ORDINALITY AS e(value, n)) AS d
         WHERE d.k <> 1
         ORDER BY d.n LIMIT 1;
        IF FOUND AND v_twice THEN
            RAISE EXCEPTION 'invalid transitions for state machine "%"', p_machine
                USING ERRCODE = 'invalid_parameter_value', HINT = v_hint,
                      DETAIL = format('State "%s" lists "%s" twice.', v_from, v_t #>> '{}');
        ELSIF FOUND THEN
            IF jsonb_typeof(v_t) = 'array' THEN
                RAISE EXCEPTION 'invalid transitions for state machine "%"', p_machine
                    USING ERRCODE = 'invalid_parameter_value', HINT = v_hint,
                          DETAIL = format('The transitions of state "%s" must be an array of state names, not nested arrays.', v_from);
            ELSIF jsonb_typeof(v_t) = 'object' THEN
                RAISE EXCEPTION 'invalid transitions for state machine "%"', p_machine
                    USING ERRCODE = 'invalid_parameter_value', HINT = v_hint,
                          DETAIL = format('The transitions of state "%s" must be an array, not an object.', v_from);
            END IF;
            RAISE EXCEPTION 'invalid transitions for state machine "%"', p_machine
                USING ERRCODE = 'invalid_parameter_value', HINT = v_hint,
                      DETAIL = format('State "%s" lists a target that is not a non-empty string.', v_from);
        END IF;
    END LOOP;
    v_owner := idempotency._caller();
    INSERT INTO idempotency.state_machine AS m (machine, transitions, owner, updated_at)
    VALUES (p_machine, p_transitions, v_owner, now())
    ON CONFLICT (machine) DO UPDATE
       SET transitions = EXCLUDED.transitions, updated_at = EXCLUDED.updated_at
     WHERE m.owner = EXCLUDED.owner
        OR (SELECT r.rolsuper FROM pg_roles AS r WHERE r.oid = v_owner);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION 'state machine "%" belongs to another role', p_machine
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'Only the role that defined a state machine, or a superuser, may redefine it.';
    END IF;
END
$fn$
-- @end

-- @body idempotency_transition
LANGUAGE plpgsql SECURITY INVOKER
AS $fn$
DECLARE
    v_path pg_catalog.text := pg_catalog.current_setting('search_path');
    p_target   ALIAS FOR $1;
    p_id       ALIAS FOR $2;
    p_to_state ALIAS FOR $3;
    p_machine  ALIAS FOR $4;
    t      record;
    st     record;
    idc    record;
    v_to   pg_catalog.text;
    v_base pg_catalog.oid;
    v_int  pg_catalog.bool;
    v_forward pg_catalog.bool := p_machine IS NULL;
    v_idsql  pg_catalog.text;
    v_type   pg_catalog.text;
    v_where  pg_catalog.text;
    v_same   pg_catalog.text;
    v_work   pg_catalog.text;
    v_probe  pg_catalog.text;
    v_n      pg_catalog.int8;
    r        record;
    v_from   pg_catalog.text;
    v_allowed pg_catalog.bool;
BEGIN
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    t := idempotency._helper_target(p_target);
    IF $5 IS NULL THEN
        RAISE EXCEPTION 'state_column must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF $6 IS NULL THEN
        RAISE EXCEPTION 'id_column must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    st := idempotency._helper_column(p_target, t.relname, $5);
    idc := idempotency._helper_column(p_target, t.relname, $6);
    IF st.attnum = idc.attnum THEN
        RAISE EXCEPTION 'state column and id column must differ, both are "%"', st.name
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'transition() would rewrite the column that identifies the row.';
    END IF;
    v_idsql := idempotency._helper_id(p_id, idc.typ, idc.name, v_path);
    IF p_to_state IS NULL THEN
        RAISE EXCEPTION 'to_state must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    v_base := idempotency._helper_base_type(st.typ);
    v_int := v_base IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype);
    IF NOT v_int AND (SELECT ty.typcategory FROM pg_type AS ty WHERE ty.oid = v_base) NOT IN ('S', 'E') THEN
        RAISE EXCEPTION 'state column "%" of table "%" has type %, which transition() does not support',
                        st.name, t.relname, idempotency._helper_type_name(st.typ, v_path)
            USING ERRCODE = 'datatype_mismatch',
                  DETAIL = 'A state column must be of a string type, an enum type or an integer type.';
    END IF;
    IF v_forward AND st.typ NOT IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype) THEN
        RAISE EXCEPTION 'a state machine is required for state column "%" of type %', st.name, idempotency._helper_type_name(st.typ, v_path)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Without a machine, transition() only moves integer states forward.';
    END IF;
    -- to_state read by the column type's input (a value it cannot hold is
    -- the type's own error); an integer or enum state spelled as the type
    -- spells it, so a machine's (text) states match it
    v_type := idempotency._helper_type_sql(st.typ, -1);
    PERFORM pg_catalog.set_config('search_path', v_path, true);
    EXECUTE format('SELECT $1::%s::pg_catalog.text', v_type) INTO v_to USING p_to_state;
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    IF NOT v_int AND (SELECT ty.typtype FROM pg_type AS ty WHERE ty.oid = v_base) <> 'e' THEN
        v_to := p_to_state;
    END IF;

    v_where := format('t.%I %s %s', idc.name, idempotency._helper_operator(idc.typ, 3), v_idsql);
    v_same := format('t.%I %s $2::%s', st.name, idempotency._helper_operator(st.typ, 3), v_type);
    IF v_forward THEN
        v_work := format('UPDATE %s AS t SET %I = $2::%s WHERE %s AND t.%I %s $2::%s',
                         t.qualname, st.name, v_type, v_where, st.name,
                         idempotency._helper_operator(st.typ, 1), v_type);
        v_probe := format('SELECT t.%I::pg_catalog.text AS cur, NULL::pg_catalog.bool AS has_machine,'
                          ' NULL::pg_catalog.jsonb AS transitions, %s AS same FROM %s AS t WHERE %s',
                          st.name, v_same, t.qualname, v_where);
    ELSE
        v_work := format('UPDATE %s AS t SET %I = $2::%s WHERE %s'
                         ' AND NOT (%s)'
                         ' AND t.%I::pg_catalog.text OPERATOR(pg_catalog.=) ANY (ARRAY('
                         '   SELECT e.key FROM idempotency.state_machine AS m,'
                         '          pg_catalog.jsonb_each(CASE WHEN pg_catalog.jsonb_typeof(m.transitions)'
                         '            OPERATOR(pg_catalog.=) ''object'' THEN m.transitions END) AS e'
                         '    WHERE m.machine OPERATOR(pg_catalog.=) $3'
                         '      AND e.value OPERATOR(pg_catalog.?) $2))',
                         t.qualname, st.name, v_type, v_where, v_same, st.name);
        v_probe := format('SELECT t.%I::pg_catalog.text AS cur, m.machine IS NOT NULL AS has_machine,'
                          ' m.transitions, %s AS same'
                          ' FROM %s AS t LEFT JOIN idempotency.state_machine AS m'
                          '   ON m.machine OPERATOR(pg_catalog.=) $3'
                          ' WHERE %s',
                          st.name, v_same, t.qualname, v_where);
    END IF;

    FOR tries IN 0..3 LOOP
        PERFORM pg_catalog.set_config('search_path', v_path, true);
        EXECUTE v_work USING p_id, v_to, p_machine;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n OPERATOR(pg_catalog.>) 0 THEN
            RETURN 'applied';       -- search_path: the caller's again
        END IF;
        EXECUTE v_probe INTO r USING p_id, v_to, p_machine;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
        IF v_n OPERATOR(pg_catalog.=) 0 THEN
            PERFORM idempotency._helper_no_row(idc.name, pg_catalog.format('%s', p_id), t.relname);
        END IF;
        IF v_forward THEN
            IF r.same THEN
                PERFORM pg_catalog.set_config('search_path', v_path, true);
                RETURN 'already';
            END IF;
            IF r.cur IS NOT NULL AND r.cur::pg_catalog.int8 < v_to::pg_catalog.int8 THEN
                CONTINUE WHEN tries < 3;
                PERFORM idempotency._helper_update_hidden(p_target, 'transition()', idc.name, pg_catalog.format('%s', p_id), t.relname);
            END IF;
            RAISE EXCEPTION 'invalid state transition of row % = % in table "%" from % to %',
                            idc.name, pg_catalog.format('%s', p_id), t.relname, coalesce(r.cur, 'NULL'), v_to
                USING ERRCODE = 'IK005',
                      DETAIL = format('Without a state machine, states only move forward; the current state is %s.',
                                      coalesce(r.cur, 'NULL'));
        END IF;
        IF NOT r.has_machine THEN
            RAISE EXCEPTION 'state machine "%" does not exist', p_machine
                USING ERRCODE = 'undefined_object', HINT = 'Define it with idempotency.create_machine().';
        END IF;
        IF r.same THEN
            PERFORM pg_catalog.set_config('search_path', v_path, true);
            RETURN 'already';
        END IF;
        IF r.transitions IS NULL OR jsonb_typeof(r.transitions) <> 'object' THEN
            RAISE EXCEPTION 'state machine "%" in table idempotency.state_machine is broken', p_machine
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = format('Its transitions are %s, not a JSON object.',
                                      CASE WHEN r.transitions IS NULL THEN 'NULL'
                                           WHEN jsonb_typeof(r.transitions) = 'array' THEN 'a JSON array'
                                           ELSE 'a JSON scalar' END),
                      HINT = 'Define it again with idempotency.create_machine().';
        END IF;
        -- the states from which to_state may be reached, in the object's order
        SELECT string_agg(format('"%s"', e.key), ', ' ORDER BY e.n),
               coalesce(bool_or(e.key = r.cur), false)
          INTO v_from, v_allowed
          FROM jsonb_each(r.transitions) WITH ORDINALITY AS e(key, value, n)
         WHERE jsonb_typeof(e.value) = 'array' AND e.value ? v_to;
        CONTINUE WHEN tries < 3 AND v_allowed;     -- the state moved under us: again
        IF v_allowed THEN
            PERFORM idempotency._helper_update_hidden(p_target, 'transition()', idc.name, pg_catalog.format('%s', p_id), t.relname);
        END IF;
        RAISE EXCEPTION 'invalid state transition of row % = % in table "%" from "%" to "%"',
                        idc.name, pg_catalog.format('%s', p_id), t.relname, coalesce(r.cur, 'NULL'), v_to
            USING ERRCODE = 'IK005',
                  DETAIL = CASE WHEN v_from IS NOT NULL
                                THEN format('The current state is "%s"; state machine "%s" allows "%s" only from %s.',
                                            coalesce(r.cur, 'NULL'), p_machine, v_to, v_from)
                                ELSE format('The current state is "%s"; state machine "%s" never moves to "%s".',
                                            coalesce(r.cur, 'NULL'), p_machine, v_to) END;
    END LOOP;
END
$fn$
-- @end

-- @body idempotency_update_versioned
LANGUAGE plpgsql SECURITY INVOKER
AS $fn$
DECLARE
    v_path pg_catalog.text := pg_catalog.current_setting('search_path');
    p_target   ALIAS FOR $1;
    p_id       ALIAS FOR $2;
    p_expected ALIAS FOR $3;
    p_changes  ALIAS FOR $4;
    t      record;
    ver    record;
    idc    record;
    c      record;
    v_idsql  pg_catalog.text;
    v_where  pg_catalog.text;
    v_targets pg_catalog.text := '';
    v_sources pg_catalog.text := '';
    v_defs    pg_catalog.text := '';
    v_work   pg_catalog.text;
    v_probe  pg_catalog.text;
    v_new    pg_catalog.int8;
    v_cur    pg_catalog.text;
    v_n      pg_catalog.int8;
BEGIN
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    t := idempotency._helper_target(p_target);
    IF $5 IS NULL THEN
        RAISE EXCEPTION 'version_column must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    ver := idempotency._helper_column(p_target, t.relname, $5);
    IF $6 IS NULL THEN
        RAISE EXCEPTION 'id_column must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    idc := idempotency._helper_column(p_target, t.relname, $6);
    IF ver.attnum = idc.attnum THEN
        RAISE EXCEPTION 'version column and id column must differ, both are "%"', ver.name
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'update_versioned() would rewrite the column that identifies the row.';
    END IF;
    v_idsql := idempotency._helper_id(p_id, idc.typ, idc.name, v_path);
    IF p_changes IS NULL THEN
        RAISE EXCEPTION 'changes must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF ver.typ NOT IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype) THEN
        RAISE EXCEPTION 'version column "%" must be an integer column, not %', ver.name, idempotency._helper_type_name(ver.typ, v_path)
            USING ERRCODE = 'datatype_mismatch';
    END IF;
    FOR c IN SELECT * FROM idempotency._helper_object_columns(p_target, t.relname, p_changes, 'changes') LOOP
        IF c.attnum IN (ver.attnum, idc.attnum) THEN
            RAISE EXCEPTION 'changes may not set column "%"', c.name
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'update_versioned() sets the version column itself, and the id column identifies the row.';
        END IF;
        v_targets := v_targets || format('%I, ', c.name);
        v_sources := v_sources || format('r.%I, ', c.name);
        v_defs := v_defs || CASE WHEN v_defs = '' THEN '' ELSE ', ' END || format('%I %s', c.name, c.typsql);
    END LOOP;
    IF v_defs = '' THEN
        RAISE EXCEPTION 'changes must name at least one column' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_where := format('t.%I %s %s', idc.name, idempotency._helper_operator(idc.typ, 3), v_idsql);
    -- the row itself is the base record: a column the call does not name
    -- keeps its value and is not read through its domain
    v_work := format('UPDATE %s AS t SET (%s%I) = (SELECT %st.%I OPERATOR(pg_catalog.+) 1'
                     '  FROM pg_catalog.jsonb_populate_record(t.*, $3) AS r)'
                     ' WHERE %s AND t.%I OPERATOR(pg_catalog.=) $2'
                     ' RETURNING t.%I',
                     t.qualname, v_targets, ver.name, v_sources, ver.name,
                     v_where, ver.name, ver.name);
    v_probe := format('SELECT t.%I::pg_catalog.text FROM %s AS t WHERE %s', ver.name, t.qualname, v_where);

    -- a NULL version is what a caller gets by reading the version of a row
    -- that does not exist: the missing row (P0002) first
    PERFORM pg_catalog.set_config('search_path', v_path, true);
    IF p_expected IS NULL THEN
        EXECUTE v_probe INTO v_cur USING p_id;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n OPERATOR(pg_catalog.=) 0 THEN
            PERFORM idempotency._helper_no_row(idc.name, pg_catalog.format('%s', p_id), t.relname);
        END IF;
        RAISE EXCEPTION 'expected_version must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    EXECUTE v_work INTO v_new USING p_id, p_expected, p_changes;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n OPERATOR(pg_catalog.>) 0 THEN
        RETURN v_new;
    END IF;
    EXECUTE v_probe INTO v_cur USING p_id;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    IF v_n OPERATOR(pg_catalog.=) 0 THEN
        PERFORM idempotency._helper_no_row(idc.name, pg_catalog.format('%s', p_id), t.relname);
    END IF;
    IF v_cur IS NOT NULL AND v_cur::pg_catalog.int8 = p_expected THEN
        -- the expected version there, and no row changed: hidden from UPDATE
        PERFORM idempotency._helper_update_hidden(p_target, 'update_versioned()', idc.name, pg_catalog.format('%s', p_id), t.relname);
    END IF;
    RAISE EXCEPTION 'stale version of row % = % in table "%": expected %, current %',
                    idc.name, pg_catalog.format('%s', p_id), t.relname, p_expected, coalesce(v_cur, 'NULL')
        USING ERRCODE = 'IK006',
              DETAIL = format('Another write changed the row since version %s; its %s is now %s.',
                              p_expected, ver.name, coalesce(v_cur, 'NULL')),
              HINT = 'Read the row again and retry with its current version (HTTP 409).';
END
$fn$
-- @end

-- @body idempotency_insert_once
LANGUAGE plpgsql SECURITY INVOKER
AS $fn$
DECLARE
    v_path pg_catalog.text := pg_catalog.current_setting('search_path');
    p_target ALIAS FOR $1;
    p_row    ALIAS FOR $2;
    p_keys   ALIAS FOR $3;
    t      record;
    c      record;
    v_cols   pg_catalog.int2[] := '{}';
    v_targets pg_catalog.text := '';
    v_sources pg_catalog.text := '';
    v_defs    pg_catalog.text := '';
    v_conflict pg_catalog.text := '';
    v_match  pg_catalog.text := '';
    v_value  pg_catalog.text;
    v_unknowable pg_catalog.text;
    v_work   pg_catalog.text;
    v_probe  pg_catalog.text;
    v_result pg_catalog.jsonb;
    v_skipping pg_catalog.bool;
    v_record pg_catalog.text;
    v_n      pg_catalog.int8;
BEGIN
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    t := idempotency._helper_target(p_target);
    IF p_row IS NULL THEN
        RAISE EXCEPTION 'row must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    FOR c IN SELECT * FROM idempotency._helper_object_columns(p_target, t.relname, p_row, 'row') LOOP
        v_cols := v_cols || c.attnum;
        v_targets := v_targets || CASE WHEN v_targets = '' THEN '' ELSE ', ' END || format('%I', c.name);
        v_sources := v_sources || CASE WHEN v_sources = '' THEN '' ELSE ', ' END || format('r.%I', c.name);
        v_defs := v_defs || CASE WHEN v_defs = '' THEN '' ELSE ', ' END || format('%I %s', c.name, c.typsql);
    END LOOP;
    IF v_defs = '' THEN
        RAISE EXCEPTION 'row must name at least one column' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR c IN SELECT * FROM idempotency._helper_key_columns(p_target, t.relname, p_keys) LOOP
        IF c.attnum = ANY (v_cols) THEN
            v_value := format('r.%I', c.name);
        ELSE
            v_value := idempotency._helper_default_sql(p_target, c.attnum, v_path);
            IF v_value IS NULL THEN
                v_unknowable := c.name;
            END IF;
        END IF;
        v_conflict := v_conflict || CASE WHEN v_conflict = '' THEN '' ELSE ', ' END || format('%I', c.name);
        v_match := v_match || CASE WHEN v_match = '' THEN '' ELSE ' AND ' END
                   || format('t.%I %s %s', c.name, idempotency._helper_operator(c.typ, 3), coalesce(v_value, 'NULL'));
    END LOOP;
    -- the JSON object as a row of the table: jsonb_populate_record() on a
    -- NULL of the table's row type (its type is kept per table), unless a
    -- column the call does not name has a domain with constraints, which
    -- a NULL base would read NULL through (a NOT NULL domain would refuse
    -- it): then jsonb_to_record() with a column list of the named columns
    -- only (which registers an anonymous record type per set of columns
    -- for the life of the session)
    IF EXISTS (SELECT FROM pg_attribute AS a
                WHERE a.attrelid = p_target AND a.attnum > 0 AND NOT a.attisdropped
                  AND a.attnum <> ALL (v_cols)
                  AND idempotency._helper_constrained_domain(a.atttypid)) THEN
        v_record := format('pg_catalog.jsonb_to_record($1) AS r(%s)', v_defs);
    ELSE
        v_record := format('pg_catalog.jsonb_populate_record(NULL::%s, $1) AS r', t.qualname);
    END IF;
    v_work := format('INSERT INTO %s AS t (%s)'
                     ' SELECT %s FROM %s'
                     ' ON CONFLICT (%s) DO NOTHING'
                     ' RETURNING pg_catalog.to_jsonb(t.*)',
                     t.qualname, v_targets, v_sources, v_record, v_conflict);
    v_probe := format('SELECT pg_catalog.to_jsonb(t.*) FROM %s AS t, %s'
                      ' WHERE %s',
                      t.qualname, v_record, v_match);

    -- insert, or read the row that holds the key; if that row is deleted
    -- between the two, insert again (a few times at most)
    FOR tries IN 0..3 LOOP
        PERFORM pg_catalog.set_config('search_path', v_path, true);
        EXECUTE v_work INTO v_result USING p_row;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n OPERATOR(pg_catalog.>) 0 THEN
            RETURN ROW(true, v_result)::idempotency.insert_once_result;
        END IF;
        EXECUTE v_probe INTO v_result USING p_row;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n OPERATOR(pg_catalog.>) 0 THEN
            RETURN ROW(false, v_result)::idempotency.insert_once_result;
        END IF;
        PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
        SELECT EXISTS (SELECT FROM pg_trigger AS tg
                        WHERE tg.tgrelid = p_target AND tg.tgenabled <> 'D'
                          AND (tg.tgtype & 7) = 7)     -- ROW, BEFORE, INSERT
          INTO v_skipping;
        IF v_skipping THEN
            RAISE EXCEPTION 'insert_once() on table "%" neither inserted the row nor found one with its key', t.relname
                USING ERRCODE = 'triggered_action_exception',
                      DETAIL = 'A BEFORE INSERT trigger on the table skipped the row or changed its key.';
        END IF;
        IF v_unknowable IS NOT NULL THEN
            RAISE EXCEPTION 'insert_once() on table "%" neither inserted the row nor found one with its key', t.relname
                USING ERRCODE = 'unique_violation',
                      DETAIL = format('Key column "%s" is not in row, and its default is volatile or generated, so the row that holds the key cannot be looked up.', v_unknowable),
                      HINT = 'Name every conflict column in row.';
        END IF;
        -- hidden, not deleted: a row that still holds the key but stays
        -- unseen after one more try is one row security hides
        IF tries >= 1 AND row_security_active(p_target) THEN
            RAISE EXCEPTION 'insert_once() on table "%" found the key held by a row that row-level security hides', t.relname
                USING ERRCODE = 'insufficient_privilege',
                      DETAIL = format('No SELECT policy of the table lets role %s read the row that holds the key; nothing was written.', current_user),
                      HINT = 'Grant the role a SELECT policy that covers the row, or use another key.';
        END IF;
    END LOOP;
    RAISE EXCEPTION 'could not insert into or read the row of "%" with that key', t.relname
        USING ERRCODE = 'serialization_failure',
              DETAIL = 'The conflicting row kept disappearing.',
              HINT = 'Retry the transaction.';
END
$fn$
-- @end

-- @tail
-- ---------------------------------------------------------------------
-- The write helpers' shared layer (the C edition's src/target.c): the
-- target, its columns, the id argument, operators and types as SQL.  Each
-- reads the catalog only; SECURITY INVOKER and callable by every role (the
-- helpers run as their caller).
-- ---------------------------------------------------------------------

-- The target table: a table or partitioned table, locked before its
-- catalog rows are read (as the parser locks an INSERT's target): ROW
-- EXCLUSIVE where the caller may take it, else a wait for any lock a DDL
-- statement holds (pg_relation_size() takes and drops ACCESS SHARE
-- without a privilege check) — the helper's own statement then fails on
-- the caller's privileges, as in the C edition.
CREATE FUNCTION idempotency._helper_target(target pg_catalog.regclass,
                                           OUT qualname pg_catalog.text, OUT relname pg_catalog.text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_kind pg_catalog.char;
BEGIN
    IF target IS NULL THEN
        RAISE EXCEPTION 'target must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT c.relkind, c.relname, format('%I.%I', n.nspname, c.relname)
      INTO v_kind, relname, qualname
      FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = target;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'relation with OID % does not exist', target::pg_catalog.oid USING ERRCODE = 'undefined_table';
    END IF;
    IF v_kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION '"%" is not a table', relname USING ERRCODE = 'wrong_object_type';
    END IF;
    IF has_table_privilege(target, 'INSERT, UPDATE, DELETE, TRUNCATE') THEN
        BEGIN
            EXECUTE format('LOCK TABLE ONLY %s IN ROW EXCLUSIVE MODE', qualname);
        EXCEPTION WHEN undefined_table THEN
            NULL;   -- dropped while we waited: below
        END;
    ELSE
        PERFORM pg_relation_size(target);
    END IF;
    -- dropped while we waited?
    IF NOT EXISTS (SELECT FROM pg_class AS c WHERE c.oid = target) THEN
        RAISE EXCEPTION 'relation with OID % does not exist', target::pg_catalog.oid USING ERRCODE = 'undefined_table';
    END IF;
END
$fn$;
COMMENT ON FUNCTION idempotency._helper_target(pg_catalog.regclass) IS
'Portable edition, internal: the write helpers'' target table, checked and locked; its quoted qualified name and its name';

-- A type as SQL that means the same type on any search_path (the C
-- edition's FORMAT_TYPE_FORCE_QUALIFY): format_type() under this
-- function's search_path qualifies every type outside pg_catalog, and
-- prints SQL's keyword spellings (integer, numeric(10,2), character
-- varying(3), timestamp with time zone ...) for the types that have one;
-- any other type of pg_catalog (text, jsonb, uuid, their arrays) gets
-- "pg_catalog." in front.
CREATE FUNCTION idempotency._helper_type_sql(typ pg_catalog.oid, typmod pg_catalog.int4)
RETURNS pg_catalog.text
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
SELECT CASE WHEN e.typnamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
             AND e.typname OPERATOR(pg_catalog.<>) ALL ('{bool,bpchar,float4,float8,int2,int4,int8,numeric,interval,bit,varbit,time,timetz,timestamp,timestamptz,varchar}'::pg_catalog.name[])
            THEN 'pg_catalog.' ELSE '' END
       OPERATOR(pg_catalog.||) pg_catalog.format_type(typ, CASE WHEN typmod OPERATOR(pg_catalog.>=) 0 THEN typmod END)
  FROM pg_catalog.pg_type AS ty
  JOIN pg_catalog.pg_type AS e
    ON e.oid OPERATOR(pg_catalog.=) CASE WHEN ty.typelem OPERATOR(pg_catalog.<>) 0
                                              AND ty.typsubscript OPERATOR(pg_catalog.=) 'pg_catalog.array_subscript_handler'::pg_catalog.regproc
                                         THEN ty.typelem ELSE ty.oid END
 WHERE ty.oid OPERATOR(pg_catalog.=) typ
$fn$;
COMMENT ON FUNCTION idempotency._helper_type_sql(pg_catalog.oid, pg_catalog.int4) IS
'Portable edition, internal: a type as SQL that names it on any search_path';

-- A type's name for a message, as format_type() spells it on the caller's
-- search_path (the C edition's format_type_be() at the call).
CREATE FUNCTION idempotency._helper_type_name(typ pg_catalog.oid, path pg_catalog.text)
RETURNS pg_catalog.text
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    PERFORM set_config('search_path', path, true);  -- until this function returns
    RETURN pg_catalog.format_type(typ, NULL);
END
$fn$;
COMMENT ON FUNCTION idempotency._helper_type_name(pg_catalog.oid, pg_catalog.text) IS
'Portable edition, internal: a type''s name for a message, as the caller''s search_path spells it';

-- A column of the target by name: 42703 when there is none (or it is a
-- system column); its type, as SQL too.
CREATE FUNCTION idempotency._helper_column(target pg_catalog.regclass, relname pg_catalog.text, colname pg_catalog.name,
                                           OUT attnum pg_catalog.int2, OUT name pg_catalog.text, OUT typ pg_catalog.oid,
                                           OUT typsql pg_catalog.text)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    SELECT a.attnum, a.attname, a.atttypid, idempotency._helper_type_sql(a.atttypid, a.atttypmod)
      INTO attnum, name, typ, typsql
      FROM pg_attribute AS a
     WHERE a.attrelid = target AND a.attname = colname AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'column "%" of relation "%" does not exist', colname, relname USING ERRCODE = 'undefined_column';
    END IF;
END
$fn$;
COMMENT ON FUNCTION idempotency._helper_column(pg_catalog.regclass, pg_catalog.text, pg_catalog.name) IS
'Portable edition, internal: a column of a write helper''s target, 42703 when it has none';

-- The keys of a JSON object as columns of the target, in jsonb's key
-- order: 22023 when it is no object, 42703 for a key that is no column.
CREATE FUNCTION idempotency._helper_object_columns(target pg_catalog.regclass, relname pg_catalog.text,
                                                   obj pg_catalog.jsonb, what pg_catalog.text)
RETURNS TABLE (attnum pg_catalog.int2, name pg_catalog.text, typ pg_catalog.oid, typsql pg_catalog.text)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    k pg_catalog.text;
BEGIN
    IF jsonb_typeof(obj) <> 'object' THEN
        RAISE EXCEPTION '% must be a JSON object of column names and values', what USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR k IN SELECT jsonb_object_keys(obj) LOOP
        SELECT * INTO attnum, name, typ, typsql FROM idempotency._helper_column(target, relname, k);
        RETURN NEXT;
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION idempotency._helper_object_columns(pg_catalog.regclass, pg_catalog.text, pg_catalog.jsonb, pg_catalog.text) IS
'Portable edition, internal: the keys of a write helper''s JSON object as columns of its target';

-- insert_once()'s key: conflict_columns, or the primary key's columns in
-- index order when it is NULL.
CREATE FUNCTION idempotency._helper_key_columns(target pg_catalog.regclass, relname pg_catalog.text, keys pg_catalog.name[])
RETURNS TABLE (attnum pg_catalog.int2, name pg_catalog.text, typ pg_catalog.oid, typsql pg_catalog.text)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    k pg_catalog.name;
BEGIN
    IF keys IS NULL THEN
        IF NOT EXISTS (SELECT FROM pg_index AS i WHERE i.indrelid = target AND i.indisprimary) THEN
            RAISE EXCEPTION 'table "%" has no primary key', relname
                USING ERRCODE = 'invalid_column_reference',
                      HINT = 'Pass conflict_columns naming the columns of a unique index.';
        END IF;
        FOR k IN SELECT a.attname
                   FROM pg_index AS i, generate_subscripts(i.indkey, 1) AS s(n), pg_attribute AS a
                  WHERE i.indrelid = target AND i.indisprimary AND s.n < i.indnkeyatts
                    AND a.attrelid = target AND a.attnum = i.indkey[s.n]
                  ORDER BY s.n LOOP
            SELECT * INTO attnum, name, typ, typsql FROM idempotency._helper_column(target, relname, k);
            RETURN NEXT;
        END LOOP;
        RETURN;
    END IF;
    IF cardinality(keys) = 0 THEN
        RAISE EXCEPTION 'conflict_columns must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(keys, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'conflict_columns must not contain NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    FOREACH k IN ARRAY keys LOOP
        SELECT * INTO attnum, name, typ, typsql FROM idempotency._helper_column(target, relname, k);
        RETURN NEXT;
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION idempotency._helper_key_columns(pg_catalog.regclass, pg_catalog.text, pg_catalog.name[]) IS
'Portable edition, internal: insert_once()''s key columns (conflict_columns, else the primary key)';

-- Whether a type is a domain with a NOT NULL or CHECK constraint (its
-- own or a base domain's).
CREATE FUNCTION idempotency._helper_constrained_domain(typ pg_catalog.oid)
RETURNS pg_catalog.bool
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
WITH RECURSIVE d(oid, base, nn) AS (
    SELECT ty.oid, ty.typbasetype, ty.typnotnull FROM pg_catalog.pg_type AS ty
     WHERE ty.oid OPERATOR(pg_catalog.=) typ AND ty.typtype OPERATOR(pg_catalog.=) 'd'
    UNION ALL
    SELECT ty.oid, ty.typbasetype, ty.typnotnull FROM d, pg_catalog.pg_type AS ty
     WHERE ty.oid OPERATOR(pg_catalog.=) d.base AND ty.typtype OPERATOR(pg_catalog.=) 'd'
)
SELECT EXISTS (SELECT FROM d WHERE d.nn
                  OR EXISTS (SELECT FROM pg_catalog.pg_constraint AS c WHERE c.contypid OPERATOR(pg_catalog.=) d.oid))
$fn$;
COMMENT ON FUNCTION idempotency._helper_constrained_domain(pg_catalog.oid) IS
'Portable edition, internal: whether a type is a domain with a NOT NULL or CHECK constraint';

-- The base type of a domain (the type itself otherwise).
CREATE FUNCTION idempotency._helper_base_type(typ pg_catalog.oid)
RETURNS pg_catalog.oid
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
WITH RECURSIVE d(oid, base) AS (
    SELECT ty.oid, ty.typbasetype FROM pg_catalog.pg_type AS ty WHERE ty.oid OPERATOR(pg_catalog.=) typ
    UNION ALL
    SELECT ty.oid, ty.typbasetype FROM d, pg_catalog.pg_type AS ty WHERE ty.oid OPERATOR(pg_catalog.=) d.base
)
SELECT d.oid FROM d WHERE d.base OPERATOR(pg_catalog.=) 0
$fn$;
COMMENT ON FUNCTION idempotency._helper_base_type(pg_catalog.oid) IS
'Portable edition, internal: the base type of a domain, or the type itself';

-- "OPERATOR(schema.op)": the type's default btree equality (strategy 3)
-- or less-than (1) operator, as the C edition's type cache finds it
-- (the type's own operator class, its base type's, a polymorphic one or
-- one of a binary-coercible type); 42883 when there is none.
CREATE FUNCTION idempotency._helper_operator(typ pg_catalog.oid, strategy pg_catalog.int4)
RETURNS pg_catalog.text
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_base pg_catalog.oid := idempotency._helper_base_type(typ);
    v_kind pg_catalog.char;
    v_elem pg_catalog.oid;
    v_sql  pg_catalog.text;
BEGIN
    SELECT ty.typtype, ty.typelem INTO v_kind, v_elem FROM pg_type AS ty WHERE ty.oid = v_base;
    SELECT format('OPERATOR(%I.%s)', n.nspname, o.oprname) INTO v_sql
      FROM pg_opclass AS c
      JOIN pg_am AS am ON am.oid = c.opcmethod
      JOIN pg_amop AS ao ON ao.amopfamily = c.opcfamily AND ao.amoplefttype = c.opcintype
                        AND ao.amoprighttype = c.opcintype AND ao.amopstrategy = strategy
                        AND ao.amopmethod = c.opcmethod
      JOIN pg_operator AS o ON o.oid = ao.amopopr
      JOIN pg_namespace AS n ON n.oid = o.oprnamespace
     WHERE c.opcdefault AND am.amname = 'btree'
       AND (c.opcintype = v_base
            OR (v_kind = 'e' AND c.opcintype = 'anyenum'::regtype)
            OR (v_kind = 'r' AND c.opcintype = 'anyrange'::regtype)
            OR (v_kind = 'm' AND c.opcintype = 'anymultirange'::regtype)
            OR (v_kind = 'c' AND c.opcintype = 'record'::regtype)
            OR (v_elem <> 0 AND c.opcintype = 'anyarray'::regtype
                AND EXISTS (SELECT FROM pg_type AS ty WHERE ty.oid = v_base AND ty.typsubscript = 'array_subscript_handler'::regproc))
            OR EXISTS (SELECT FROM pg_cast AS k WHERE k.castsource = v_base AND k.casttarget = c.opcintype
                                                 AND k.castmethod = 'b'))
     ORDER BY c.opcintype = v_base DESC
     LIMIT 1;
    IF v_sql IS NULL THEN
        RAISE EXCEPTION 'type % has no % operator', format_type(typ, NULL),
                        CASE strategy WHEN 3 THEN 'equality' ELSE 'ordering' END
            USING ERRCODE = 'undefined_function';
    END IF;
    RETURN v_sql;
END
$fn$;
COMMENT ON FUNCTION idempotency._helper_operator(pg_catalog.oid, pg_catalog.int4) IS
'Portable edition, internal: a type''s default btree equality or ordering operator as SQL';

-- The id argument as a parameter of the id column's type: '$1' when it has
-- that type, else '$1::type' after checking that PostgreSQL's explicit cast
-- exists (42846) and is exact: converted back it is the same value (22P02);
-- a string is read by the column type's own input rules.  22004 when NULL.
CREATE FUNCTION idempotency._helper_id(id anyelement, coltype pg_catalog.oid, colname pg_catalog.text, path pg_catalog.text)
RETURNS pg_catalog.text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_argtype pg_catalog.oid := pg_typeof(id);
    v_type    pg_catalog.text := format_type(coltype, NULL);
    v_as      pg_catalog.text;
    v_exact   pg_catalog.bool;
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION 'id must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF v_argtype = coltype THEN
        RETURN '$1';
    END IF;
    BEGIN
        EXECUTE format('SELECT $1::%s::pg_catalog.text', v_type) INTO v_as USING id;
    EXCEPTION WHEN cannot_coerce THEN
        RAISE EXCEPTION 'cannot use an id of type % for column "%" of type %',
                        idempotency._helper_type_name(v_argtype, path), colname, idempotency._helper_type_name(coltype, path)
            USING ERRCODE = 'cannot_coerce';
    END;
    IF (SELECT ty.typcategory FROM pg_type AS ty WHERE ty.oid = idempotency._helper_base_type(v_argtype)) NOT IN ('S', 'X') THEN
        BEGIN
            EXECUTE format('SELECT $1::%s::%s %s $1', v_type, format_type(v_argtype, NULL),
                           idempotency._helper_operator(v_argtype, 3))
               INTO v_exact USING id;
        EXCEPTION WHEN cannot_coerce OR undefined_function THEN
            v_exact := true;    -- no way back, or no equality: as the C edition, unchecked
        END;
        IF NOT v_exact THEN
            RAISE EXCEPTION 'id % does not convert exactly to type % of column "%"', format('%s', id),
                            idempotency._helper_type_name(coltype, path), colname
                USING ERRCODE = 'invalid_text_representation',
                      DETAIL = format('As %s it would be %s, another value.', idempotency._helper_type_name(coltype, path), v_as);
        END IF;
    END IF;
    RETURN format('$1::%s', idempotency._helper_type_sql(coltype, -1));
END
$fn$;
COMMENT ON FUNCTION idempotency._helper_id(anyelement, pg_catalog.oid, pg_catalog.text, pg_catalog.text) IS
'Portable edition, internal: a write helper''s id argument as a parameter of the id column''s type, checked to convert exactly';

-- The value insert_once()'s INSERT gives a key column the row leaves out,
-- as SQL for the probe: its default expression (the column's, else its
-- domain's) or NULL; no SQL (NULL) when the probe cannot know it
-- (generated, or a default that calls a volatile function).
CREATE FUNCTION idempotency._helper_default_sql(target pg_catalog.regclass, col pg_catalog.int2, path pg_catalog.text)
RETURNS pg_catalog.text
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    a      record;
    v_tree pg_catalog.text;
    v_sql  pg_catalog.text;
BEGIN
    -- spelled for the caller's search_path, where the probe runs
    PERFORM set_config('search_path', path, true);
    SELECT at.attgenerated, at.atttypid, d.adbin::pg_catalog.text AS tree, pg_get_expr(d.adbin, d.adrelid) AS expr
      INTO a
      FROM pg_attribute AS at LEFT JOIN pg_attrdef AS d ON d.adrelid = at.attrelid AND d.adnum = at.attnum
     WHERE at.attrelid = target AND at.attnum = col;
    IF a.attgenerated <> '' THEN
        RETURN NULL;
    END IF;
    v_tree := a.tree;
    v_sql := a.expr;
    IF v_tree IS NULL THEN
        -- the domain's default, if any (the nearest domain that has one)
        WITH RECURSIVE d(oid, base, tree, lvl) AS (
            SELECT ty.oid, ty.typbasetype, ty.typdefaultbin, 0 FROM pg_type AS ty WHERE ty.oid = a.atttypid
            UNION ALL
            SELECT ty.oid, ty.typbasetype, ty.typdefaultbin, d.lvl + 1
              FROM d, pg_type AS ty WHERE ty.oid = d.base AND d.tree IS NULL
        )
        SELECT d.tree, pg_get_expr(d.tree, 0) INTO v_tree, v_sql FROM d WHERE d.tree IS NOT NULL ORDER BY d.lvl LIMIT 1;
    END IF;
    PERFORM set_config('search_path', 'pg_catalog, pg_temp', true);
    IF v_tree IS NULL THEN
        RETURN format('NULL::%s', idempotency._helper_type_sql(a.atttypid, -1));
    END IF;
    -- a function or operator of the expression that is volatile: unknowable
    IF EXISTS (SELECT FROM regexp_matches(v_tree, ':(?:funcid|opfuncid) (\d+)', 'g') AS m(f)
                 JOIN pg_proc AS p ON p.oid = m.f[1]::pg_catalog.oid
                WHERE p.provolatile = 'v')
       OR v_tree ~ '\{NEXTVALUEEXPR' THEN
        RETURN NULL;
    END IF;
    RETURN format('(%s)', v_sql);
END
$fn$;
COMMENT ON FUNCTION idempotency._helper_default_sql(pg_catalog.regclass, pg_catalog.int2, pg_catalog.text) IS
'Portable edition, internal: the default insert_once()''s INSERT gives a left-out key column, as SQL (NULL when it cannot be known)';

-- "no row with ... in table ..." (P0002)
CREATE FUNCTION idempotency._helper_no_row(colname pg_catalog.text, id pg_catalog.text, relname pg_catalog.text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RAISE EXCEPTION 'no row with % = % in table "%"', colname, id, relname USING ERRCODE = 'no_data_found';
END
$fn$;
COMMENT ON FUNCTION idempotency._helper_no_row(pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
'Portable edition, internal: the write helpers'' P0002 for an id that names no row';

-- The UPDATE changed nothing although the probe shows a row it should
-- have changed: row security hides it from UPDATE (42501), or a trigger or
-- rule skipped the UPDATE (09000); never IK005/IK006.
CREATE FUNCTION idempotency._helper_update_hidden(target pg_catalog.regclass, what pg_catalog.text,
                                                  colname pg_catalog.text, id pg_catalog.text, relname pg_catalog.text)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF row_security_active(target) THEN
        RAISE EXCEPTION '% cannot update row % = % in table "%": row-level security hides it from UPDATE',
                        what, colname, id, relname
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = format('Role %s may read the row, but no UPDATE policy of the table lets it change it; nothing was written.', current_user),
                  HINT = 'Grant the role an UPDATE policy that covers the row, or call the helper as a role that has one.';
    END IF;
    RAISE EXCEPTION '% cannot update row % = % in table "%": a trigger or rule skipped the UPDATE', what, colname, id, relname
        USING ERRCODE = 'triggered_action_exception',
              DETAIL = 'The row allows the change, but the UPDATE changed no row; nothing was written.';
END
$fn$;
COMMENT ON FUNCTION idempotency._helper_update_hidden(pg_catalog.regclass, pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
'Portable edition, internal: the write helpers'' error for a row their UPDATE could not see (42501 row security, 09000 a trigger or rule)';
-- @end
