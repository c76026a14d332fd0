"""Named phases under one idempotency key in lease mode, resumable after a
crash (recovery points: ``idempotency.checkpoint()``), on psycopg 3:
``run_phases`` (sync, ``ConnectionPool``) and ``run_phases_async`` (asyncio,
``AsyncConnectionPool``), the same steps written twice.

    begin(key, request, scope, ttl, lease)          autocommit: commits the lease
      replay -> the stored response; nothing runs
      new    -> every phase runs
      retry  -> the phases up to recovery_point are skipped; state comes back
    for each phase still to run:
      BEGIN; result = phase.run(ctx); checkpoint(key, name, state, attempt)
      COMMIT                                       (the phase's writes and its
                                                    point commit together)
      an ``external`` phase runs outside a transaction (no connection held
      during a slow call) and checkpoints in autocommit after it
    the last phase's transaction calls complete(key, response(state), scope,
    attempt) instead of checkpoint()

State is a dict; each phase's result is stored under its name
(``state["order"]``, ``state["charge"]``) and comes back on a retry.
``ctx.derive_key(step)`` is ``idempotency.derive_key(key, step, scope)``:
the same on every attempt, so another system's Idempotency-Key turns a
repeated call into a replay.  While phases run, a thread renews the lease
every ``renew_every`` seconds (``idempotency.renew``); if the key was taken
over, ``ctx.taken_over`` is set and the next checkpoint is refused (IK004).

A phase that raises rolls its transaction back and the key is failed
retryably, so a resend retries from the last point; raise
``PhaseError(..., permanent=True)`` to end the request for good
(``fail(retryable => false)``, replayed from then on).

Every unit runs in ``conn.transaction()``: pools in autocommit mode or not
both work.

Store the response as the exact bytes to answer with (e.g.
``{"status": 201, "body": json.dumps(...)}``): jsonb reorders object keys,
so a replay of a stored object would not send the same bytes.
"""
from __future__ import annotations

import asyncio
import collections.abc
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Awaitable, Callable, Dict, Optional, Sequence, Tuple, Union

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from ._compat import check_async as check_extension_async
from ._phases import (Json, Phase, PhaseContext, PhaseError, PhasesResult, State,
                      default_failure, run_phases_on)
from .core import _load_json, seconds_option
from .drivers import psycopg_pool_transaction

BEGIN_SQL = ("SELECT outcome, status, response, attempts, recovery_point, recovery_state"
             " FROM idempotency.begin(%s, %s, %s, %s, %s)")
CHECKPOINT_SQL = "SELECT idempotency.checkpoint(%s, %s, %s, %s, %s)"
COMPLETE_SQL = "SELECT idempotency.complete(%s, %s, %s, %s)"
FAIL_SQL = "SELECT idempotency.fail(%s, %s, %s, %s, %s)"
RENEW_SQL = "SELECT idempotency.renew(%s, %s, %s, %s)"
DERIVE_SQL = "SELECT idempotency.derive_key(%s, %s, %s)"


# PhaseError, PhaseContext, Phase, PhasesResult and the sync runner are
# driver-neutral (pg_idempotency._phases: the Django integration runs them on
# Django's connection); run_phases is that runner on a psycopg 3 pool.


def _durations(who: str, lease_seconds: Optional[float], lease: Optional[float],
               renew_every_seconds: Optional[float], renew_every: Optional[float],
               ttl_seconds: Optional[float], ttl: Optional[float]
               ) -> Tuple[float, Optional[float], Optional[float]]:
    """(lease, renew_every, ttl) in seconds, from the ``_seconds`` names or
    their deprecated 0.5.0 names."""
    # a deprecation warning names the caller of run_phases
    got_lease = seconds_option(who, "lease_seconds", lease_seconds, "lease", lease, 4)
    return (30.0 if got_lease is None else got_lease,
            seconds_option(who, "renew_every_seconds", renew_every_seconds, "renew_every",
                           renew_every, 4),
            seconds_option(who, "ttl_seconds", ttl_seconds, "ttl", ttl, 4))


