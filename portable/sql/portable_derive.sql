-- portable_derive: derive_key() in the portable edition.  Byte for byte the
-- C edition's: the fixed rows below (every seed version, a secret, a
-- created_at) give the keys the C edition gives for the same rows, so a
-- derived key survives a dump and restore between the editions.  Then the
-- contract: stable, per step, scope, key and role; each error path with its
-- SQLSTATE; a refused call writes nothing.
\set VERBOSITY terse

-- HMAC-SHA256 itself: RFC 4231, test cases 1, 2 and 6
SELECT idempotency._hmac_sha256('\x0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b', 'Hi There')
       = '\xb0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7' AS rfc4231_1,
       idempotency._hmac_sha256('Jefe', 'what do ya want for nothing?')
       = '\x5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843' AS rfc4231_2,
       idempotency._hmac_sha256(decode(repeat('aa', 131), 'hex'), 'Test Using Larger Than Block-Size Key - Hash Key First')
       = '\x60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54' AS rfc4231_6;

-- the C edition's keys for fixed rows (every seed version; computed by
-- the C edition from the same rows)
CREATE TEMP TABLE saved_secret AS SELECT * FROM idempotency.derive_secret;
DELETE FROM idempotency.derive_secret;
INSERT INTO idempotency.derive_secret (secret, created_at, restored_050)
VALUES (sha256('portable-derive-secret'), '2025-06-01 00:00:00+00', false),
       (sha256('restored-050-secret'), '2025-07-01 00:00:00+00', true);
INSERT INTO idempotency.idempotency_key (owner, scope, key, status, attempts, created_at, updated_at, expires_at, locked_until, derive_seed)
SELECT 'regress_alice', 'tenant é', k, 'completed', 1, '2026-01-02 03:04:05.123456+00', now(), 'infinity', NULL,
       CASE k WHEN 'v2' THEN '\x02'::bytea || substr(sha256(sha256('portable-derive-secret')), 1, 8) || '\x00112233445566778899aabbccddeeff'::bytea
              WHEN 'v1' THEN '\x01'::bytea || '\x00112233445566778899aabbccddeeff'::bytea
              WHEN 'v0' THEN '\x00'::bytea || timestamptz_send('2026-01-02 03:04:05.123456+00') || substr(sha256(sha256('restored-050-secret')), 1, 8) || convert_to('regress_alice', 'UTF8')
              WHEN 'v0-new-life' THEN '\x00'::bytea || timestamptz_send('2025-01-02 03:04:05+00') || substr(sha256(sha256('restored-050-secret')), 1, 8) || convert_to('regress_alice', 'UTF8')
              ELSE NULL END
  FROM unnest(ARRAY['v2', 'v1', 'v0', 'v0-new-life', 'none']) AS k;
CREATE TEMP TABLE c_edition (key text, derived text, derived2 text);
INSERT INTO c_edition VALUES
  ('v2',          'idk_e3wrvwuj6kr6zx47wxqkkke7fi', 'idk_qlylwphf3p2mvlrx6k5jefcw4u'),
  ('v1',          'idk_5nhgmab3cs55onuhpqt6flfzty', 'idk_nc2skwsdx3bnqnlftyaxannwf4'),
  ('v0',          'idk_lsdm4u4k6tuydliyj5haexhngm', 'idk_no47k3j74llcun2367ixn2ruzq'),
  ('v0-new-life', 'idk_jbk77gihue7evummnadhzuowai', 'idk_r4czh7mqb6bc4tzexww65hi5bu'),
  ('none',        'idk_jojbupsudhs2fzyx3vwjmoc6da', 'idk_aj743xljxpsyydj6eugrhffhmm');
GRANT SELECT ON c_edition TO PUBLIC;
SET ROLE regress_alice;
SELECT c.key, idempotency.derive_key(c.key, 'charge', 'tenant é') = c.derived AS same_as_c,
       idempotency.derive_key(c.key, 'refund ü', 'tenant é') = c.derived2 AS same_as_c_2
  FROM c_edition AS c ORDER BY c.key;
RESET ROLE;
-- a seed of an unknown version: XX001; a secret the seed names missing: 55000
UPDATE idempotency.idempotency_key SET derive_seed = '\x03' WHERE key = 'v1' AND scope = 'tenant é';
DELETE FROM idempotency.derive_secret WHERE restored_050;
SET ROLE regress_alice;
SELECT idempotency.derive_key('v1', 'charge', 'tenant é');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.derive_key('v0', 'charge', 'tenant é');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.derive_key('none', 'charge', 'tenant é');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DELETE FROM idempotency.idempotency_key WHERE scope = 'tenant é';
DELETE FROM idempotency.derive_secret;
INSERT INTO idempotency.derive_secret SELECT * FROM saved_secret;

