"""The driver-agnostic core of pg_idempotency: what every integration shares
(the Idempotency-Key header, the stored response, the answers, the SQL) and
the guarded transaction itself, ``run()``, written once for any driver.

Public and documented (clients/python/README.md); ``pg_idempotency._core``
re-exports it for code written against 0.4.0.

The guarded transaction (``run``)::

    open a transaction (or a savepoint inside the caller's transaction)
    set_config('idempotency.lock_wait', ..., true)          -- SET LOCAL
    begin(key, request, scope, ttl)
      replay      -> roll back, the stored answer
      new / retry -> work(tx) on this transaction; an answer to store is
                     stored with complete(), then COMMIT (or RELEASE)
    IK001 -> 422, IK002 -> 409 + Retry-After (from lookup()), IK003 -> 400;
    40001 / 40P01 anywhere: roll back and run it all again (``retries``
    times), then 503; inside the caller's transaction (a savepoint: Django's
    ATOMIC_REQUESTS or TestCase) never retried: the error propagates, as the
    whole outer transaction must be retried;
    an answer that ``Options.store`` refuses (by default 408, 409, 425, 429
    and any 5xx) or an exception: roll back, nothing stored (the exception
    propagates, so the framework answers 500 and a resend runs again).

A driver is a callable returning a context manager that yields a
``Transaction`` (``pg_idempotency.drivers``: psycopg 3, psycopg2;
``pg_idempotency.django``: Django's connection).  Values go to the server as
parameters, jsonb as JSON text (``%s::jsonb``), so every driver's adapter
works; jsonb coming back is accepted as text (Django's psycopg2) or parsed.

Stored response (the extension's byte-exact replay convention):
``{"status": 201, "headers": {"Content-Type": ..., "Location": ...},
"body": "<exact body text>"}``, or ``"body_base64"`` when the body is not
valid UTF-8 or contains NUL.
"""
import base64
import json
import math
import random
import time
import warnings
from dataclasses import dataclass, field
from typing import (Any, Callable, ContextManager, Dict, Iterable, List, Optional, Protocol,
                    Sequence, Tuple, Union)

from ._compat import check as check_extension

__all__ = [
    "Answer", "Captured", "DEFAULT_HEADERS", "InvalidKey", "KeyError400", "MissingKey", "Options",
    "RETRYABLE", "TRANSIENT", "Transaction", "decode_response", "default_store", "encode_response",
    "error_answer", "lookup_retry_after", "message_of", "parse_key", "problem", "request_json",
    "run", "sqlstate_of",
]

DEFAULT_HEADERS = ("Content-Type", "Location")
LOCK_WAIT_SQL = "SELECT pg_catalog.set_config('idempotency.lock_wait', %s, true)"
BEGIN_SQL = ("SELECT outcome, status, response, attempts "
             "FROM idempotency.begin(%s, %s::jsonb, %s, %s::interval)")
# what run() and Guard send: the request reaches begin() through a
# transaction-local setting, so that begin()'s statement (which PostgreSQL
# logs with its ERROR, log_min_error_statement, on every busy or mismatched
# duplicate) carries no request body under any driver, psycopg2's and
# Django's client-side interpolation included; set_config() does not fail.
SETUP_SQL = ("SELECT pg_catalog.set_config('idempotency.lock_wait', %s, true),"
             " pg_catalog.set_config('pg_idempotency.request', %s, true)")
BEGIN_SETTING_SQL = (
    "SELECT outcome, status, response, attempts FROM idempotency.begin(%s,"
    " NULLIF(pg_catalog.current_setting('pg_idempotency.request'), '')::jsonb,"
    " %s, %s::interval)")
COMPLETE_SQL = "SELECT idempotency.complete(%s, %s::jsonb, %s)"
LOOKUP_SQL = "SELECT retry_after FROM idempotency.lookup(%s, %s)"
HAS_LOOKUP_SQL = "SELECT pg_catalog.to_regprocedure('idempotency.lookup(text,text)') IS NOT NULL"
RETRYABLE = ("40001", "40P01")
# answers that are not final: rolled back, not stored, a resend runs again
# (Stripe's practice): 408 Request Timeout, 409 Conflict, 425 Too Early,
# 429 Too Many Requests, and any 5xx
TRANSIENT = (408, 409, 425, 429)

Headers = Dict[str, str]
GetHeader = Callable[[str], Optional[str]]


def default_store(status: int) -> bool:
    """Whether an answer with this status is stored (and replayed): every
    status below 500 except 408, 409, 425 and 429."""
    return status < 500 and status not in TRANSIENT


@dataclass
class Answer:
    """What to send: status, headers, body (``replayed``: the stored answer);
    ``original``: the framework's own response object when the handler ran,
    which an integration sends instead."""
    status: int
    headers: Headers = field(default_factory=dict)
    body: bytes = b""
    replayed: bool = False
    original: Any = None


