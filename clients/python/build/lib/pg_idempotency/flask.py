"""Flask: ``@idempotent(pool, scope=...)`` under the route decorator.

    @app.post("/payments")
    @idempotent(pool, scope="payments")
    def pay(): ... g.db ...

``pool`` is a psycopg_pool.ConnectionPool.  The view runs its queries on
``g.db``, the guarded transaction's connection; whatever it returns
(anything Flask accepts, or an abort() with a 4xx) is stored and replayed;
any other exception rolls back and becomes Flask's 500.
"""
import functools

from flask import current_app, g, request
from werkzeug.exceptions import HTTPException

from ._core import KeyError400, Options, parse_key, problem, request_json
from .guard import Captured, Guard


def _send(answer):
    if answer.original is not None:
        return answer.original
    resp = current_app.response_class(answer.body, status=answer.status)
    resp.headers.clear()
    for name, value in answer.headers.items():
        resp.headers[name] = value
    if answer.replayed:
        resp.headers["Idempotent-Replayed"] = "true"
    return resp


def idempotent(pool, *, scope, **options):
    guard = Guard(pool, Options(scope, **options))

    def decorate(view):
        @functools.wraps(view)
        def wrapper(*args, **kwargs):
            try:
                key = parse_key(request.headers.getlist("Idempotency-Key"))
            except KeyError400 as e:
                return _send(problem(400, "Invalid Idempotency-Key", str(e)))
            if key is None:
                if guard.o.required:
                    return _send(problem(400, "Idempotency-Key missing",
                                         "This request requires an Idempotency-Key header."))
                return view(*args, **kwargs)
            qs = request.query_string.decode("latin-1")
            path = request.path + (f"?{qs}" if qs else "")
            fingerprint = request_json(request.method, path, request.get_data())
            scope_ = guard.o.scope_for(request)

            def work(conn):
                g.db = conn
                g.idempotency = {"conn": conn, "key": key, "scope": scope_}
                try:
                    resp = current_app.make_response(view(*args, **kwargs))
                except HTTPException as e:
                    if e.code is None or e.code >= 500:
                        raise
                    resp = e.get_response()
                if resp.is_streamed:
                    raise TypeError("a streamed response cannot be stored for replay")
                return Captured(resp.status_code, resp.headers.get, resp.get_data(), resp)

            return _send(guard.run(key, scope_, fingerprint, work))

        return wrapper

    return decorate
