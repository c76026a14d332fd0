"""What a newcomer tripped on in the Python client, against the database
(DATABASE_HOST/PORT/NAME/USER) and its server log (SERVER_LOG, the
cluster's log file); prints "ok - ..." / "not ok - ..." lines.

- A mismatched resend (422) and a busy duplicate (409) on psycopg2
  (client-side interpolation), Django's psycopg2 connection included, and
  on psycopg 3 with a client-side binding cursor: the ERRORs PostgreSQL
  logs with their statements carry no request body.
- Durations in seconds under names that carry the unit: Options
  ``ttl_seconds``, ``run_phases(lease_seconds=, ttl_seconds=)``, and the
  deprecated 0.5.0 names still working, checked on the rows written."""
import os
import socket
import sys
import time
import uuid
import warnings
from types import SimpleNamespace
from typing import Any, Callable, Optional, Tuple

import psycopg
import psycopg2
from psycopg.conninfo import make_conninfo
from psycopg_pool import ConnectionPool

from pg_idempotency import Captured, Options, Phase, request_json, run, run_phases
from pg_idempotency.drivers import psycopg2_transaction, psycopg_transaction

conninfo = make_conninfo(host=os.environ["DATABASE_HOST"], port=os.environ["DATABASE_PORT"],
                         dbname=os.environ["DATABASE_NAME"], user=os.environ["DATABASE_USER"])
RUN = uuid.uuid4().hex[:8]
failed = 0
look = psycopg.connect(conninfo, autocommit=True)


def check(desc: str, cond: bool, diag: Any = None) -> None:
    global failed
    failed += not cond
    print(f"{'ok' if cond else 'not ok'} - [python frictions] {desc}", flush=True)
    if not cond and diag is not None:
        print(f"# {diag!r}"[:600], flush=True)


def key_row(key: str, scope: str) -> Optional[Tuple[float, Optional[float]]]:
    """(seconds the key lives, seconds left of its lease)"""
    r = look.execute("SELECT extract(epoch FROM expires_at - created_at)::float8,"
                     " extract(epoch FROM locked_until - clock_timestamp())::float8"
                     " FROM idempotency.idempotency_key WHERE key = %s AND scope = %s",
                     (key, scope)).fetchone()
    return None if r is None else (float(r[0]), None if r[1] is None else float(r[1]))


def ok_work(tx: Any) -> Captured:
    return Captured(201, {"Content-Type": "application/json"}.get, b"{}")


# --- no request body in the server log ------------------------------------------
log = os.environ.get("SERVER_LOG")
start = os.path.getsize(log) if log else 0
marker = f"card-4111-{RUN}"
scope = f"log-{RUN}"
opts = Options(scope, lock_wait_seconds=0.05)


def pg2() -> Any:
    return psycopg2.connect(conninfo)


def pg3_client_side() -> Any:
    return psycopg.connect(conninfo, cursor_factory=psycopg.ClientCursor)


drivers: Tuple[Tuple[str, Callable[[], Any], Callable[[Any], Any]], ...] = (
    ("psycopg2", pg2, psycopg2_transaction),
    ("psycopg 3 ClientCursor", pg3_client_side, psycopg_transaction))
statuses = {}
for name, connect, transaction in drivers:
    a, b = connect(), connect()
    k = f"mismatch-{name}-{RUN}"

    def req(tag: str) -> Any:
        return request_json("POST", "/payments", f'{{"card": "{marker}-{tag}"}}'.encode())

    first = run(lambda: transaction(a), k, scope, req("a"), ok_work, opts)
    other = run(lambda: transaction(a), k, scope, req("b"), ok_work, opts)

    def holder(tx: Any) -> Captured:	# a duplicate arrives while this one runs
        dup = run(lambda: transaction(b), f"busy-{name}-{RUN}", scope, req("c"), ok_work, opts)
        statuses[f"{name} busy"] = dup.status
        return ok_work(tx)

    run(lambda: transaction(a), f"busy-{name}-{RUN}", scope, req("c"), holder, opts)
    statuses[f"{name} first"], statuses[f"{name} mismatch"] = first.status, other.status
    a.close()
    b.close()
check("psycopg2 and psycopg 3 (client-side binding): 201, a mismatched resend 422, a busy "
      "duplicate 409", all(v == {"first": 201, "mismatch": 422, "busy": 409}[k.split()[-1]]
                           for k, v in statuses.items()) and len(statuses) == 6, statuses)
time.sleep(0.3)	# the logger's flush
if log:
    with open(log, encoding="utf-8", errors="replace") as f:
        f.seek(start)
        text = f.read()
    errors = [line for line in text.splitlines() if "ERROR" in line or "STATEMENT" in line]
    check("the server log has their ERRORs and statements, and no request body in them",
          len(errors) >= 8 and marker not in text,
          [line for line in text.splitlines() if marker in line][:3] or errors[:4])
else:
    check("SERVER_LOG names the cluster log", False)