def run_phases(pool: ConnectionPool, key: str, phases: Sequence[Phase],
               response: Callable[[State], Json], *, scope: str = "",
               request: Json = None, lease_seconds: Optional[float] = None,
               renew_every_seconds: Optional[float] = None, ttl_seconds: Optional[float] = None,
               after_commit: Optional[Callable[[str], None]] = None,
               lease: Optional[float] = None, renew_every: Optional[float] = None,
               ttl: Optional[float] = None,
               failure: Optional[Callable[[BaseException, bool], Json]] = None,
               req: Any = None) -> PhasesResult:
    """Run ``phases`` in order under ``key`` (lease mode), resuming after
    the last committed phase on a retry; returns the stored response.
    ``lease_seconds`` (30), ``renew_every_seconds`` (a third of the lease)
    and ``ttl_seconds`` (None: idempotency.default_ttl) are seconds;
    ``lease``, ``renew_every`` and ``ttl`` are their deprecated 0.5.0 names
    (seconds too).  ``after_commit(name)`` is called after each commit:
    "(begin)", a phase's name, "(complete)".  ``failure(err, permanent)``:
    what fail() stores for a phase that raised (default ``{"error":
    str(err)}``); ``req``: handed to every phase as ``ctx.req``.
    IK001/IK002/IK003 propagate as psycopg errors."""
    lease_s, renew_s, ttl_s = _durations("run_phases", lease_seconds, lease, renew_every_seconds,
                                        renew_every, ttl_seconds, ttl)
    return run_phases_on(lambda: psycopg_pool_transaction(pool), key, phases, response,
                         who="run_phases", scope=scope, request=request, lease=lease_s,
                         renew_every=renew_s, ttl=ttl_s, after_commit=after_commit,
                         failure=failure or default_failure, req=req)


# --- asyncio ---------------------------------------------------------------


@dataclass
class AsyncPhaseContext:
    """What an async phase's ``run`` gets (``run_phases_async``)."""
    conn: Optional[psycopg.AsyncConnection[Any]]   # in the phase's transaction; None if external
    state: State
    request: Json
    key: str
    scope: str
    attempt: int
    outcome: str
    derive_key: Callable[[str], Awaitable[str]]
    taken_over: asyncio.Event
    req: Any = None                           # the framework's request (idempotent_phases)


@dataclass(frozen=True)
class AsyncPhase:
    name: str
    run: Callable[[AsyncPhaseContext], Awaitable[Json]]
    external: bool = False


async def _renew_async(pool: AsyncConnectionPool, key: str, scope: str, attempt: int,
                       lease: timedelta, every: float, taken_over: asyncio.Event) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            async with pool.connection() as conn, conn.transaction():
                await conn.execute(RENEW_SQL, (key, lease, attempt, scope))
        except psycopg.Error as e:
            if e.sqlstate == "IK004":
                taken_over.set()
                return


async def _one(conn: Any, sql: str) -> Any:
    return await (await conn.execute(sql)).fetchone()