@dataclass
class Captured:
    """What ``work`` answered: status, a header getter, the exact body bytes,
    and the framework's response object (sent as it is when stored)."""
    status: int
    get_header: GetHeader
    body: bytes
    original: Any = None


class InvalidKey(Exception):
    """A malformed or missing Idempotency-Key header (answer 400)."""


class MissingKey(InvalidKey):
    """No Idempotency-Key header, or a blank one (answer 400, or run the
    request unguarded when the key is optional)."""


KeyError400 = InvalidKey	# its 0.4.0 name


def parse_key(values: Optional[Iterable[Optional[str]]]) -> str:
    """The Idempotency-Key header values -> the key; raises MissingKey (an
    InvalidKey) when there is none or it is blank, InvalidKey when it is
    malformed.  A structured-field string ("abc", RFC 8941 3.3.3) or bare
    (abc, as Stripe clients send it)."""
    vals = [v for v in (values or []) if v is not None]
    if len(vals) > 1:
        raise InvalidKey("more than one Idempotency-Key header")
    if not vals or not vals[0].strip():
        raise MissingKey("This request requires an Idempotency-Key header.")
    v = vals[0].strip()
    if v[0] != '"':
        return v
    out: List[str] = []
    i = 1
    while i < len(v):
        c = v[i]
        if c == "\\":
            i += 1
            if i >= len(v) or v[i] not in '"\\':
                raise InvalidKey("bad escape in Idempotency-Key string")
            out.append(v[i])
        elif c == '"':
            if i != len(v) - 1:
                raise InvalidKey("text after the Idempotency-Key string")
            return "".join(out)
        elif not 0x20 <= ord(c) <= 0x7E:
            raise InvalidKey("Idempotency-Key string must be printable ASCII")
        else:
            out.append(c)
        i += 1
    raise InvalidKey("unterminated Idempotency-Key string")


def problem(status: int, title: str, detail: str, **headers: str) -> Answer:
    """An RFC 9457 application/problem+json answer; ``Retry_After="1"``
    becomes the header Retry-After."""
    body = json.dumps({"title": title, "status": status, "detail": detail}).encode()
    h = {"Content-Type": "application/problem+json"}
    h.update({k.replace("_", "-"): v for k, v in headers.items()})
    return Answer(status, h, body)


def encode_response(status: int, get_header: GetHeader, body: bytes,
                    names: Iterable[str]) -> Dict[str, Any]:
    """A response -> the stored form (status, the named headers, the body as
    text or ``body_base64``)."""
    headers: Headers = {}
    for name in names:
        v = get_header(name)
        if v is not None:
            headers[name] = str(v)
    r: Dict[str, Any] = {"status": status, "headers": headers}
    try:
        text = body.decode("utf-8")
        if "\x00" in text:
            raise ValueError
        r["body"] = text
    except (UnicodeDecodeError, ValueError):
        r["body_base64"] = base64.b64encode(body).decode("ascii")
    return r


