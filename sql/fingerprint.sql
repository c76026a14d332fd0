-- fingerprint: equal jsonb values give equal fingerprints, different values
-- different ones; sha256, 32 bytes.
SELECT octet_length(idempotency.fingerprint('{}')) AS bytes;
SELECT idempotency.fingerprint(NULL) IS NULL AS strict;

-- the encoding is part of the stored data: these values must never change
SELECT v, encode(idempotency.fingerprint(v::jsonb), 'hex')
  FROM (VALUES ('{}'), ('[]'), ('null'), ('1'), ('{"a": 1}'), ('[1, "1", true, null]')) AS t(v);

-- equal under jsonb "=": key order, whitespace, scale of numbers, exponents,
-- duplicate keys (the last wins)
SELECT a, b, a::jsonb = b::jsonb AS jsonb_equal,
       idempotency.fingerprint(a::jsonb) = idempotency.fingerprint(b::jsonb) AS same_fingerprint
  FROM (VALUES
    ('{"a":1.0}', '{"a":1}'),
    ('{"a":1,"b":2}', '{ "b" : 2 , "a" : 1 }'),
    ('100', '1e2'),
    ('0.50', '0.5'),
    ('-0.0', '0'),
    ('{"a":1,"a":2}', '{"a":2}'),
    ('{"x":[1,{"y":2.000}]}', '{"x":[1.0,{"y":2}]}'),
    -- and different values
    ('[1,2]', '[2,1]'),
    ('1', '"1"'),
    ('1', '[1]'),
    ('[]', '{}'),
    ('null', '"null"'),
    ('true', '"true"'),
    ('{"a":"bc"}', '{"ab":"c"}'),
    ('["a","bc"]', '["ab","c"]'),
    ('[[1],2]', '[[1,2]]'),
    ('{"a":{}}', '{"a":[]}'),
    ('0.1', '0.10000000000000000001'),
    ('""', 'null')
  ) AS t(a, b);

-- property check over many generated values: for every pair,
-- a = b exactly when their fingerprints are equal.  The set keeps equal
-- values written differently (1.50 and 1.5, key order), which is the point.
CREATE TEMP TABLE val AS
SELECT v
  FROM (
    SELECT to_jsonb(i / 4.0) AS v FROM generate_series(0, 40) i
    UNION ALL SELECT to_jsonb(round(i / 4.0, 3)) FROM generate_series(0, 40) i
    UNION ALL SELECT to_jsonb(i::text) FROM generate_series(0, 20) i
    UNION ALL SELECT jsonb_build_object('k', i % 5, 'v', (i % 3) * 1.50) FROM generate_series(0, 30) i
    UNION ALL SELECT jsonb_build_object('v', (i % 3) * 1.5, 'k', i % 5) FROM generate_series(0, 30) i
    UNION ALL SELECT jsonb_build_array(i % 3, (i % 2)::boolean, NULL) FROM generate_series(0, 12) i
    UNION ALL SELECT jsonb_build_array(jsonb_build_array(i % 3), i % 2) FROM generate_series(0, 12) i
  ) s;
SELECT count(*) AS pairs_checked,
       count(*) FILTER (WHERE a.v = b.v AND a.v::text <> b.v::text) > 100
         AS has_equal_but_differently_written,
       count(*) FILTER (WHERE a.v <> b.v) > 1000 AS has_different,
       count(*) FILTER (WHERE (a.v = b.v) <> (idempotency.fingerprint(a.v) = idempotency.fingerprint(b.v))) AS mismatches
  FROM val a, val b;

-- large values stream through
SELECT octet_length(idempotency.fingerprint(jsonb_agg(i))) FROM generate_series(1, 100000) i;