async def run_phases_async(pool: AsyncConnectionPool, key: str, phases: Sequence[AsyncPhase],
                           response: Callable[[State], Union[Json, Awaitable[Json]]], *, scope: str = "",
                           request: Json = None, lease_seconds: Optional[float] = None,
                           renew_every_seconds: Optional[float] = None,
                           ttl_seconds: Optional[float] = None,
                           after_commit: Optional[Callable[[str], Awaitable[None]]] = None,
                           lease: Optional[float] = None, renew_every: Optional[float] = None,
                           ttl: Optional[float] = None,
                           failure: Optional[Callable[[BaseException, bool], Json]] = None,
                           req: Any = None) -> PhasesResult:
    """``run_phases`` for asyncio: the same steps, phases are coroutines,
    the lease is renewed by a task; ``response`` may be a coroutine
    function too."""
    fail_with = failure or default_failure

    async def respond(state: State) -> Json:
        out = response(state)
        # isinstance narrows the union the same way on every mypy (a cast
        # after inspect.isawaitable() is needed by bookworm's mypy and
        # redundant, so an error under --strict, for sid's)
        if isinstance(out, collections.abc.Awaitable):
            done: Json = await out
            return done
        return out

    names = [p.name for p in phases]
    if not phases:
        raise ValueError("run_phases_async: phases must not be empty")
    if any(not n for n in names) or len(set(names)) != len(names):
        raise ValueError("run_phases_async: phase names must be unique and not empty")
    lease, renew_every, ttl = _durations("run_phases_async", lease_seconds, lease,
                                         renew_every_seconds, renew_every, ttl_seconds, ttl)
    lease_td = timedelta(seconds=lease)

    async def hook(name: str) -> None:
        if after_commit is not None:
            await after_commit(name)

    async with pool.connection() as conn, conn.transaction():
        await check_extension_async(pool, lambda sql: _one(conn, sql))
        cur = await conn.execute(BEGIN_SQL, (key, None if request is None else Jsonb(request), scope,
                                             None if ttl is None else timedelta(seconds=ttl),
                                             lease_td))
        row = await cur.fetchone()
    assert row is not None
    outcome, status, stored, attempt, point, saved = row
    if outcome == "replay":
        return PhasesResult("replay", _load_json(stored), attempt, point, status)
    await hook("(begin)")

    start = 0
    state: State = {}
    if outcome == "retry" and point is not None:
        if point not in names:
            raise PhaseError(f'recovery point "{point}" is not one of the phases ({", ".join(names)})')
        start = names.index(point) + 1
        state = dict(saved) if isinstance(saved, dict) else {}

    taken_over = asyncio.Event()
    renewer = asyncio.create_task(_renew_async(
        pool, key, scope, attempt, lease_td,
        renew_every if renew_every is not None else max(0.05, lease / 3), taken_over))
    derived: Dict[str, str] = {}

    async def derive_key(step: str) -> str:
        if step not in derived:
            async with pool.connection() as c, c.transaction():
                r = await (await c.execute(DERIVE_SQL, (key, step, scope))).fetchone()
            assert r is not None
            derived[step] = str(r[0])
        return derived[step]

    def ctx(conn: Optional[psycopg.AsyncConnection[Any]]) -> AsyncPhaseContext:
        return AsyncPhaseContext(conn, state, request, key, scope, attempt, outcome,
                                 derive_key, taken_over, req)

    out: Json = None
    try:
        if start == len(phases):	# resumed after the last phase, before complete()
            out = await respond(state)
            async with pool.connection() as conn, conn.transaction():
                await conn.execute(COMPLETE_SQL, (key, Jsonb(out), scope, attempt))
            await hook("(complete)")
        for i in range(start, len(phases)):
            phase = phases[i]
            last = i == len(phases) - 1
            if phase.external:
                result = await phase.run(ctx(None))
                state = {**state, phase.name: result}
                async with pool.connection() as conn, conn.transaction():
                    if last:
                        out = await respond(state)
                        await conn.execute(COMPLETE_SQL, (key, Jsonb(out), scope, attempt))
                    else:
                        await conn.execute(CHECKPOINT_SQL,
                                           (key, phase.name, Jsonb(state), attempt, scope))
            else:
                async with pool.connection() as conn, conn.transaction():
                    result = await phase.run(ctx(conn))
                    state = {**state, phase.name: result}
                    if last:
                        out = await respond(state)
                        await conn.execute(COMPLETE_SQL, (key, Jsonb(out), scope, attempt))
                    else:
                        await conn.execute(CHECKPOINT_SQL,
                                           (key, phase.name, Jsonb(state), attempt, scope))
            await hook("(complete)" if last else phase.name)
        return PhasesResult(outcome, out, attempt, point)
    except BaseException as e:
        was_taken_over = isinstance(e, psycopg.Error) and e.sqlstate == "IK004"
        if not was_taken_over and not taken_over.is_set() and isinstance(e, Exception):
            permanent = isinstance(e, PhaseError) and e.permanent
            try:
                stored_failure = fail_with(e, permanent)
            except Exception:
                stored_failure = default_failure(e, permanent)
            try:
                async with pool.connection() as conn, conn.transaction():
                    await conn.execute(FAIL_SQL, (key, Jsonb(stored_failure), scope,
                                                  not permanent, attempt))
            except psycopg.Error:
                pass
        raise
    finally:
        renewer.cancel()
        try:
            await renewer
        except asyncio.CancelledError:
            pass


__all__ = ["AsyncPhase", "AsyncPhaseContext", "Json", "Phase", "PhaseContext", "PhaseError",
           "PhasesResult", "State", "run_phases", "run_phases_async"]