def _load_json(v: Any) -> Any:
    """jsonb as a driver returns it: parsed (psycopg 3, psycopg2's default)
    or text (Django's psycopg2 connections)."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        v = bytes(v).decode("utf-8")
    if isinstance(v, str):
        return json.loads(v)
    return v


def decode_response(r: Any, status: str) -> Answer:
    """The stored form (parsed, or its JSON text) -> the replayed Answer."""
    r = _load_json(r)
    if isinstance(r, dict) and isinstance(r.get("status"), int):
        if isinstance(r.get("body"), str):
            body = r["body"].encode("utf-8")
        else:
            body = base64.b64decode(r.get("body_base64") or "")
        return Answer(r["status"], dict(r.get("headers") or {}), body, replayed=True)
    # a key completed by other code, not in this shape: send it as JSON
    return Answer(500 if status == "failed" else 200, {"Content-Type": "application/json"},
                  json.dumps(r).encode(), replayed=True)


def request_json(method: str, path: str, body: bytes) -> Dict[str, Any]:
    """The default request fingerprinted: method, path and query, body
    (parsed JSON, else its bytes in base64)."""
    parsed: Any
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = {"base64": base64.b64encode(body).decode("ascii")}
    return {"method": method, "path": path, "body": parsed}


def seconds_option(who: str, name: str, value: Optional[float], old: str,
                   old_value: Any, stacklevel: int = 3) -> Optional[float]:
    """A duration option in seconds (a number >= 0) under its unit-carrying
    name, ``None`` when not given.  ``old_value`` is the value of its
    deprecated name, already converted to seconds (a DeprecationWarning);
    both at once is a TypeError."""
    if value is not None and old_value is not None:
        raise TypeError(f"{who}: {name} and {old} (its deprecated name) given both")
    if old_value is not None:
        warnings.warn(f"{who}: {old} is deprecated, use {name} (seconds)", DeprecationWarning,
                      stacklevel=stacklevel)
        value = old_value
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not math.isfinite(value) or value < 0):
        raise ValueError(f"{who}: {name} must be a number of seconds >= 0, not {value!r}")
    return value


class Options:
    """Shared settings.  Durations are seconds (int or float), in names that
    end in ``_seconds``.

    scope              str, or callable(request) -> str: the route's key space
    user               callable(request) -> id or None: a scope per authenticated user
    lock_wait_seconds  how long begin() waits for a duplicate in flight (0.2)
    retries            how often 40001/40P01 run it all again (3)
    required           a request without the header is 400 (True); False: unguarded
    headers            more header names to store besides Content-Type, Location
    ttl_seconds        the key's lifetime, or None (the extension's idempotency.default_ttl)
    store              callable(status) -> bool: whether an answer is stored and
                       replayed (``default_store``: not 408, 409, 425, 429 nor 5xx,
                       which roll back so that a resend runs again)

    Deprecated (0.5.0's names, still accepted): ``lock_wait_ms``
    (milliseconds) for ``lock_wait_seconds``; ``ttl`` (interval text such as
    '1 day') for ``ttl_seconds``.
    """

    def __init__(self, scope: Union[str, Callable[[Any], str]],
                 user: Optional[Callable[[Any], Any]] = None, lock_wait_ms: Optional[int] = None,
                 retries: int = 3, required: bool = True, headers: Iterable[str] = (),
                 ttl: Optional[str] = None, store: Callable[[int], bool] = default_store, *,
                 lock_wait_seconds: Optional[float] = None,
                 ttl_seconds: Optional[float] = None) -> None:
        self.scope = scope
        self.user = user
        wait = seconds_option("Options", "lock_wait_seconds", lock_wait_seconds, "lock_wait_ms",
                              None if lock_wait_ms is None else lock_wait_ms / 1000)
        self.lock_wait = f"{round(1000 * (0.2 if wait is None else wait))}ms"
        self.retries = retries
        self.required = required
        names = list(DEFAULT_HEADERS)
        for h in headers:
            if h.lower() not in (n.lower() for n in names):
                names.append(h)
        self.header_names = names
        if ttl is not None and ttl_seconds is not None:
            raise TypeError("Options: ttl_seconds and ttl (its deprecated name) given both")
        if ttl is not None:
            warnings.warn("Options: ttl (interval text) is deprecated, use ttl_seconds",
                          DeprecationWarning, stacklevel=2)
        secs = seconds_option("Options", "ttl_seconds", ttl_seconds, "ttl", None)
        # what begin() gets: interval text (microseconds, the interval's precision)
        self.ttl = ttl if secs is None else f"{secs:.6f} seconds"
        self.store = store

    def scope_for(self, request: Any) -> str:
        """The scope of this request: the route's, "|user:<id>" appended when
        ``user`` names one."""
        scope = self.scope(request) if callable(self.scope) else self.scope
        if self.user is not None:
            u = self.user(request)
            if u not in (None, ""):
                scope = f"{scope}|user:{u}"
        return str(scope)


# --- errors, whatever the driver ------------------------------------------------
def _chain(e: BaseException) -> Iterable[BaseException]:
    """e and what it wraps: Django's DatabaseError (__cause__), SQLAlchemy's
    DBAPIError (.orig)."""
    seen = 0
    cur: Optional[BaseException] = e
    while cur is not None and seen < 5:
        yield cur
        seen += 1
        orig = getattr(cur, "orig", None)
        cur = orig if isinstance(orig, BaseException) else cur.__cause__


def sqlstate_of(e: BaseException) -> Optional[str]:
    """The SQLSTATE of a database error from psycopg 3 (``sqlstate``),
    psycopg2 (``pgcode``), or one wrapping them (Django, SQLAlchemy); None
    for anything else."""
    for x in _chain(e):
        for attr in ("sqlstate", "pgcode"):
            v = getattr(x, attr, None)
            if isinstance(v, str) and len(v) == 5:
                return v
    return None


def message_of(e: BaseException) -> str:
    """The server's primary message of a database error (else str(e))."""
    for x in _chain(e):
        diag = getattr(x, "diag", None)
        msg = getattr(diag, "message_primary", None) if diag is not None else None
        if isinstance(msg, str) and msg:
            return msg
    return str(e).strip().split("\n")[0]


def error_answer(sqlstate: Optional[str], message: str, retry_after: str = "1") -> Optional[Answer]:
    """The HTTP answer for an extension error (IETF Idempotency-Key draft):
    IK001 -> 422, IK002 -> 409 with Retry-After, IK003 -> 400; None for
    anything else."""
    if sqlstate == "IK001":
        return problem(422, "Idempotency-Key reused",
                       "This Idempotency-Key was used with a different request.")
    if sqlstate == "IK002":
        return problem(409, "Idempotency-Key in use",
                       "A request with this Idempotency-Key is being processed; retry later.",
                       Retry_After=retry_after)
    if sqlstate == "IK003":
        return problem(400, "Invalid Idempotency-Key", message)
    return None


# --- the guarded transaction, whatever the driver -------------------------------
class Transaction(Protocol):
    """One guarded transaction as a driver opens it.

    connection  the driver's (or framework's) connection the work runs on
    nested      True when it is a savepoint in the caller's transaction
    execute     one statement with %s parameters -> its first row (or None)
    set_rollback  roll it back instead of committing when it ends
    """
    connection: Any
    nested: bool

    def execute(self, sql: str, params: Sequence[Any]) -> Optional[Sequence[Any]]: ...

    def set_rollback(self) -> None: ...


Transactions = Callable[[], ContextManager[Transaction]]
Work = Callable[[Transaction], Captured]


def _backoff(attempt: int) -> float:
    return (5 * (attempt + 1) + random.random() * 20) / 1000


def lookup_retry_after(transactions: Transactions, key: str, scope: str) -> str:
    """Seconds a client should wait before resending (Retry-After), from
    ``idempotency.lookup()`` where the extension has it; "1" otherwise."""
    try:
        with transactions() as tx:
            tx.set_rollback()
            has = tx.execute(HAS_LOOKUP_SQL, ())
            if has and has[0]:
                row = tx.execute(LOOKUP_SQL, (key, scope))
                if row and row[0] and int(row[0]) > 0:
                    return str(int(row[0]))
    except Exception:	# the answer is a 409 either way
        pass
    return "1"


def begin_params(key: str, request: Any, scope: str, options: Options) -> Tuple[Any, ...]:
    return (key, json.dumps(request), scope, options.ttl)


def setup_params(request: Any, options: Options) -> Tuple[Any, ...]:
    """SETUP_SQL's parameters: the lock wait, the request ('' for none)."""
    return (options.lock_wait, "" if request is None else json.dumps(request))


def fresh_answer(got: Captured, options: Options) -> Answer:
    """The Answer of a handler that ran: its status, body and the headers
    that are stored (Content-Type, Location, ``options.headers``), and its
    own response object (``original``), which an integration sends as it is."""
    headers: Headers = {}
    for name in options.header_names:
        v = got.get_header(name)
        if v is not None:
            headers[name] = str(v)
    return Answer(got.status, headers, got.body, original=got.original)


def run(transactions: Transactions, key: str, scope: str, request: Any, work: Work,
        options: Options, sleep: Callable[[float], None] = time.sleep,
        compat_key: Any = None) -> Answer:
    """Run ``work`` once for (key, scope): the guarded transaction above.
    ``request`` is the fingerprinted request (JSON-able); ``work(tx)`` runs
    the handler on ``tx.connection`` and returns a ``Captured``.  Returns the
    Answer to send, after the transaction committed.  The extension's
    version is asked once per ``compat_key`` (default: the transaction's
    connection; ``_compat``): an older one raises ExtensionVersionError."""
    for attempt in range(options.retries + 1):
        nested = False
        try:
            with transactions() as tx:
                nested = tx.nested
                check_extension(tx.connection if compat_key is None else compat_key,
                                lambda sql: tx.execute(sql, ()))
                tx.execute(SETUP_SQL, setup_params(request, options))
                b = tx.execute(BEGIN_SETTING_SQL, (key, scope, options.ttl))
                if b is None:
                    raise RuntimeError("idempotency.begin() returned no row")
                if b[0] == "replay":
                    tx.set_rollback()
                    answer = decode_response(b[2], str(b[1]))
                else:
                    got = work(tx)
                    answer = fresh_answer(got, options)
                    if options.store(got.status):
                        stored = encode_response(got.status, got.get_header, got.body,
                                                 options.header_names)
                        tx.execute(COMPLETE_SQL, (key, json.dumps(stored), scope))
                    else:
                        tx.set_rollback()
            return answer	# sent only now: committed (or rolled back as meant)
        except Exception as e:
            state = sqlstate_of(e)
            if state is None:
                raise
            if state in RETRYABLE:
                if nested:	# the caller's whole transaction must be retried
                    raise
                if attempt < options.retries:
                    sleep(_backoff(attempt))
                    continue
                return problem(503, "Try again", message_of(e), Retry_After="1")
            ans = error_answer(state, message_of(e),
                               lookup_retry_after(transactions, key, scope)
                               if state == "IK002" else "1")
            if ans is None:
                raise
            return ans
    raise AssertionError("unreachable")
