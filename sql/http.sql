-- http: replays an HTTP API can return byte for byte.  jsonb reorders the
-- keys of a JSON object, so the body is stored as a JSON string, exactly.
\set VERBOSITY default
SELECT idempotency.http_response(201, '{"id": 7}',
  '{"Content-Type": "application/json", "Location": "/payments/7"}');
SELECT idempotency.http_response(204, NULL);
SELECT idempotency.http_response(200, 'ok', NULL);
-- a binary body: "body" when it is valid text without NUL, else base64
SELECT idempotency.http_response(200, '\x00ff'::bytea);
SELECT idempotency.http_response(200, convert_to('héllo', 'UTF8'));
SELECT decode(idempotency.http_response(200, '\xdeadbeef00'::bytea) ->> 'body_base64', 'base64')
       = '\xdeadbeef00'::bytea AS base64_round_trip;

-- byte for byte through once(): key order, whitespace, escapes, non-ASCII
SELECT E'{"zeta": 1,  "alpha" : [1.50, 2e3, -0.0],\n\t"text": "caf\\u00e9 \\"quoted\\" \\\\ é 😀",\r\n "dup": 1, "dup": 2}  '
       AS body \gset
SELECT outcome FROM idempotency.once('http-1', '{"order": 1}',
  'SELECT idempotency.http_response(201, $1, $2::jsonb) AS r',
  :'body', '{"Content-Type": "application/json; charset=utf-8", "Location": "/orders/1"}');
SELECT outcome, response ->> 'status' AS status, response -> 'headers' AS headers,
       response ->> 'body' = :'body' AS body_equal,
       convert_to(response ->> 'body', 'UTF8') = convert_to(:'body', 'UTF8') AS bytes_equal,
       md5(response ->> 'body') = md5(:'body') AS md5_equal,
       octet_length(response ->> 'body') AS octets
  FROM idempotency.once('http-1', '{"order": 1}',
  'SELECT idempotency.http_response(201, $1, $2::jsonb) AS r',
  :'body', '{"Content-Type": "application/json; charset=utf-8", "Location": "/orders/1"}');
-- the check can fail: the same text as jsonb does not come back the same
SELECT (:'body')::jsonb::text = :'body' AS jsonb_keeps_bytes;

-- what is refused: 22023 (22004 for a null status), and nothing stored
SELECT idempotency.http_response(99, 'x');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.http_response(600, 'x');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.http_response(NULL, 'x');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.http_response(200, 'x', '["Location"]');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.http_response(200, 'x', '"text/plain"');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.http_response(200, 'x', '{"Content-Length": 1}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.http_response(200, 'x', '{"X": {"a": "b"}}');
\echo :LAST_ERROR_SQLSTATE
SELECT outcome FROM idempotency.once('http-2', NULL,
  'SELECT idempotency.http_response($1::int, ''x'') AS r', '700');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored FROM idempotency.idempotency_key WHERE key = 'http-2';
