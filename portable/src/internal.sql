-- portable/src/internal.sql: the portable edition's own functions (not part
-- of the contract; the C edition does these in C) and the commit check.
-- All of them are for the edition's own functions: REVOKEd from PUBLIC.

-- @tail
-- ---------------------------------------------------------------------
-- Whose key is this.  The public functions are SECURITY DEFINER (they
-- write tables no application role may write), so inside them
-- current_user is the installing role.  The caller is the role the
-- session acts as: the one SET ROLE chose (the "role" setting, which only
-- a member of that role can set), else the session user.  The C edition
-- takes current_user at the call; the two differ only when begin() is
-- called from inside another SECURITY DEFINER function, where the C edition
-- gives the key to that function's owner and this one to the session's
-- role.  The "role" setting holds the name SET ROLE was given, not the
-- role's oid: a role renamed after the session set it (and a new role
-- given its old name) would hand the session that new role's keys.  So
-- the role named must be one the session user is a member of (as SET
-- ROLE required when it was set), else 42501 (_stale_role()).
-- ---------------------------------------------------------------------
CREATE FUNCTION idempotency._stale_role()
RETURNS pg_catalog.regrole
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED
AS $fn$
BEGIN
    RAISE EXCEPTION 'role "%" set by SET ROLE is not a role session user "%" may act as',
                    pg_catalog.current_setting('role'), SESSION_USER
        USING ERRCODE = 'insufficient_privilege',
              DETAIL = 'The role was renamed or dropped after this session set it (its name may now belong to another role), or the session user is no longer a member of it.',
              HINT = 'SET ROLE again, or RESET ROLE.';
END
$fn$;
COMMENT ON FUNCTION idempotency._stale_role() IS
'Portable edition, internal: 42501 for a SET ROLE name that no longer names a role the session user belongs to';

-- The role SET ROLE chose, checked; a function of its own (not inlined
-- into _caller()) so that a session that never SETs ROLE, the common
-- case, pays for one comparison only.
CREATE FUNCTION idempotency._set_role()
RETURNS pg_catalog.regrole
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED
AS $fn$
DECLARE
    r pg_catalog.regrole := pg_catalog.to_regrole(pg_catalog.quote_ident(pg_catalog.current_setting('role')));
BEGIN
    -- (NULL: renamed or dropped, and no role took the name)
    IF r IS NOT NULL AND pg_catalog.pg_has_role(SESSION_USER, r::pg_catalog.oid, 'MEMBER') THEN
        RETURN r;
    END IF;
    RETURN idempotency._stale_role();
END
$fn$;
COMMENT ON FUNCTION idempotency._set_role() IS
'Portable edition, internal: the role SET ROLE chose, if the session user may still act as it (else 42501)';

CREATE FUNCTION idempotency._caller()
RETURNS pg_catalog.regrole
LANGUAGE sql STABLE PARALLEL RESTRICTED
AS $fn$
SELECT CASE WHEN pg_catalog.current_setting('role') OPERATOR(pg_catalog.=) 'none'
            THEN pg_catalog.quote_ident(SESSION_USER::pg_catalog.text)::pg_catalog.regrole
            ELSE idempotency._set_role() END
$fn$;
COMMENT ON FUNCTION idempotency._caller() IS
'Portable edition, internal: the role the session acts as (SET ROLE, else the session user): the owner of the keys it makes';

-- A setting of ours read as a number of milliseconds or seconds.  Without
-- the C library idempotency.* are placeholder settings: any role may SET
-- them, to any text, and nothing checks them at SET time; a bare number is
-- read in the setting's unit (as the C edition's GUC_UNIT_MS/_S), anything
-- else as an interval ('100ms', '2s', '1h'); a setting in seconds is
-- rounded to them and must be at least 1 s (22023).  Unset: the default.
CREATE FUNCTION idempotency._setting_ms(name pg_catalog.text, unit_ms pg_catalog.int8, dflt_ms pg_catalog.int8)
RETURNS pg_catalog.int8
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED
AS $fn$
DECLARE
    v pg_catalog.text := pg_catalog.btrim(pg_catalog.current_setting(name, true));
    ms pg_catalog.int8;
