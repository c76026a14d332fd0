"""Checks of pg_idempotency's pure parts (no database): the key header and
the stored-response encoding, the public names (and 0.4.0's).  Prints "ok - ..." / "not ok - ..." lines;
the HTTP checks are test/conformance's scenarios."""
import subprocess
import sys
from pathlib import Path

from pg_idempotency import core
from pg_idempotency._core import KeyError400, decode_response, encode_response, parse_key
from pg_idempotency.core import InvalidKey, MissingKey

failed = 0


def check(desc, cond):
    global failed
    failed += not cond
    print(f"{'ok' if cond else 'not ok'} - [python units] {desc}")


def key(v):
    try:
        return parse_key(v)
    except MissingKey:
        return "<missing>"
    except KeyError400:
        return "<400>"


check("bare key", key(["abc-1"]) == "abc-1")
check("structured-field string key, with escapes", key(['"a\\"b\\\\c"']) == 'a"b\\c')
check("missing or blank key -> MissingKey (never None: a missing header must not reach the "
      "database as IK003)", key([]) == "<missing>" and key(["  "]) == "<missing>" and key(None) == "<missing>"
      and key([None]) == "<missing>")
try:
    parse_key([])
    raised = None
except InvalidKey as x:
    raised = x
check("parse_key([]) raises InvalidKey, as the README says (MissingKey is an InvalidKey)",
      isinstance(raised, MissingKey) and isinstance(raised, InvalidKey))
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
a = decode_response('{"status": 201, "headers": {"Location": "/p/1"}, "body": "{\\"a\\":1}"}', "completed")
check("a stored response given as text (jsonb from Django's psycopg2) is parsed the same",
      a.status == 201 and a.headers == {"Location": "/p/1"} and a.body == b'{"a":1}' and a.replayed)

# --- the public API and 0.4.0's names -------------------------------------------
import pg_idempotency  # noqa: E402
from pg_idempotency import _core, core  # noqa: E402

old = ["Answer", "Options", "default_store", "parse_key", "KeyError400", "decode_response",
       "encode_response", "problem", "request_json", "DEFAULT_HEADERS", "BEGIN_SQL", "COMPLETE_SQL",
       "LOCK_WAIT_SQL", "LOOKUP_SQL", "HAS_LOOKUP_SQL", "RETRYABLE", "TRANSIENT"]
check("pg_idempotency._core still has 0.4.0's names (the public pg_idempotency.core's objects)",
      all(getattr(_core, n) is getattr(core, n) for n in old) and _core.KeyError400 is core.InvalidKey)
check("pg_idempotency exports the core's helpers, and Guard/AsyncGuard on first use",
      all(getattr(pg_idempotency, n, None) is not None for n in pg_idempotency.__all__)
      and pg_idempotency.Guard.__module__ == "pg_idempotency.guard")
e = None
try:
    parse_key(['"a'])
except core.InvalidKey as x:
    e = x
check("InvalidKey is what parse_key raises (and KeyError400 catches it)", isinstance(e, _core.KeyError400))
readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
undocumented = [n for n in pg_idempotency.__all__ if f"`{n}" not in readme]
check("every name pg_idempotency exports is in its README (run_phases, PhaseError, MissingKey, ...)",
      not undocumented)
if undocumented:
    print("# not in README.md: " + ", ".join(undocumented))
out = subprocess.run([sys.executable, "-c", "import sys, pg_idempotency, pg_idempotency.core, "
                      "pg_idempotency.drivers, pg_idempotency.django; "
                      "print(sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'psycopg2', 'psycopg_pool')))"],
                     capture_output=True, text=True)
loaded_none = out.returncode == 0 and out.stdout.strip() == "[]"
check("importing pg_idempotency, its core, drivers and Django integration loads no driver "
      "(a Django app on psycopg2 needs no psycopg 3)", loaded_none)
if not loaded_none:
    print("# " + (out.stdout + out.stderr)[-400:])

# --- units: durations are seconds, in names that carry the unit -----------------
import warnings  # noqa: E402


def options(**kw):
    """Options(**kw) -> (lock_wait, ttl, [deprecation warnings]) or the exception's type"""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            o = core.Options("u", **kw)
        except (TypeError, ValueError) as e:
            return type(e)
    return o.lock_wait, o.ttl, [str(x.message) for x in w if x.category is DeprecationWarning]


check("Options defaults: lock wait 200ms, the server's ttl, no warning", options() == ("200ms", None, []))
check("Options(lock_wait_seconds=0.05, ttl_seconds=86400): 50ms and 86400 seconds, no warning",
      options(lock_wait_seconds=0.05, ttl_seconds=86400) == ("50ms", "86400.000000 seconds", []))
check("Options(ttl_seconds=1.5) keeps the fraction", options(ttl_seconds=1.5)[1] == "1.500000 seconds")
dep = options(lock_wait_ms=50, ttl="1 day")
check("deprecated lock_wait_ms / ttl (interval text) still work, each with a DeprecationWarning",
      dep[:2] == ("50ms", "1 day") and len(dep[2]) == 2
      and "lock_wait_seconds" in dep[2][0] and "ttl_seconds" in dep[2][1])
check("a new name and its deprecated alias together: TypeError",
      options(lock_wait_seconds=1, lock_wait_ms=5) is TypeError
      and options(ttl_seconds=1, ttl="1 day") is TypeError)
check("a negative, infinite, boolean or text duration: ValueError",
      all(options(**{k: v}) is ValueError for k in ("lock_wait_seconds", "ttl_seconds")
          for v in (-1, float("inf"), True, "1 day")))

# --- the README documents every public name ----------------------------------
import os  # noqa: E402
import re  # noqa: E402

with open(os.path.join(os.path.dirname(__file__), "..", "README.md"), encoding="utf-8") as f:
    readme = f.read()
undocumented = [n for n in pg_idempotency.__all__ if not re.search(f"`{n}\\b", readme)]
check(f"clients/python/README.md documents every name of pg_idempotency.__all__ "
      f"({len(pg_idempotency.__all__)})", not undocumented)
if undocumented:
    print(f"# undocumented: {', '.join(undocumented)}")
sys.exit(1 if failed else 0)