# --- durations in seconds ---------------------------------------------------------
s = f"units-{RUN}"
with psycopg2.connect(conninfo) as c:
    for label, o in (("ttl_seconds=3600", Options(s, ttl_seconds=3600)),
                     ("1.5 s", Options(s, ttl_seconds=1.5))):
        k = f"ttl-{label}-{RUN}"
        run(lambda: psycopg2_transaction(c), k, s, {"n": 1}, ok_work, o)
        got = key_row(k, s)
        want = 3600 if label.startswith("ttl") else 1.5
        check(f"Options({label}): the key lives {want} s (expires_at - created_at)",
              got is not None and abs(got[0] - want) < 0.01, got)

pool = ConnectionPool(conninfo, min_size=1, max_size=4, open=True)
phases = [Phase("one", lambda ctx: 1)]
for label, kw in (("lease_seconds=20, ttl_seconds=7200",
                   {"lease_seconds": 20, "ttl_seconds": 7200, "renew_every_seconds": 60}),
                  ("deprecated lease=20, ttl=7200",
                   {"lease": 20, "ttl": 7200, "renew_every": 60})):
    k = f"phases-{label.split('=')[0]}-{RUN}"
    seen = []
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = run_phases(pool, k, phases, lambda st: {"ok": True}, scope=s,
                       after_commit=lambda name: seen.append(key_row(k, s)) if name == "(begin)" else None,
                       **kw)
    dep = [str(x.message) for x in w if x.category is DeprecationWarning]
    got = seen[0] if seen else None
    check(f"run_phases({label}): a 20 s lease, a 2 hour key"
          + (", DeprecationWarnings" if "lease" in kw else ", no warning"),
          r.outcome == "new" and got is not None and got[1] is not None and abs(got[1] - 20) < 2
          and abs(got[0] - 7200) < 1 and (len(dep) == 3 if "lease" in kw else not dep), (got, dep))
try:
    run_phases(pool, f"both-{RUN}", phases, lambda st: None, lease_seconds=1, lease=1)
    e: Optional[BaseException] = None
except TypeError as x:
    e = x
check("run_phases: lease_seconds and lease together: TypeError, nothing begun",
      e is not None and key_row(f"both-{RUN}", "") is None, e)
pool.close()

# --- the relay's durations: *_seconds, the 0.5.0 names deprecated -------------------
from pg_idempotency.relay import RelayError, RelayOptions, webhook  # noqa: E402

with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    new = RelayOptions(visibility_seconds=2, poll_interval_seconds=0.5, retry_delay_seconds=0.2)
    quiet = [str(x.message) for x in w if x.category is DeprecationWarning]
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    old = RelayOptions(visibility=2, poll_interval=0.5, retry_delay=0.2)
    dep = [str(x.message) for x in w if x.category is DeprecationWarning]
default = RelayOptions()
check("RelayOptions: visibility_seconds, poll_interval_seconds, retry_delay_seconds; the deprecated "
      "visibility, poll_interval, retry_delay the same with DeprecationWarnings; defaults 30, 5, 1",
      new.durations() == (2, 0.5, 0.2) and old.durations() == (2, 0.5, 0.2) and not quiet
      and len(dep) == 3 and default.durations() == (30.0, 5.0, 1.0),
      (new.durations(), old.durations(), default.durations(), dep))
both = []
for name in ("visibility", "poll_interval", "retry_delay"):
    try:
        RelayOptions(**{name: 1, f"{name}_seconds": 1})
        both.append(None)
    except TypeError as x:
        both.append(x)
check("RelayOptions: a _seconds name and its deprecated alias together: TypeError",
      all(isinstance(x, TypeError) for x in both), both)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    re_new, re_old = RelayError("x", 3.5), RelayError("x", retry_in=3.5)
check("RelayError: retry_in_seconds (positional too); retry_in deprecated; both attributes set",
      re_new.retry_in_seconds == re_old.retry_in_seconds == re_old.retry_in == 3.5
      and sum(x.category is DeprecationWarning for x in w) == 1, [str(x.message) for x in w])

silent = socket.socket()
silent.bind(("127.0.0.1", 0))
silent.listen(4)	# accepts, never answers
url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
msg = SimpleNamespace(message_id="m", headers={}, payload={})
timed = []
for kw in ({"timeout_seconds": 0.3}, {"timeout": 0.3}):
    t0 = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hook = webhook(url, **kw)
    try:
        hook(msg)  # type: ignore[arg-type]
        timed.append(("answered", 0.0))
    except Exception as x:
        timed.append((type(x).__name__, time.monotonic() - t0))
silent.close()
check("webhook: timeout_seconds=0.3 and the deprecated timeout=0.3 give up after 0.3 s (WebhookError)",
      all(n == "WebhookError" and 0.25 < t < 2 for n, t in timed), timed)
try:
    webhook(url, timeout_seconds=1, timeout=1)
    e = None
except TypeError as x:
    e = x
check("webhook: timeout_seconds and timeout together: TypeError", isinstance(e, TypeError), e)
sys.exit(1 if failed else 0)
