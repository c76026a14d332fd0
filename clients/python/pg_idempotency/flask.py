"""Flask: ``@idempotent(pool, scope=...)`` under the route decorator.

    @app.post("/payments")
    @idempotent(pool, scope="payments")
    def pay(): ... g.db ...

``pool`` is a psycopg_pool.ConnectionPool.  The view runs its queries on
``g.db``, the guarded transaction's connection; whatever it returns
(anything Flask accepts, or an abort() with a 4xx) is stored and replayed,
unless ``store`` refuses its status (by default 408, 409, 425, 429 and 5xx:
rolled back, a resend runs again); any other exception rolls back and
becomes Flask's 500.

Phases (a request that calls another system, resumable after a crash):
``@idempotent_phases(pool, scope=..., phases=[...])`` under the route
decorator; the view gets the final state and returns the answer (below).
"""
import functools
from typing import Any, Callable, List, Sequence, TypeVar

from flask import Response, current_app, g, request
from werkzeug.exceptions import HTTPException

from .core import (Answer, Captured, InvalidKey, MissingKey, Options, parse_key, problem,
                   request_json)
from ._phases import Json, Phase, PhaseError, State
from .guard import Guard
from .phased import PhasedOptions, failure, outcome_answer, result_answer
from .phases import run_phases

__all__ = ["Phase", "PhaseError", "idempotent", "idempotent_phases"]

View = TypeVar("View", bound=Callable[..., Any])


def _send(answer: Answer) -> Response:
    if answer.original is not None:
        original: Response = answer.original
        return original
    resp: Response = current_app.response_class(answer.body, status=answer.status)
    resp.headers.clear()
    for name, value in answer.headers.items():
        resp.headers[name] = value
    if answer.replayed:
        resp.headers["Idempotent-Replayed"] = "true"
    return resp


def idempotent(pool: Any, *, scope: Any, **options: Any) -> Callable[[View], View]:
    """``pool``: a psycopg_pool.ConnectionPool; ``scope`` and ``options``: as
    ``core.Options``."""
    guard = Guard(pool, Options(scope, **options))

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                key = parse_key(request.headers.getlist("Idempotency-Key"))
            except MissingKey as e:
                if guard.o.required:
                    return _send(problem(400, "Idempotency-Key missing", str(e)))
                return view(*args, **kwargs)
            except InvalidKey as e:
                return _send(problem(400, "Invalid Idempotency-Key", str(e)))
            qs = request.query_string.decode("latin-1")
            path = request.path + (f"?{qs}" if qs else "")
            fingerprint = request_json(request.method, path, request.get_data())
            scope_ = guard.o.scope_for(request)

            def work(conn: Any) -> Captured:
                g.db = conn
                g.idempotency = {"conn": conn, "key": key, "scope": scope_}
                try:
                    resp = current_app.make_response(view(*args, **kwargs))
                except HTTPException as e:
                    if e.code is None or e.code >= 500:
                        raise
                    resp = e.get_response()  # type: ignore[assignment]
                if resp.is_streamed:
                    raise TypeError("a streamed response cannot be stored for replay")
                return Captured(resp.status_code, resp.headers.get, resp.get_data(), resp)

            return _send(guard.run(key, scope_, fingerprint, work))

        return wrapper  # type: ignore[return-value]

    return decorate


def idempotent_phases(pool: Any, *, scope: Any, phases: Sequence[Phase],
                      **options: Any) -> Callable[[View], View]:
    """Phases behind one decorator (``pg_idempotency.phased`` has the HTTP
    rules): ``run_phases`` on ``pool`` (a psycopg_pool.ConnectionPool) under
    the request's Idempotency-Key; each phase gets ``ctx.req`` (Flask's
    request) and ``ctx.request`` (the fingerprinted {"method", "path",
    "body"}).  The view is the response: called with the final state (every
    phase's result under its name) in the last phase's transaction, it
    returns anything Flask accepts; stored and replayed byte for byte.
    ``options``: ``user``, ``lease_seconds`` (30), ``renew_every_seconds``
    (lease / 3), ``ttl_seconds``, ``headers``, ``store`` (PhasedOptions).

        @app.post("/transfers")
        @idempotent_phases(pool, scope="transfers", phases=[Phase("debit", debit), ...])
        def transfer(state): return {"charge": state["charge"]}, 201
    """
    o = PhasedOptions("idempotent_phases", scope, phases, **options)

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                key = parse_key(request.headers.getlist("Idempotency-Key"))
            except InvalidKey as e:
                title = "Idempotency-Key missing" if isinstance(e, MissingKey) else "Invalid Idempotency-Key"
                return _send(problem(400, title, str(e)))
            qs = request.query_string.decode("latin-1")
            path = request.path + (f"?{qs}" if qs else "")
            fingerprint = request_json(request.method, path, request.get_data())
            scope_ = o.scope_for(request)
            fresh: List[Captured] = []

            def respond(state: State) -> Json:
                resp = current_app.make_response(view(state, *args, **kwargs))
                if resp.is_streamed:
                    raise TypeError("a streamed response cannot be stored for replay")
                got = Captured(resp.status_code, resp.headers.get, resp.get_data(), resp)
                stored = o.stored(got)
                fresh.append(got)
                return stored

            try:
                r = run_phases(pool, key, o.phases, respond, scope=scope_, request=fingerprint,
                               lease_seconds=o.lease_seconds,
                               renew_every_seconds=o.renew_every_seconds,
                               ttl_seconds=o.ttl_seconds, failure=failure, req=request)
            except Exception as e:
                answer = outcome_answer(e, lambda: _retry_after(pool, key, scope_))
                if answer is None:
                    raise
                return _send(answer)
            if r.outcome != "replay" and fresh:
                return fresh[-1].original
            return _send(result_answer(r.outcome, r.response, r.status))

        return wrapper  # type: ignore[return-value]

    return decorate


def _retry_after(pool: Any, key: str, scope: str) -> str:
    from .core import lookup_retry_after
    from .drivers import psycopg_pool_transaction
    return lookup_retry_after(lambda: psycopg_pool_transaction(pool), key, scope)
