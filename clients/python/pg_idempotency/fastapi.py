"""FastAPI: ``@idempotent(pool, scope=...)`` under the route decorator.

    @app.post("/payments")
    @idempotent(pool, scope="payments", status_code=201)
    async def pay(p: Payment, db: AsyncConnection): ...

``pool`` is a psycopg_pool.AsyncConnectionPool.  The endpoint's ``db``
parameter (if it has one) receives the guarded transaction's connection;
the endpoint returns a Response or a value (sent as JSONResponse with
``status_code``).  An HTTPException it raises is a final answer like any
other 4xx; any other exception rolls back and becomes FastAPI's 500.
"""
import functools
import inspect

from fastapi import HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response

from ._core import KeyError400, Options, parse_key, problem, request_json
from .guard import AsyncGuard, Captured

_REQ = "_idempotency_request"


def _send(answer):
    if answer.original is not None:
        return answer.original
    headers = dict(answer.headers)
    if answer.replayed:
        headers["Idempotent-Replayed"] = "true"
    return Response(content=answer.body, status_code=answer.status, headers=headers)


def idempotent(pool, *, scope, status_code=200, **options):
    guard = AsyncGuard(pool, Options(scope, **options))

    def decorate(endpoint):
        if not inspect.iscoroutinefunction(endpoint):
            raise TypeError("@idempotent needs an async endpoint (it runs on an AsyncConnectionPool)")
        sig = inspect.signature(endpoint)
        wants_db = "db" in sig.parameters
        params = [p for n, p in sig.parameters.items() if n != "db"]
        # FastAPI passes the Request to one parameter only: the endpoint's own, or ours
        own = next((p.name for p in params if isinstance(p.annotation, type)
                    and issubclass(p.annotation, Request)), None)
        if own is None:
            params.append(inspect.Parameter(_REQ, inspect.Parameter.KEYWORD_ONLY, annotation=Request))

        @functools.wraps(endpoint)
        async def wrapper(*args, **kwargs):
            request: Request = kwargs[own] if own else kwargs.pop(_REQ)
            try:
                key = parse_key(request.headers.getlist("idempotency-key"))
            except KeyError400 as e:
                return _send(problem(400, "Invalid Idempotency-Key", str(e)))
            if key is None:
                if guard.o.required:
                    return _send(problem(400, "Idempotency-Key missing",
                                         "This request requires an Idempotency-Key header."))
                return await endpoint(*args, **kwargs)
            path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            fingerprint = request_json(request.method, path, await request.body())
            scope_ = guard.o.scope_for(request)

            async def work(conn):
                request.state.idempotency = {"conn": conn, "key": key, "scope": scope_}
                if wants_db:
                    kwargs["db"] = conn
                try:
                    result = await endpoint(*args, **kwargs)
                except HTTPException as e:
                    result = JSONResponse({"detail": e.detail}, status_code=e.status_code,
                                          headers=e.headers)
                if not isinstance(result, Response):
                    result = JSONResponse(jsonable_encoder(result), status_code=status_code)
                body = getattr(result, "body", None)
                if body is None:
                    raise TypeError("a streamed response cannot be stored for replay")
                return Captured(result.status_code, result.headers.get, bytes(body), result)

            return _send(await guard.run(key, scope_, fingerprint, work))

        wrapper.__signature__ = sig.replace(parameters=params)
        return wrapper

    return decorate
