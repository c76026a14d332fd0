"""FastAPI: ``@idempotent(pool, scope=...)`` under the route decorator.

    @app.post("/payments", status_code=201, response_model=PaymentOut)
    @idempotent(pool, scope="payments")
    async def pay(p: Payment, db: AsyncConnection): ...

``pool`` is a psycopg_pool.AsyncConnectionPool.  The endpoint's ``db``
parameter (if it has one) receives the guarded transaction's connection;
the endpoint returns a Response (sent as it is) or a value, which is
serialized as FastAPI itself would: the route's ``response_model`` (and its
include/exclude/by_alias settings), ``status_code`` and ``response_class``,
and a ``response: Response`` parameter's status and headers.  What is stored
and replayed is that response, byte for byte.  An HTTPException it raises is
an answer like any other (stored unless ``store`` refuses its status: by
default 408, 409, 425, 429 and 5xx are not); any other exception rolls back
and becomes FastAPI's 500.

Phases (a request that calls another system, resumable after a crash):
``@idempotent_phases(pool, scope=..., phases=[...])`` under the route
decorator; the endpoint's ``state`` parameter gets the final state and it
returns the answer (below).
"""
import functools
import inspect
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, TypeVar

from fastapi import HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute, serialize_response

from ._phases import Json, PhaseError, State
from .core import (Answer, Captured, InvalidKey, MissingKey, Options, parse_key, problem,
                   request_json, sqlstate_of)
from .guard import AsyncGuard
from .phased import PhasedOptions, failure, outcome_answer, result_answer
from .phases import AsyncPhase, run_phases_async

__all__ = ["AsyncPhase", "PhaseError", "idempotent", "idempotent_phases"]


def _body_allowed(status_code: Optional[int]) -> bool:
    """fastapi.utils.is_body_allowed_for_status_code (not in older FastAPI)."""
    return status_code is None or not (status_code < 200 or status_code in (204, 304))


Endpoint = TypeVar("Endpoint", bound=Callable[..., Awaitable[Any]])

_REQ = "_idempotency_request"


def _send(answer: Answer) -> Response:
    if answer.original is not None:
        original: Response = answer.original
        return original
    headers = dict(answer.headers)
    if answer.replayed:
        headers["Idempotent-Replayed"] = "true"
    return Response(content=answer.body, status_code=answer.status, headers=headers)


_SERIALIZE_ARGS = set(inspect.signature(serialize_response).parameters)


