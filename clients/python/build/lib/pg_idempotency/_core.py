"""What the sync and async guards and the integrations share: the
Idempotency-Key header, the stored response, the SQL.

Stored response (the extension's byte-exact replay convention):
``{"status": 201, "headers": {"Content-Type": ..., "Location": ...},
"body": "<exact body text>"}``, or ``"body_base64"`` when the body is not
valid UTF-8 or contains NUL.
"""
import base64
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

DEFAULT_HEADERS = ("Content-Type", "Location")
LOCK_WAIT_SQL = "SELECT set_config('idempotency.lock_wait', %s, true)"
BEGIN_SQL = ("SELECT outcome, status, response, attempts "
             "FROM idempotency.begin(%s, %s::jsonb, %s, %s::interval)")
COMPLETE_SQL = "SELECT idempotency.complete(%s, %s::jsonb, %s)"
LOOKUP_SQL = "SELECT retry_after FROM idempotency.lookup(%s, %s)"
HAS_LOOKUP_SQL = "SELECT to_regprocedure('idempotency.lookup(text,text)') IS NOT NULL"
RETRYABLE = ("40001", "40P01")
# answers that are not final: rolled back, not stored, a resend runs again
# (Stripe's practice): 408 Request Timeout, 409 Conflict, 425 Too Early,
# 429 Too Many Requests, and any 5xx
TRANSIENT = (408, 409, 425, 429)


def default_store(status: int) -> bool:
    """Whether an answer with this status is stored (and replayed)."""
    return status < 500 and status not in TRANSIENT


@dataclass
class Answer:
    """What to send: a stored or error response, or (``original``) the
    framework's own response object, already stored."""
    status: int
    headers: Dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    replayed: bool = False
    original: Any = None


class KeyError400(Exception):
    pass


def parse_key(values) -> Optional[str]:
    """The Idempotency-Key header values -> the key, None when missing;
    raises KeyError400 when malformed.  A structured-field string ("abc",
    RFC 8941 3.3.3) or bare (abc, as Stripe clients send it)."""
    values = [v for v in (values or []) if v is not None]
    if len(values) > 1:
        raise KeyError400("more than one Idempotency-Key header")
    if not values or not values[0].strip():
        return None
    v = values[0].strip()
    if v[0] != '"':
        return v
    out, i = [], 1
    while i < len(v):
        c = v[i]
        if c == "\\":
            i += 1
            if i >= len(v) or v[i] not in '"\\':
                raise KeyError400("bad escape in Idempotency-Key string")
            out.append(v[i])
        elif c == '"':
            if i != len(v) - 1:
                raise KeyError400("text after the Idempotency-Key string")
            return "".join(out)
        elif not 0x20 <= ord(c) <= 0x7E:
            raise KeyError400("Idempotency-Key string must be printable ASCII")
        else:
            out.append(c)
        i += 1
    raise KeyError400("unterminated Idempotency-Key string")


def problem(status: int, title: str, detail: str, **headers: str) -> Answer:
    body = json.dumps({"title": title, "status": status, "detail": detail}).encode()
    h = {"Content-Type": "application/problem+json"}
    h.update({k.replace("_", "-"): v for k, v in headers.items()})
    return Answer(status, h, body)


def encode_response(status: int, get_header: Callable[[str], Optional[str]],
                    body: bytes, names) -> dict:
    headers = {}
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


def decode_response(r, status: str) -> Answer:
    if isinstance(r, dict) and isinstance(r.get("status"), int):
        if isinstance(r.get("body"), str):
            body = r["body"].encode("utf-8")
        else:
            body = base64.b64decode(r.get("body_base64") or "")
        return Answer(r["status"], dict(r.get("headers") or {}), body, replayed=True)
    # a key completed by other code, not in this shape: send it as JSON
    return Answer(500 if status == "failed" else 200, {"Content-Type": "application/json"},
                  json.dumps(r).encode(), replayed=True)


def request_json(method: str, path: str, body: bytes) -> dict:
    """The default request fingerprinted: method, path and query, body."""
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = {"base64": base64.b64encode(body).decode("ascii")}
    return {"method": method, "path": path, "body": parsed}


class Options:
    """Shared settings: scope (str or callable(request)), user (callable(request)
    -> id or None: scope per authenticated user), lock_wait_ms (default 200),
    retries (40001/40P01, default 3), required (default True), headers (more
    header names to store), ttl (interval text or None), store (callable(status)
-> bool: whether an answer is stored and replayed; default ``default_store``:
not 408, 409, 425, 429 nor 5xx, which roll back so that a resend runs again)."""

    def __init__(self, scope, user=None, lock_wait_ms=200, retries=3, required=True,
                 headers=(), ttl=None, store=default_store):
        self.scope = scope
        self.user = user
        self.lock_wait = f"{max(0, int(lock_wait_ms))}ms"
        self.retries = retries
        self.required = required
        names = list(DEFAULT_HEADERS)
        for h in headers:
            if h.lower() not in (n.lower() for n in names):
                names.append(h)
        self.header_names = names
        self.ttl = ttl
        self.store = store

    def scope_for(self, request) -> str:
        scope = self.scope(request) if callable(self.scope) else self.scope
        if self.user is not None:
            u = self.user(request)
            if u not in (None, ""):
                scope = f"{scope}|user:{u}"
        return str(scope)