BEGIN
    IF v IS NULL OR v OPERATOR(pg_catalog.=) '' THEN
        RETURN dflt_ms;
    END IF;
    IF v OPERATOR(pg_catalog.~) '^[0-9]+$' THEN
        ms := v::pg_catalog.int8 OPERATOR(pg_catalog.*) unit_ms;
    ELSE
        ms := pg_catalog.round(EXTRACT(EPOCH FROM v::pg_catalog.interval) OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8;
    END IF;
    IF ms OPERATOR(pg_catalog.<) 0 THEN
        RAISE EXCEPTION '% must not be negative', name USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- a setting in seconds is a whole number of them, at least 1 (the C
    -- edition's range): a default_ttl of 0 would make every key expire as
    -- it is made, and a duplicate would do the work again
    IF unit_ms OPERATOR(pg_catalog.>=) 1000 THEN
        ms := pg_catalog.round(ms::pg_catalog.numeric OPERATOR(pg_catalog./) unit_ms)::pg_catalog.int8 OPERATOR(pg_catalog.*) unit_ms;
        IF ms OPERATOR(pg_catalog.<) unit_ms THEN
            RAISE EXCEPTION '% must be at least 1 s', name USING ERRCODE = 'invalid_parameter_value',
                DETAIL = pg_catalog.format('It is %s.', v);
        END IF;
    END IF;
    RETURN ms;
END
$fn$;
COMMENT ON FUNCTION idempotency._setting_ms(pg_catalog.text, pg_catalog.int8, pg_catalog.int8) IS
'Portable edition, internal: a placeholder setting idempotency.* in milliseconds (a bare number in unit_ms, else an interval)';

-- "idempotency key "k"" or "idempotency key "k" in scope "s"", each clipped
-- to 100 bytes at a character boundary, as the C edition names keys in
-- messages (error paths only)
CREATE FUNCTION idempotency._describe(key pg_catalog.text, scope pg_catalog.text)
RETURNS pg_catalog.text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $fn$
DECLARE
    k pg_catalog.text := key;
    s pg_catalog.text := scope;
BEGIN
    IF pg_catalog.octet_length(k) OPERATOR(pg_catalog.>) 100 THEN
        k := pg_catalog.left(k, 100);
        WHILE pg_catalog.octet_length(k) OPERATOR(pg_catalog.>) 100 LOOP
            k := pg_catalog.left(k, -1);
        END LOOP;
        k := k OPERATOR(pg_catalog.||) '...';
    END IF;
    IF pg_catalog.octet_length(s) OPERATOR(pg_catalog.>) 100 THEN
        s := pg_catalog.left(s, 100);
        WHILE pg_catalog.octet_length(s) OPERATOR(pg_catalog.>) 100 LOOP
            s := pg_catalog.left(s, -1);
        END LOOP;
        s := s OPERATOR(pg_catalog.||) '...';
    END IF;
    RETURN 'idempotency key "' OPERATOR(pg_catalog.||) k OPERATOR(pg_catalog.||) '"' OPERATOR(pg_catalog.||)
           CASE WHEN s OPERATOR(pg_catalog.=) '' THEN ''
                ELSE ' in scope "' OPERATOR(pg_catalog.||) s OPERATOR(pg_catalog.||) '"' END;
END
$fn$;
COMMENT ON FUNCTION idempotency._describe(pg_catalog.text, pg_catalog.text) IS
'Portable edition, internal: how messages name a key and its scope';

-- IK003: the key and scope a function was given (the C edition's checks,
-- in its order); what: how messages name the key ('message id' for
-- first_seen())
CREATE FUNCTION idempotency._check_key(key pg_catalog.text, scope pg_catalog.text,
                                       what pg_catalog.text DEFAULT 'idempotency key')
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED
AS $fn$
DECLARE
    maxlen pg_catalog.int4 := coalesce(NULLIF(pg_catalog.current_setting('idempotency.max_key_length', true), ''), '255')::pg_catalog.int4;
BEGIN
    -- the C edition's range, which its SET enforces
    IF maxlen NOT BETWEEN 1 AND 1024 THEN
        RAISE EXCEPTION '% is outside the valid range for parameter "idempotency.max_key_length" (1 .. 1024)', maxlen
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF key IS NULL THEN
        RAISE EXCEPTION '% must not be null', what USING ERRCODE = 'IK003';
    END IF;
    IF scope IS NULL THEN
        RAISE EXCEPTION 'idempotency scope must not be null' USING ERRCODE = 'IK003',
            HINT = 'Use '''' (the default) for no scope.';
    END IF;
    IF pg_catalog.length(scope) OPERATOR(pg_catalog.>) maxlen THEN
        RAISE EXCEPTION 'idempotency scope is too long' USING ERRCODE = 'IK003',
            DETAIL = pg_catalog.format('The idempotency scope has %s characters; idempotency.max_key_length allows %s.',
                                       pg_catalog.length(scope), maxlen);
    END IF;
    IF key OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION '% must not be empty', what USING ERRCODE = 'IK003';
    END IF;
    IF pg_catalog.length(key) OPERATOR(pg_catalog.>) maxlen THEN
        RAISE EXCEPTION '% is too long', what USING ERRCODE = 'IK003',
            DETAIL = pg_catalog.format('The %s has %s characters; idempotency.max_key_length allows %s.',
                                       what, pg_catalog.length(key), maxlen);
    END IF;
    IF pg_catalog.octet_length(key) OPERATOR(pg_catalog.+) pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 2048 THEN
        RAISE EXCEPTION '% is too long', what USING ERRCODE = 'IK003',
            DETAIL = pg_catalog.format('The %s and its scope take %s bytes together; at most 2048 are allowed.',
                                       what, pg_catalog.octet_length(key) OPERATOR(pg_catalog.+) pg_catalog.octet_length(scope));
    END IF;
END
$fn$;
COMMENT ON FUNCTION idempotency._check_key(pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
'Portable edition, internal: IK003 for a null, empty or too long key or scope';

-- 22004/22023: a name a function was given beside its key (derive_key()'s
-- step, checkpoint()'s recovery point): not null, not empty, at most
-- max_key_length characters; what: how messages name it
CREATE FUNCTION idempotency._check_name(name pg_catalog.text, what pg_catalog.text)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED
AS $fn$
DECLARE
    maxlen pg_catalog.int4;
BEGIN
    IF name IS NULL THEN
        RAISE EXCEPTION '% must not be null', what USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF name OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION '% must not be empty', what USING ERRCODE = 'invalid_parameter_value';
    END IF;
    maxlen := coalesce(NULLIF(pg_catalog.current_setting('idempotency.max_key_length', true), ''), '255')::pg_catalog.int4;
    IF maxlen NOT BETWEEN 1 AND 1024 THEN
        RAISE EXCEPTION '% is outside the valid range for parameter "idempotency.max_key_length" (1 .. 1024)', maxlen
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.length(name) OPERATOR(pg_catalog.>) maxlen THEN
        RAISE EXCEPTION '% is too long', what USING ERRCODE = 'invalid_parameter_value',
            DETAIL = pg_catalog.format('The %s has %s characters; idempotency.max_key_length allows %s.',
                                       what, pg_catalog.length(name), maxlen);
    END IF;
END
$fn$;
COMMENT ON FUNCTION idempotency._check_name(pg_catalog.text, pg_catalog.text) IS
'Portable edition, internal: 22004 or 22023 for a null, empty or too long step or recovery point';

-- Was this row version written by this transaction (or one of its
-- subtransactions that was not rolled back)?  A row version whose xmin is
-- still in progress and that this transaction can see is its own.  xmin is
-- a 32-bit xid; pg_xact_status() takes the 64-bit one: the epoch is taken
-- from the next xid, the nearest full xid to it is the one.
CREATE FUNCTION idempotency._mine(x pg_catalog.xid)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE PARALLEL RESTRICTED
AS $fn$
DECLARE
    c pg_catalog.int8 := pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::pg_catalog.text::pg_catalog.int8;
    lo pg_catalog.int8 := x::pg_catalog.text::pg_catalog.int8;
    f pg_catalog.int8;
BEGIN
    IF lo OPERATOR(pg_catalog.<) 3 THEN
        RETURN false;               -- frozen or bootstrap: committed long ago
    END IF;
    f := ((c OPERATOR(pg_catalog.>>) 32) OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) lo;
    IF c OPERATOR(pg_catalog.-) f OPERATOR(pg_catalog.>) 2147483648 THEN
        f := f OPERATOR(pg_catalog.+) 4294967296;
    ELSIF f OPERATOR(pg_catalog.-) c OPERATOR(pg_catalog.>) 2147483648 THEN
        f := f OPERATOR(pg_catalog.-) 4294967296;
    END IF;
    RETURN coalesce(pg_catalog.pg_xact_status(f::pg_catalog.text::pg_catalog.xid8) OPERATOR(pg_catalog.=) 'in progress', false);
END
$fn$;
COMMENT ON FUNCTION idempotency._mine(pg_catalog.xid) IS
'Portable edition, internal: whether a visible row version was written by this transaction';

-- fingerprint(): the C edition's canonical encoding, written from SQL so
-- that both editions store the same request_hash (a dump moves between
-- them): each token a one-byte tag and a 4-byte big-endian number (element
-- count, or byte length followed by the bytes); numbers without
-- insignificant zeroes; jsonb's own key order.
CREATE FUNCTION idempotency._fp_value(j pg_catalog.jsonb)
RETURNS pg_catalog.bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $fn$
DECLARE
    enc pg_catalog.name := pg_catalog.getdatabaseencoding();
    b pg_catalog.bytea;
    s pg_catalog.bytea;
    e record;
BEGIN
    CASE pg_catalog.jsonb_typeof(j)
    WHEN 'object' THEN
        b := '\x7b'::pg_catalog.bytea OPERATOR(pg_catalog.||)
             pg_catalog.int4send((SELECT pg_catalog.count(*)::pg_catalog.int4 FROM pg_catalog.jsonb_object_keys(j)));
        FOR e IN SELECT * FROM pg_catalog.jsonb_each(j) LOOP
            s := pg_catalog.convert_to(e.key, enc);
            b := b OPERATOR(pg_catalog.||) '\x6b'::pg_catalog.bytea OPERATOR(pg_catalog.||)
                 pg_catalog.int4send(pg_catalog.octet_length(s)) OPERATOR(pg_catalog.||) s
                 OPERATOR(pg_catalog.||) idempotency._fp_value(e.value);
        END LOOP;
        RETURN b OPERATOR(pg_catalog.||) '\x7d00000000'::pg_catalog.bytea;
    WHEN 'array' THEN
        b := '\x5b'::pg_catalog.bytea OPERATOR(pg_catalog.||) pg_catalog.int4send(pg_catalog.jsonb_array_length(j));
        FOR e IN SELECT a.value FROM pg_catalog.jsonb_array_elements(j) AS a LOOP
            b := b OPERATOR(pg_catalog.||) idempotency._fp_value(e.value);
        END LOOP;
        RETURN b OPERATOR(pg_catalog.||) '\x5d00000000'::pg_catalog.bytea;
    WHEN 'string' THEN
        s := pg_catalog.convert_to(j OPERATOR(pg_catalog.#>>) '{}'::pg_catalog.text[], enc);
        RETURN '\x73'::pg_catalog.bytea OPERATOR(pg_catalog.||) pg_catalog.int4send(pg_catalog.octet_length(s)) OPERATOR(pg_catalog.||) s;
    WHEN 'number' THEN
        s := pg_catalog.convert_to(pg_catalog.trim_scale(j::pg_catalog.numeric)::pg_catalog.text, enc);
        RETURN '\x6e'::pg_catalog.bytea OPERATOR(pg_catalog.||) pg_catalog.int4send(pg_catalog.octet_length(s)) OPERATOR(pg_catalog.||) s;
    WHEN 'boolean' THEN
        RETURN CASE WHEN j::pg_catalog.bool THEN '\x7400000000'::pg_catalog.bytea ELSE '\x6600000000'::pg_catalog.bytea END;
    ELSE
        RETURN '\x7a00000000'::pg_catalog.bytea;
    END CASE;
END
$fn$;
COMMENT ON FUNCTION idempotency._fp_value(pg_catalog.jsonb) IS
'Portable edition, internal: the canonical encoding of a jsonb value that fingerprint() hashes';

-- The same encoding without recursion, for deeply nested values: each
-- level of _fp_value() takes a PL/pgSQL call's stack, and a value nested a
-- few hundred levels deep (which jsonb accepts, and the C edition, walking
-- it with an iterator, hashes) would exceed max_stack_depth (54001).  The
-- value's text form (jsonb's own key order) is read token by token, once;
-- a container's element count, which its opening token holds, is filled in
-- when it closes.  fingerprint() takes this path for a large value.
CREATE FUNCTION idempotency._fp_flat(j pg_catalog.jsonb)
RETURNS pg_catalog.bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $fn$
DECLARE
    enc pg_catalog.name := pg_catalog.getdatabaseencoding();
    parts pg_catalog.bytea[] := '{}';
    opened pg_catalog.int4[] := '{}';   -- per open container: its opening token's index in parts
    counts pg_catalog.int4[] := '{}';   -- its elements (an array) or keys (an object) so far
    kinds pg_catalog.text[] := '{}';    -- '[' or '{'
    depth pg_catalog.int4 := 0;
    n pg_catalog.int4 := 0;
    m pg_catalog.text[];
    s pg_catalog.bytea;
BEGIN
    FOR m IN SELECT pg_catalog.regexp_matches(j::pg_catalog.text,
                        '("(?:[^"\\]|\\.)*")(:?)|(-?[0-9][-+.0-9eE]*|true|false|null|[][{}])', 'g') LOOP
        IF m[1] IS NOT NULL AND m[2] OPERATOR(pg_catalog.=) ':' THEN
            -- a key
            counts[depth] := counts[depth] OPERATOR(pg_catalog.+) 1;
            s := pg_catalog.convert_to(m[1]::pg_catalog.jsonb OPERATOR(pg_catalog.#>>) '{}'::pg_catalog.text[], enc);
            n := n OPERATOR(pg_catalog.+) 1;
            parts[n] := '\x6b'::pg_catalog.bytea OPERATOR(pg_catalog.||) pg_catalog.int4send(pg_catalog.octet_length(s)) OPERATOR(pg_catalog.||) s;
            CONTINUE;
        END IF;
        IF m[3] OPERATOR(pg_catalog.=) ANY ('{"]","}"}'::pg_catalog.text[]) THEN
            parts[opened[depth]] := parts[opened[depth]] OPERATOR(pg_catalog.||) pg_catalog.int4send(counts[depth]);
            n := n OPERATOR(pg_catalog.+) 1;
            parts[n] := CASE WHEN m[3] OPERATOR(pg_catalog.=) ']' THEN '\x5d00000000'::pg_catalog.bytea
                             ELSE '\x7d00000000'::pg_catalog.bytea END;
            depth := depth OPERATOR(pg_catalog.-) 1;
            CONTINUE;
        END IF;
        -- a value: an element of the array it is in
        IF depth OPERATOR(pg_catalog.>) 0 AND kinds[depth] OPERATOR(pg_catalog.=) '[' THEN
            counts[depth] := counts[depth] OPERATOR(pg_catalog.+) 1;
        END IF;
        n := n OPERATOR(pg_catalog.+) 1;
        IF m[1] IS NOT NULL THEN
            s := pg_catalog.convert_to(m[1]::pg_catalog.jsonb OPERATOR(pg_catalog.#>>) '{}'::pg_catalog.text[], enc);
            parts[n] := '\x73'::pg_catalog.bytea OPERATOR(pg_catalog.||) pg_catalog.int4send(pg_catalog.octet_length(s)) OPERATOR(pg_catalog.||) s;
        ELSIF m[3] OPERATOR(pg_catalog.=) ANY ('{"[","{"}'::pg_catalog.text[]) THEN
            parts[n] := CASE WHEN m[3] OPERATOR(pg_catalog.=) '[' THEN '\x5b'::pg_catalog.bytea ELSE '\x7b'::pg_catalog.bytea END;
            depth := depth OPERATOR(pg_catalog.+) 1;
            opened[depth] := n;
            counts[depth] := 0;
            kinds[depth] := m[3];
        ELSIF m[3] OPERATOR(pg_catalog.=) 'true' THEN
            parts[n] := '\x7400000000'::pg_catalog.bytea;
        ELSIF m[3] OPERATOR(pg_catalog.=) 'false' THEN
            parts[n] := '\x6600000000'::pg_catalog.bytea;
        ELSIF m[3] OPERATOR(pg_catalog.=) 'null' THEN
            parts[n] := '\x7a00000000'::pg_catalog.bytea;
        ELSE
            s := pg_catalog.convert_to(pg_catalog.trim_scale(m[3]::pg_catalog.numeric)::pg_catalog.text, enc);
            parts[n] := '\x6e'::pg_catalog.bytea OPERATOR(pg_catalog.||) pg_catalog.int4send(pg_catalog.octet_length(s)) OPERATOR(pg_catalog.||) s;
        END IF;
    END LOOP;
    RETURN (SELECT pg_catalog.string_agg(p.b, ''::pg_catalog.bytea ORDER BY p.i)
              FROM pg_catalog.unnest(parts) WITH ORDINALITY AS p (b, i));
END
$fn$;
COMMENT ON FUNCTION idempotency._fp_flat(pg_catalog.jsonb) IS
'Portable edition, internal: _fp_value() without recursion, for a deeply nested value';

-- ---------------------------------------------------------------------
-- The commit check.  begin() writes the key's in_progress row at once
-- (its unique index is what makes a duplicate wait); a deferred constraint
-- trigger on that write fires at COMMIT and at PREPARE TRANSACTION and
-- refuses (2D000) while the row is still in_progress: a business effect
-- never commits without its key.  A begin(), complete() or fail() undone
-- by a rolled-back savepoint is undone for this check too (its row
-- version and its trigger event go with the subtransaction).  Lease rows
-- (locked_until set) are meant to commit in progress and are not checked.
-- SECURITY DEFINER: reads the rows of the role that began the key, which
-- need not be the role that commits.
-- ---------------------------------------------------------------------
CREATE FUNCTION idempotency._commit_check()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    n pg_catalog.int4;
    lkey pg_catalog.text;
    lscope pg_catalog.text;
BEGIN
    PERFORM FROM idempotency.idempotency_key AS k
      WHERE k.key OPERATOR(pg_catalog.=) NEW.key AND k.scope OPERATOR(pg_catalog.=) NEW.scope
        AND k.owner OPERATOR(pg_catalog.=) NEW.owner
        AND k.status OPERATOR(pg_catalog.=) 'in_progress' AND k.locked_until IS NULL;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- the error path only: every unfinished key of this transaction (a
    -- scan of the table's in_progress rows), naming the one begun last
    SELECT pg_catalog.count(*) OVER (), k.key, k.scope INTO n, lkey, lscope
      FROM idempotency.idempotency_key AS k
     WHERE k.status OPERATOR(pg_catalog.=) 'in_progress' AND k.locked_until IS NULL
       AND idempotency._mine(k.xmin)
     ORDER BY k.xmin::pg_catalog.text::pg_catalog.int8 DESC, k.ctid DESC
     LIMIT 1;
    RAISE EXCEPTION 'cannot %: % was begun but neither completed nor failed',
          CASE WHEN pg_catalog.current_query() OPERATOR(pg_catalog.~*) '^\s*prepare\s+transaction'
               THEN 'prepare transaction' ELSE 'commit' END,
          idempotency._describe(lkey, lscope)
        USING ERRCODE = 'invalid_transaction_termination',
              DETAIL = CASE WHEN n OPERATOR(pg_catalog.=) 1
                            THEN '1 key begun in this transaction is unfinished, so the transaction was rolled back and nothing it wrote was stored.'
                            ELSE pg_catalog.format('%s keys begun in this transaction are unfinished, so the transaction was rolled back and nothing it wrote was stored.', n) END,
              HINT = 'Call idempotency.complete() or idempotency.fail() for every key that begin() returned as new or retry before COMMIT.';
END
$fn$;
COMMENT ON FUNCTION idempotency._commit_check() IS
'Portable edition, internal: deferred trigger that refuses COMMIT and PREPARE TRANSACTION while a key begun in the transaction is unfinished (2D000)';
CREATE CONSTRAINT TRIGGER idempotency_key_commit_check
    AFTER INSERT OR UPDATE ON idempotency.idempotency_key
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.status OPERATOR(pg_catalog.=) 'in_progress' AND NEW.locked_until IS NULL)
    EXECUTE FUNCTION idempotency._commit_check();

REVOKE ALL ON FUNCTION idempotency._caller(), idempotency._set_role(), idempotency._stale_role(), idempotency._setting_ms(pg_catalog.text, pg_catalog.int8, pg_catalog.int8),
    idempotency._describe(pg_catalog.text, pg_catalog.text), idempotency._check_key(pg_catalog.text, pg_catalog.text, pg_catalog.text),
    idempotency._check_name(pg_catalog.text, pg_catalog.text), idempotency._mine(pg_catalog.xid), idempotency._commit_check() FROM PUBLIC;
-- @end