async def _serialize(request: Request, result: Any, sub_response: Optional[Response],
                     status_code: Optional[int]) -> Response:
    """``result`` (not a Response) -> the Response FastAPI would have sent
    for this route (fastapi.routing.get_request_handler, step for step)."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return JSONResponse(jsonable_encoder(result), status_code=status_code or 200)
    response_class: Any = getattr(route.response_class, "value", route.response_class)	# DefaultPlaceholder
    args: Dict[str, Any] = {}
    code = route.status_code or status_code or (sub_response.status_code if sub_response else None)
    if code is not None:
        args["status_code"] = code
    if sub_response is not None and sub_response.status_code:
        args["status_code"] = sub_response.status_code
    field = getattr(route, "secure_cloned_response_field", None) or getattr(route, "response_field", None)
    kwargs = dict(field=field, response_content=result, include=route.response_model_include,
                  exclude=route.response_model_exclude, by_alias=route.response_model_by_alias,
                  exclude_unset=route.response_model_exclude_unset,
                  exclude_defaults=route.response_model_exclude_defaults,
                  exclude_none=route.response_model_exclude_none, is_coroutine=True)
    content = await serialize_response(**{k: v for k, v in kwargs.items() if k in _SERIALIZE_ARGS})
    response: Response = response_class(content, **args)
    if not _body_allowed(response.status_code):
        response.body = b""
    if sub_response is not None:
        response.headers.raw.extend(sub_response.headers.raw)
    return response


def idempotent(pool: Any, *, scope: Any, status_code: Optional[int] = None,
               **options: Any) -> Callable[[Endpoint], Endpoint]:
    """``pool``: a psycopg_pool.AsyncConnectionPool; ``scope`` and
    ``options``: as ``core.Options``; ``status_code``: only for a route that
    sets none (the route's wins)."""
    guard = AsyncGuard(pool, Options(scope, **options))

    def decorate(endpoint: Endpoint) -> Endpoint:
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
        # a ``response: Response`` parameter: FastAPI's sub-response (status, headers)
        sub = next((p.name for p in params if isinstance(p.annotation, type)
                    and issubclass(p.annotation, Response)), None)

        @functools.wraps(endpoint)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            request: Request = kwargs[own] if own else kwargs.pop(_REQ)
            try:
                key = parse_key(request.headers.getlist("idempotency-key"))
            except MissingKey as e:
                if guard.o.required:
                    return _send(problem(400, "Idempotency-Key missing", str(e)))
                return await endpoint(*args, **kwargs)
            except InvalidKey as e:
                return _send(problem(400, "Invalid Idempotency-Key", str(e)))
            path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            fingerprint = request_json(request.method, path, await request.body())
            scope_ = guard.o.scope_for(request)

            async def work(conn: Any) -> Captured:
                request.state.idempotency = {"conn": conn, "key": key, "scope": scope_}
                if wants_db:
                    kwargs["db"] = conn
                try:
                    result = await endpoint(*args, **kwargs)
                except HTTPException as e:
                    result = JSONResponse({"detail": e.detail}, status_code=e.status_code,
                                          headers=e.headers)
                if not isinstance(result, Response):
                    result = await _serialize(request, result, kwargs.get(sub) if sub else None,
                                              status_code)
                body = getattr(result, "body", None)
                if body is None:
                    raise TypeError("a streamed response cannot be stored for replay")
                return Captured(result.status_code, result.headers.get, bytes(body), result)

            return _send(await guard.run(key, scope_, fingerprint, work))

        setattr(wrapper, "__signature__", sig.replace(parameters=params))
        return wrapper  # type: ignore[return-value]

    return decorate


def idempotent_phases(pool: Any, *, scope: Any, phases: Sequence[AsyncPhase],
                      status_code: Optional[int] = None,
                      **options: Any) -> Callable[[Endpoint], Endpoint]:
    """Phases behind one decorator (``pg_idempotency.phased`` has the HTTP
    rules): ``run_phases_async`` on ``pool`` (a
    psycopg_pool.AsyncConnectionPool) under the request's Idempotency-Key;
    each phase (``AsyncPhase``) gets ``ctx.req`` (the Request) and
    ``ctx.request`` (the fingerprinted {"method", "path", "body"}).  The
    endpoint is the response: its ``state`` parameter gets the final state
    (every phase's result under its name), its other parameters are
    FastAPI's as usual; it runs in the last phase's transaction and returns
    a Response or a value serialized as FastAPI would (as ``@idempotent``
    does); stored and replayed byte for byte.  ``options``: ``user``,
    ``lease_seconds`` (30), ``renew_every_seconds`` (lease / 3),
    ``ttl_seconds``, ``headers``, ``store`` (PhasedOptions).

        @app.post("/transfers", status_code=201)
        @idempotent_phases(pool, scope="transfers", phases=[AsyncPhase("debit", debit), ...])
        async def transfer(state: dict, t: Transfer): return {"charge": state["charge"]}
    """
    o = PhasedOptions("idempotent_phases", scope, phases, **options)

    def decorate(endpoint: Endpoint) -> Endpoint:
        if not inspect.iscoroutinefunction(endpoint):
            raise TypeError("@idempotent_phases needs an async endpoint (it runs on an AsyncConnectionPool)")
        sig = inspect.signature(endpoint)
        if "state" not in sig.parameters:
            raise TypeError("@idempotent_phases: the endpoint takes the final state as its `state` parameter")
        params = [p for n, p in sig.parameters.items() if n != "state"]
        own = next((p.name for p in params if isinstance(p.annotation, type)
                    and issubclass(p.annotation, Request)), None)
        if own is None:
            params.append(inspect.Parameter(_REQ, inspect.Parameter.KEYWORD_ONLY, annotation=Request))
        sub = next((p.name for p in params if isinstance(p.annotation, type)
                    and issubclass(p.annotation, Response)), None)

        @functools.wraps(endpoint)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            request: Request = kwargs[own] if own else kwargs.pop(_REQ)
            try:
                key = parse_key(request.headers.getlist("idempotency-key"))
            except InvalidKey as e:
                title = "Idempotency-Key missing" if isinstance(e, MissingKey) else "Invalid Idempotency-Key"
                return _send(problem(400, title, str(e)))
            path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            fingerprint = request_json(request.method, path, await request.body())
            scope_ = o.scope_for(request)
            fresh: List[Captured] = []

            async def respond(state: State) -> Json:
                try:
                    result = await endpoint(*args, state=state, **kwargs)
                except HTTPException as e:
                    result = JSONResponse({"detail": e.detail}, status_code=e.status_code,
                                          headers=e.headers)
                if not isinstance(result, Response):
                    result = await _serialize(request, result, kwargs.get(sub) if sub else None,
                                              status_code)
                body = getattr(result, "body", None)
                if body is None:
                    raise TypeError("a streamed response cannot be stored for replay")
                got = Captured(result.status_code, result.headers.get, bytes(body), result)
                stored = o.stored(got)
                fresh.append(got)
                return stored

            try:
                r = await run_phases_async(pool, key, o.phases, respond, scope=scope_,
                                           request=fingerprint, lease_seconds=o.lease_seconds,
                                           renew_every_seconds=o.renew_every_seconds,
                                           ttl_seconds=o.ttl_seconds, failure=failure, req=request)
            except Exception as e:
                ra = await AsyncGuard(pool, Options(scope))._retry_after(key, scope_) \
                    if sqlstate_of(e) == "IK002" else "1"
                answer = outcome_answer(e, lambda: ra)
                if answer is None:
                    raise
                return _send(answer)
            if r.outcome != "replay" and fresh:
                return fresh[-1].original
            return _send(result_answer(r.outcome, r.response, r.status))

        setattr(wrapper, "__signature__", sig.replace(parameters=params))
        return wrapper  # type: ignore[return-value]

    return decorate
