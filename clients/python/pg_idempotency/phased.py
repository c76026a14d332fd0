"""What the framework integrations of phases (``idempotent_phases`` in
``pg_idempotency.flask``, ``.fastapi`` and ``.django``) share: the HTTP
rules of the single-transaction guard around ``run_phases`` /
``run_phases_async``.  Imports no driver and no framework.

    no key -> 400; malformed or longer than 255 -> 400 (IK003)
    same key, another request -> 422 (IK001)
    the key held by a running attempt (its lease) -> 409 + Retry-After (IK002)
    replay -> the stored answer byte for byte, plus Idempotent-Replayed: true
    the view (the response function) -> its answer, stored by complete() in
      the last phase's transaction in the guard's form (status, the
      Content-Type, Location and ``headers`` headers, the body bytes) when
      ``store(status)`` (default: not 408, 409, 425, 429 nor 5xx); an answer
      that is not stored rolls the last phase back and fails the key
      retryably (a resend resumes from the last checkpoint)
    a phase that raises -> the exception propagates (the framework's 500),
      nothing stored (fail(retryable)), a resend resumes from the last
      checkpoint
    PhaseError(message, permanent=True, status=402, body={...}) -> fail(
      retryable => false) stores that answer (default 400, {"error":
      message}, as JSON), sent now and replayed from then on
    taken over while running (IK004) -> 409 + Retry-After: 1
    40001 / 40P01 -> 503 + Retry-After: 1
"""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, Iterable, Optional

from ._phases import Json, PhaseError
from .core import (DEFAULT_HEADERS, RETRYABLE, Answer, Captured, decode_response, default_store,
                   encode_response, error_answer, message_of, problem, seconds_option,
                   sqlstate_of)

__all__ = ["NotStored", "PhasedOptions", "json_body", "outcome_answer", "permanent_answer"]


def json_body(value: Any) -> bytes:
    """JSON as the Node client and the conformance contract write it:
    compact, keys in their order, UTF-8 (not \\u escapes)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class NotStored(Exception):
    """The view's answer has a status ``store`` refuses: the last phase
    rolls back, the key fails retryably, the answer is sent."""

    def __init__(self, captured: Captured) -> None:
        super().__init__(f"answer {captured.status} is not stored")
        self.captured = captured


class PhasedOptions:
    """The options every ``idempotent_phases`` takes.  Durations are
    seconds (int or float), in names that end in ``_seconds``.

    scope                str, or callable(request) -> str (required)
    user                 callable(request) -> id or None: a scope per user
    phases               the phases, in order (``Phase`` / ``AsyncPhase``)
    lease_seconds        how long an attempt holds the key between renewals;
                         a crashed attempt is taken over after it (30)
    renew_every_seconds  how often the lease is renewed (lease_seconds / 3)
    ttl_seconds          the key's lifetime (None: idempotency.default_ttl)
    headers              more header names to store besides Content-Type, Location
    store                callable(status) -> bool (``default_store``)
    """

    def __init__(self, who: str, scope: Any, phases: Iterable[Any], *,
                 user: Optional[Callable[[Any], Any]] = None,
                 lease_seconds: Optional[float] = None,
                 renew_every_seconds: Optional[float] = None,
                 ttl_seconds: Optional[float] = None, headers: Iterable[str] = (),
                 store: Callable[[int], bool] = default_store) -> None:
        self.who = who
        if scope is None:
            raise TypeError(f"{who}: scope is required")
        self.scope = scope
        self.user = user
        self.phases = list(phases)
        if not self.phases:
            raise ValueError(f"{who}: phases must not be empty")
        lease = seconds_option(who, "lease_seconds", lease_seconds, "lease", None)
        self.lease_seconds = 30.0 if lease is None else lease
        self.renew_every_seconds = seconds_option(who, "renew_every_seconds", renew_every_seconds,
                                                  "renew_every", None)
        self.ttl_seconds = seconds_option(who, "ttl_seconds", ttl_seconds, "ttl", None)
        names = list(DEFAULT_HEADERS)
        for h in headers:
            if h.lower() not in (n.lower() for n in names):
                names.append(h)
        self.header_names = names
        if not callable(store):
            raise TypeError(f"{who}: store must be callable(status) -> bool")
        self.store = store

    def scope_for(self, request: Any) -> str:
        scope = self.scope(request) if callable(self.scope) else self.scope
        if self.user is not None:
            u = self.user(request)
            if u not in (None, ""):
                scope = f"{scope}|user:{u}"
        return str(scope)

    def stored(self, got: Captured) -> Dict[str, Any]:
        """The view's answer -> what complete() stores; NotStored when
        ``store`` refuses its status."""
        if not self.store(got.status):
            raise NotStored(got)
        return encode_response(got.status, got.get_header, got.body, self.header_names)


def permanent_answer(err: BaseException) -> Dict[str, Any]:
    """What fail(retryable => false) stores for a permanent PhaseError: its
    status (400) and body ({"error": message}) as JSON."""
    status = getattr(err, "status", None)
    body: Json = getattr(err, "body", None)
    if not isinstance(status, int) or not 100 <= status <= 599:
        status = 400
    payload = json_body({"error": str(err)} if body is None else body)
    return encode_response(status, {"Content-Type": "application/json"}.get, payload,
                           ("Content-Type",))


def failure(err: BaseException, permanent: bool) -> Json:
    """``run_phases``'s failure(): the HTTP answer for a permanent error."""
    if permanent:
        return permanent_answer(err)
    return {"error": str(err)}


def outcome_answer(err: BaseException, retry_after: Callable[[], str]) -> Optional[Answer]:
    """The answer for what run_phases raised, or None (re-raise it):
    NotStored -> the view's answer; a permanent PhaseError -> its stored
    answer; IK00x, 40001/40P01 -> the guard's problem answers."""
    if isinstance(err, NotStored):
        got = err.captured
        headers: Dict[str, str] = {}
        for name in DEFAULT_HEADERS:
            v = got.get_header(name)
            if v is not None:
                headers[name] = str(v)
        return Answer(got.status, headers, got.body, original=got.original)
    if isinstance(err, PhaseError) and err.permanent:
        a = decode_response(permanent_answer(err), "failed")
        a.replayed = False
        return a
    state = sqlstate_of(err)
    if state is None:
        return None
    if state in RETRYABLE:
        return problem(503, "Try again", message_of(err), Retry_After="1")
    if state == "IK004":
        return problem(409, "Idempotency-Key taken over",
                       "Another attempt took this request over; retry later.", Retry_After="1")
    return error_answer(state, message_of(err), retry_after() if state == "IK002" else "1")


def result_answer(outcome: str, response: Any, status: Optional[str]) -> Answer:
    """run_phases's result -> the answer: a replay is marked replayed."""
    a = decode_response(response, status or "completed")
    a.replayed = outcome == "replay"
    return a
