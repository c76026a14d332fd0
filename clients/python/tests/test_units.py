"""Checks of pg_idempotency's pure parts (no database): the key header and
the stored-response encoding.  Prints "ok - ..." / "not ok - ..." lines;
the HTTP checks are in test/clients/driver.js."""
import sys

from pg_idempotency._core import KeyError400, decode_response, encode_response, parse_key

failed = 0


def check(desc, cond):
    global failed
    failed += not cond
    print(f"{'ok' if cond else 'not ok'} - [python units] {desc}")


def key(v):
    try:
        return parse_key(v)
    except KeyError400:
        return "<400>"


check("bare key", key(["abc-1"]) == "abc-1")
check("structured-field string key, with escapes", key(['"a\\"b\\\\c"']) == 'a"b\\c')
check("missing or blank key -> None", key([]) is None and key(["  "]) is None)
check("malformed structured-field strings -> 400",
      all(key([v]) == "<400>" for v in ['"abc', '"a"b"', '"a\\xb"', '"caf\u00e9"']))
check("two Idempotency-Key headers -> 400", key(["a", "b"]) == "<400>")

hdr = {"Content-Type": "application/json", "Location": "/p/1", "X-Other": "no"}.get
r = encode_response(201, hdr, '{"b":1,  "a":"caf\u00e9"}'.encode(), ["Content-Type", "Location"])
check("UTF-8 body stored as text; only the chosen headers",
      r == {"status": 201, "headers": {"Content-Type": "application/json", "Location": "/p/1"},
            "body": '{"b":1,  "a":"caf\u00e9"}'})
for name, body in (("not UTF-8", b"\xff\xfe\x00binary"), ("with NUL", b"a\x00b")):
    r = encode_response(200, hdr, body, ["Content-Type"])
    a = decode_response(r, "completed")
    check(f"body {name}: stored as body_base64, decoded byte for byte",
          "body" not in r and "body_base64" in r and a.body == body and a.replayed)
a = decode_response({"payment_id": 7}, "completed")
check("a response stored by other code replays as JSON, 200", a.status == 200 and a.body == b'{"payment_id": 7}')
sys.exit(1 if failed else 0)
