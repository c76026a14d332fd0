-- portable/src/derive.sql: derive_key() and the per-key seed it derives
-- from, as the C edition computes them (src/recovery.c), so a derived key
-- is the same in both editions and after a dump and restore between them.
--
-- derive_key(key, step, scope) = "idk_" + base32 (lowercase, no padding)
-- of the first 128 bits of HMAC-SHA256(secret, fields), each field a
-- 4-byte big-endian length and its bytes:
--   seed version 2 or 1: "idempotency.derive_key v2", the seed without its
--       version byte, created_at (timestamptz_send(): microseconds since
--       2000-01-01, big-endian), scope, key, step;
--   seed version 0 in the life it was frozen in (its bytes 2-9 are the
--       row's created_at): "idempotency.derive_key v1", the role name the
--       seed holds, scope, key, step (0.5.0's derivation);
--   no seed (a row restored from a dump of 0.5.0): as version 0 with the
--       role's name now.
-- The secret is the row of idempotency.derive_secret the seed's tag names
-- (the first 8 bytes of its SHA-256), the oldest for version 1, the oldest
-- restored from 0.5.0 for no seed.  HMAC is built on core sha256():
-- sha256((K xor opad) || sha256((K xor ipad) || message)).
--
-- begin() draws a seed (_new_seed()) for a new row and for new work over
-- an expired row; every other write keeps it, and freezes one for a row
-- that has none (_frozen_seed(), as the C edition's writes do).

-- @body idempotency_derive_key
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_key   ALIAS FOR $1;
    p_step  ALIAS FOR $2;
    p_scope ALIAS FOR $3;
    v_owner pg_catalog.regrole;
    v_seed  pg_catalog.bytea;
    v_at    pg_catalog.timestamptz;
    v_secret pg_catalog.bytea;
    v_msg   pg_catalog.bytea;
    v_mac   pg_catalog.bytea;
    v_bits  pg_catalog.varbit;
    v_out   pg_catalog.text := 'idk_';
    v_enc   pg_catalog.name := pg_catalog.getdatabaseencoding();
    v_name  pg_catalog.bytea;
BEGIN
    PERFORM idempotency._check_key(p_key, p_scope);
    v_owner := idempotency._caller();
    -- the step: not null (22004), not empty, at most max_key_length
    -- characters (22023)
    PERFORM idempotency._check_name(p_step, 'step');

    SELECT k.derive_seed, k.created_at INTO v_seed, v_at
      FROM idempotency.idempotency_key AS k
     WHERE k.key = p_key AND k.scope = p_scope AND k.owner = v_owner
       AND k.expires_at > pg_catalog.now();
    IF NOT FOUND THEN
        RAISE EXCEPTION '% has no stored row to derive from', idempotency._describe(p_key, p_scope)
            USING ERRCODE = 'IK004',
                  DETAIL = 'derive_key() derives from the key''s own row: a key begun with a lease has one from begin(); a single-transaction key has none before complete() or fail(), and an expired or unknown key none at all.',
                  HINT = 'Begin the key with lease => an interval before calling another system with a derived key.';
    END IF;
    IF v_at = pg_catalog.now() THEN
        -- the row's life began in this transaction: if it rolled back, the
        -- retry would draw another seed and derive another key
        RAISE EXCEPTION '% was begun in this transaction', idempotency._describe(p_key, p_scope)
            USING ERRCODE = 'IK004',
                  DETAIL = 'derive_key() derives from the key''s committed row: if this transaction rolled back, a retry would begin the key anew and derive another key.',
                  HINT = 'Commit the begin() first: begin the key with lease => an interval in its own transaction, then derive.';
    END IF;
    IF v_seed IS NOT NULL AND (pg_catalog.length(v_seed) < 1 OR pg_catalog.get_byte(v_seed, 0) > 2
        OR (pg_catalog.get_byte(v_seed, 0) = 0 AND pg_catalog.length(v_seed) < 17)
        OR (pg_catalog.get_byte(v_seed, 0) = 2 AND pg_catalog.length(v_seed) < 9)) THEN
        RAISE EXCEPTION '% has a derive seed of unknown version', idempotency._describe(p_key, p_scope)
            USING ERRCODE = 'data_corrupted',
                  DETAIL = pg_catalog.format('derive_seed must start with byte 0, 1 or 2; it has %s bytes.', pg_catalog.length(v_seed));
    END IF;

    IF v_seed IS NULL THEN
        v_secret := idempotency._derive_secret(NULL, true, p_key, p_scope);
        v_name := pg_catalog.convert_to(pg_catalog.pg_get_userbyid(v_owner::pg_catalog.oid)::pg_catalog.text, v_enc);
        v_msg := idempotency._mac_field('idempotency.derive_key v1'::pg_catalog.bytea)
                 || idempotency._mac_field(v_name);
    ELSIF pg_catalog.get_byte(v_seed, 0) = 0 THEN
        v_secret := idempotency._derive_secret(pg_catalog.substr(v_seed, 10, 8), false, p_key, p_scope);
        IF pg_catalog.substr(v_seed, 2, 8) = pg_catalog.timestamptz_send(v_at) THEN
            v_msg := idempotency._mac_field('idempotency.derive_key v1'::pg_catalog.bytea)
                     || idempotency._mac_field(pg_catalog.substr(v_seed, 18));
        END IF;
    ELSIF pg_catalog.get_byte(v_seed, 0) = 2 THEN
        v_secret := idempotency._derive_secret(pg_catalog.substr(v_seed, 2, 8), false, p_key, p_scope);
    ELSE
        v_secret := idempotency._derive_secret(NULL, false, p_key, p_scope);
    END IF;
    IF v_msg IS NULL THEN
        v_msg := idempotency._mac_field('idempotency.derive_key v2'::pg_catalog.bytea)
                 || idempotency._mac_field(pg_catalog.substr(v_seed, 2))
                 || idempotency._mac_field(pg_catalog.timestamptz_send(v_at));
    END IF;
    v_msg := v_msg || idempotency._mac_field(pg_catalog.convert_to(p_scope, v_enc))
                   || idempotency._mac_field(pg_catalog.convert_to(p_key, v_enc))
                   || idempotency._mac_field(pg_catalog.convert_to(p_step, v_enc));
    v_mac := idempotency._hmac_sha256(v_secret, v_msg);

    -- base32 of the first 128 bits (26 characters, the last padded with 0 bits)
    v_bits := ('x' || pg_catalog.encode(pg_catalog.substr(v_mac, 1, 16), 'hex'))::pg_catalog.bit(128)::pg_catalog.varbit
              || B'00';
    FOR i IN 0 .. 25 LOOP
        v_out := v_out || pg_catalog.substr('abcdefghijklmnopqrstuvwxyz234567',
                                            pg_catalog.substring(v_bits, i * 5 + 1, 5)::pg_catalog.bit(5)::pg_catalog.int4 + 1, 1);
    END LOOP;
    RETURN v_out;
END
$fn$
-- @end

-- @tail
-- one field of derive_key()'s message: 4-byte big-endian length, bytes
CREATE FUNCTION idempotency._mac_field(b pg_catalog.bytea)
RETURNS pg_catalog.bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $fn$
SELECT pg_catalog.int4send(pg_catalog.length(b)) OPERATOR(pg_catalog.||) b
$fn$;
COMMENT ON FUNCTION idempotency._mac_field(pg_catalog.bytea) IS
'Portable edition, internal: a length-prefixed field of derive_key()''s message';

-- HMAC-SHA256 (RFC 2104) on core sha256(): a key longer than the 64-byte
-- block is hashed first, a shorter one padded with zero bytes
CREATE FUNCTION idempotency._hmac_sha256(k pg_catalog.bytea, m pg_catalog.bytea)
RETURNS pg_catalog.bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $fn$
DECLARE
    kb pg_catalog.bytea := k;
    ipad pg_catalog.bytea;
    opad pg_catalog.bytea;
BEGIN
    IF pg_catalog.length(kb) OPERATOR(pg_catalog.>) 64 THEN
        kb := pg_catalog.sha256(kb);
    END IF;
    kb := kb OPERATOR(pg_catalog.||) pg_catalog.decode(pg_catalog.repeat('00', 64 OPERATOR(pg_catalog.-) pg_catalog.length(kb)), 'hex');
    ipad := kb;
    opad := kb;
    FOR i IN 0 .. 63 LOOP
        ipad := pg_catalog.set_byte(ipad, i, pg_catalog.get_byte(kb, i) OPERATOR(pg_catalog.#) 54);   -- 0x36
        opad := pg_catalog.set_byte(opad, i, pg_catalog.get_byte(kb, i) OPERATOR(pg_catalog.#) 92);   -- 0x5c
    END LOOP;
    RETURN pg_catalog.sha256(opad OPERATOR(pg_catalog.||) pg_catalog.sha256(ipad OPERATOR(pg_catalog.||) m));
END
$fn$;
COMMENT ON FUNCTION idempotency._hmac_sha256(pg_catalog.bytea, pg_catalog.bytea) IS
'Portable edition, internal: HMAC-SHA256 built on core sha256()';

-- the derive secret a key derives with: the one tag names, else (restored)
-- the oldest restored from a dump of 0.5.0, else the oldest; 55000 when
-- there is none (as the installing role: SECURITY DEFINER callers only)
CREATE FUNCTION idempotency._derive_secret(tag pg_catalog.bytea, restored pg_catalog.bool,
                                           key pg_catalog.text, scope pg_catalog.text)
RETURNS pg_catalog.bytea
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED
AS $fn$
DECLARE
    s pg_catalog.bytea;
BEGIN
    IF tag IS NOT NULL THEN
        SELECT d.secret INTO s FROM idempotency.derive_secret AS d
         WHERE pg_catalog.substr(pg_catalog.sha256(d.secret), 1, 8) OPERATOR(pg_catalog.=) tag
         ORDER BY d.created_at, d.secret LIMIT 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the derive secret of % is not in table idempotency.derive_secret', idempotency._describe(key, scope)
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'The key''s derive_seed names the secret it derives with; no row of the table is that secret.',
                      HINT = 'Restore the row from a dump of the database the key came from; another secret would change its derived keys (see docs/reference.md, "derive_key()").';
        END IF;
    ELSIF restored THEN
        SELECT d.secret INTO s FROM idempotency.derive_secret AS d
         WHERE d.restored_050 ORDER BY d.created_at, d.secret LIMIT 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'table idempotency.derive_secret has no secret restored from 0.5.0'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = pg_catalog.format('%s was restored from a dump of 0.5.0 (it has no derive_seed); it derives with the secret restored from that dump.',
                                                 idempotency._describe(key, scope)),
                      HINT = 'Restore the dump''s rows of idempotency.derive_secret too; another secret would change its derived keys (see docs/reference.md, "derive_key()").';
        END IF;
    ELSE
        SELECT d.secret INTO s FROM idempotency.derive_secret AS d
         ORDER BY d.created_at, d.secret LIMIT 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'table idempotency.derive_secret is empty'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'derive_key() needs the secret the extension''s install script creates.',
                      HINT = 'Restore the row from a dump of this database; a new secret changes every derived key (see docs/reference.md, "derive_key()").';
        END IF;
    END IF;
    IF s IS NULL OR pg_catalog.length(s) OPERATOR(pg_catalog.<>) 32 THEN
        RAISE EXCEPTION 'table idempotency.derive_secret holds no usable secret'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'The secret must be 32 bytes.';
    END IF;
    RETURN s;
END
$fn$;
COMMENT ON FUNCTION idempotency._derive_secret(pg_catalog.bytea, pg_catalog.bool, pg_catalog.text, pg_catalog.text) IS
'Portable edition, internal: the secret of idempotency.derive_secret a key derives with (55000 if there is none)';

-- a new row's seed: version 2, the tag of the oldest derive secret, 16
-- random bytes (version 1 without the tag when the table is empty).
-- PL/pgSQL, not SQL: begin() calls it inside its INSERT, where a SQL
-- function is parsed and planned again at every execution; PL/pgSQL keeps
-- its plan for the session.
CREATE FUNCTION idempotency._new_seed()
RETURNS pg_catalog.bytea
LANGUAGE plpgsql VOLATILE PARALLEL RESTRICTED
AS $fn$
BEGIN
RETURN coalesce((SELECT '\x02'::pg_catalog.bytea OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.sha256(d.secret), 1, 8)
                   FROM idempotency.derive_secret AS d ORDER BY d.created_at, d.secret LIMIT 1),
                '\x01'::pg_catalog.bytea)
       OPERATOR(pg_catalog.||)
       pg_catalog.substr(pg_catalog.sha256(pg_catalog.uuid_send(pg_catalog.gen_random_uuid())
                                           OPERATOR(pg_catalog.||) pg_catalog.uuid_send(pg_catalog.gen_random_uuid())), 1, 16);
END
$fn$;
COMMENT ON FUNCTION idempotency._new_seed() IS
'Portable edition, internal: derive_key()''s seed for a new key row';

-- the seed a write freezes for a row that has none (restored from a dump
-- of 0.5.0): version 0, the row's created_at, the tag of the oldest secret
-- restored from 0.5.0, the role's name; NULL without such a secret
CREATE FUNCTION idempotency._frozen_seed(owner pg_catalog.regrole, created_at pg_catalog.timestamptz)
RETURNS pg_catalog.bytea
LANGUAGE sql STABLE PARALLEL RESTRICTED
AS $fn$
SELECT '\x00'::pg_catalog.bytea OPERATOR(pg_catalog.||) pg_catalog.timestamptz_send(created_at)
       OPERATOR(pg_catalog.||) (SELECT pg_catalog.substr(pg_catalog.sha256(s.secret), 1, 8)
                                  FROM idempotency.derive_secret AS s WHERE s.restored_050
                                 ORDER BY s.created_at, s.secret LIMIT 1)
       OPERATOR(pg_catalog.||) pg_catalog.convert_to((SELECT r.rolname::pg_catalog.text FROM pg_catalog.pg_roles AS r
                                                      WHERE r.oid OPERATOR(pg_catalog.=) owner::pg_catalog.oid),
                                                     pg_catalog.getdatabaseencoding())
$fn$;
COMMENT ON FUNCTION idempotency._frozen_seed(pg_catalog.regrole, pg_catalog.timestamptz) IS
'Portable edition, internal: the version 0 seed a write freezes for a key row restored from a dump of 0.5.0';

REVOKE ALL ON FUNCTION idempotency._mac_field(pg_catalog.bytea),
    idempotency._hmac_sha256(pg_catalog.bytea, pg_catalog.bytea),
    idempotency._derive_secret(pg_catalog.bytea, pg_catalog.bool, pg_catalog.text, pg_catalog.text),
    idempotency._new_seed(), idempotency._frozen_seed(pg_catalog.regrole, pg_catalog.timestamptz) FROM PUBLIC;
-- @end