-- every new row has its own seed: version 2, the tag of its secret
SET ROLE regress_alice;
SELECT outcome FROM idempotency.begin('pay-1', lease => '1 hour');
SELECT outcome FROM idempotency.begin('pay-2', lease => '1 hour');
SELECT outcome FROM idempotency.begin('pay-1', lease => '1 hour', scope => 'tenant-2');
SELECT outcome FROM idempotency.begin('ab', lease => '1 hour');
SELECT outcome FROM idempotency.begin('a', lease => '1 hour');
RESET ROLE;
SELECT count(*) AS rows, count(DISTINCT k.derive_seed) AS seeds,
       bool_and(get_byte(k.derive_seed, 0) = 2 AND length(k.derive_seed) = 25) AS version_2,
       bool_and(substr(k.derive_seed, 2, 8) = substr(sha256(s.secret), 1, 8)) AS names_its_secret
  FROM idempotency.idempotency_key AS k, idempotency.derive_secret AS s
 WHERE k.owner = 'regress_alice'::regrole;
SET ROLE regress_alice;
SELECT idempotency.derive_key('pay-1', 'charge') AS charge_key \gset
SELECT :'charge_key' ~ '^idk_[a-z2-7]{26}$' AS shape, length(:'charge_key') AS length;
SELECT idempotency.derive_key('pay-1', 'charge') = :'charge_key' AS stable,
       idempotency.derive_key('pay-1', 'refund') <> :'charge_key' AS per_step,
       idempotency.derive_key('pay-1', 'charge', 'tenant-2') <> :'charge_key' AS per_scope,
       idempotency.derive_key('pay-2', 'charge') <> :'charge_key' AS per_key,
       idempotency.derive_key('pay-1', 'charge', '') = :'charge_key' AS default_scope;
-- no ambiguity between fields: ('ab', 'c') is not ('a', 'bc')
SELECT idempotency.derive_key('ab', 'c') <> idempotency.derive_key('a', 'bc') AS framed;
-- a renewal, a lapsed lease taken over and the completion keep the key
SELECT idempotency.renew('pay-1', '2 hours', 1) IS NOT NULL AS renewed;
SELECT idempotency.derive_key('pay-1', 'charge') = :'charge_key' AS same_after_renew;
RESET ROLE;
UPDATE idempotency.idempotency_key SET locked_until = now() - interval '1 s' WHERE key = 'pay-1' AND scope = '';
SET ROLE regress_alice;
SELECT outcome, attempts FROM idempotency.begin('pay-1', lease => '1 hour');
SELECT idempotency.derive_key('pay-1', 'charge') = :'charge_key' AS same_after_takeover;
SELECT idempotency.complete('pay-1', '"done"', attempt => 2);
SELECT idempotency.derive_key('pay-1', 'charge') = :'charge_key' AS same_after_complete;
-- per role: bob's 'pay-1' is not alice's, and bob cannot read the secret
SET ROLE regress_bob;
SELECT idempotency.derive_key('pay-1', 'charge');
\echo :LAST_ERROR_SQLSTATE
SELECT outcome FROM idempotency.begin('pay-1', lease => '1 hour');
SELECT idempotency.derive_key('pay-1', 'charge') <> :'charge_key' AS per_role;
SELECT * FROM idempotency.derive_secret;
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency._hmac_sha256('k', 'm');
\echo :LAST_ERROR_SQLSTATE
SET ROLE regress_alice;
-- a key begun in this transaction (single-transaction or lease) derives
-- nothing yet: IK004; once committed it does
BEGIN;
SELECT outcome FROM idempotency.begin('single-1');
SELECT idempotency.derive_key('single-1', 'x');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN;
SELECT outcome FROM idempotency.begin('lease-rb', lease => '1 hour');
SELECT idempotency.derive_key('lease-rb', 'charge');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- new work over an expired row starts a new life: a new derived key
SELECT outcome FROM idempotency.begin('life', lease => '1 hour', ttl => '1 hour');
SELECT idempotency.derive_key('life', 'x') AS first_life \gset
RESET ROLE;
UPDATE idempotency.idempotency_key SET expires_at = now() - interval '1 s', locked_until = NULL, status = 'completed'
 WHERE key = 'life';
SET ROLE regress_alice;
SELECT outcome, attempts FROM idempotency.begin('life', lease => '1 hour');
SELECT idempotency.derive_key('life', 'x') <> :'first_life' AS new_life_new_key;
-- errors: IK003 for the key and scope, 22004 and 22023 for the step,
-- IK004 for an unknown key; none writes anything
RESET ROLE;
SELECT md5(string_agg(k::text, ',' ORDER BY k.key, k.scope, k.owner)) AS before FROM idempotency.idempotency_key AS k \gset
SET ROLE regress_alice;
SELECT idempotency.derive_key(NULL, 'charge');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.derive_key('pay-1', 'charge', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.derive_key('', 'charge');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.derive_key('pay-1', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.derive_key('pay-1', '');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.derive_key('pay-1', repeat('s', 256));
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.derive_key('unknown', 'charge');
\echo :LAST_ERROR_SQLSTATE
-- the secret table emptied: 55000
RESET ROLE;
DELETE FROM idempotency.derive_secret;
SET ROLE regress_alice;
SELECT idempotency.derive_key('pay-2', 'charge');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
INSERT INTO idempotency.derive_secret SELECT * FROM saved_secret;
SELECT md5(string_agg(k::text, ',' ORDER BY k.key, k.scope, k.owner)) = :'before' AS nothing_written
  FROM idempotency.idempotency_key AS k;
DELETE FROM idempotency.idempotency_key;
