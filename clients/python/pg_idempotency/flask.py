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
"""
import functools
from typing import Any, Callable, TypeVar

from flask import Response, current_app, g, request
from werkzeug.exceptions import HTTPException

from .core import Answer, Captured, InvalidKey, MissingKey, Options, parse_key, problem, request_json
from .guard import Guard

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
