"""The sync phase runner, driver-neutral: ``run_phases`` (psycopg 3 pools,
``pg_idempotency.phases``) and the Django integration
(``pg_idempotency.django.idempotent_phases``, Django's own connection:
psycopg2 or psycopg 3) both run their phases here, on a factory of
``core.Transaction`` (``drivers.psycopg_pool_transaction``,
``django.django_transaction``).  Imports no driver.

The steps are ``pg_idempotency.phases``'s (its docstring): begin() in a
transaction of its own (committing the lease), each phase in its own
transaction with its checkpoint (an external phase outside any, then its
checkpoint), complete() in the last phase's transaction, fail() when a
phase raises; the lease renewed by a thread meanwhile.  Every statement
takes its JSON as text (``%s::jsonb``) and returns jsonb however the driver
gives it (parsed or text).
"""
from __future__ import annotations

import json
import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from ._compat import check as check_extension
from .core import Transaction, _load_json

Json = Union[None, bool, int, float, str, List[Any], Dict[str, Any]]
State = Dict[str, Json]
Transactions = Callable[[], "AbstractContextManager[Transaction]"]

BEGIN_SQL = ("SELECT outcome, status, response, attempts, recovery_point, recovery_state"
             " FROM idempotency.begin(%s, %s::jsonb, %s, %s::interval, %s::interval)")
CHECKPOINT_SQL = "SELECT idempotency.checkpoint(%s, %s, %s::jsonb, %s, %s)"
COMPLETE_SQL = "SELECT idempotency.complete(%s, %s::jsonb, %s, %s)"
FAIL_SQL = "SELECT idempotency.fail(%s, %s::jsonb, %s, %s, %s)"
RENEW_SQL = "SELECT idempotency.renew(%s, %s::interval, %s, %s)"
DERIVE_SQL = "SELECT idempotency.derive_key(%s, %s, %s)"


class PhaseError(Exception):
    """A phase's failure; ``permanent=True`` ends the request for good.

    ``status`` and ``body``: the HTTP answer the framework integrations
    (``idempotent_phases``) store and replay for a permanent error (default
    400 and ``{"error": message}``, sent as JSON)."""

    def __init__(self, message: str, *, permanent: bool = False, status: Optional[int] = None,
                 body: Json = None) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.status = status
        self.body = body


@dataclass
class PhaseContext:
    """What a phase's ``run`` gets."""
    conn: Any                                 # in the phase's transaction (a psycopg
                                              # Connection from run_phases, Django's
                                              # connection from the Django integration);
                                              # None for an external phase
    state: State                              # results of the phases before this one
    request: Json                             # the request fingerprinted
    key: str
    scope: str
    attempt: int
    outcome: str                              # "new" or "retry"
    derive_key: Callable[[str], str]
    taken_over: threading.Event
    req: Any = None                           # the framework's request (idempotent_phases)


@dataclass(frozen=True)
class Phase:
    name: str
    run: Callable[[PhaseContext], Json]
    external: bool = False


@dataclass(frozen=True)
class PhasesResult:
    outcome: str                  # "new", "retry" or "replay"
    response: Json
    attempts: int
    resumed_from: Optional[str]   # the recovery point this run started after
    status: Optional[str] = None  # for a replay: "completed" or "failed"


def _dumps(v: Any) -> str:
    return json.dumps(v)


@dataclass
class _Renewer:
    transactions: Transactions
    key: str
    scope: str
    attempt: int
    lease: timedelta
    every: float
    thread_exit: Optional[Callable[[], None]] = None
    taken_over: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def loop(self) -> None:
        try:
            while not self.stop.wait(self.every):
                try:
                    with self.transactions() as tx:
                        tx.execute(RENEW_SQL, (self.key, self.lease, self.attempt, self.scope))
                except Exception as e:
                    from .core import sqlstate_of
                    if sqlstate_of(e) == "IK004":
                        self.taken_over.set()
                        return
        finally:
            if self.thread_exit is not None:
                self.thread_exit()


def default_failure(err: BaseException, permanent: bool) -> Json:
    """What fail() stores for a phase that raised: ``{"error": str(err)}``."""
    return {"error": str(err)}


def run_phases_on(transactions: Transactions, key: str, phases: Sequence[Phase],
                  response: Callable[[State], Json], *, who: str, scope: str, request: Json,
                  lease: float, renew_every: Optional[float], ttl: Optional[float],
                  after_commit: Optional[Callable[[str], None]] = None,
                  failure: Callable[[BaseException, bool], Json] = default_failure,
                  renew_transactions: Optional[Transactions] = None,
                  renew_thread_exit: Optional[Callable[[], None]] = None,
                  req: Any = None) -> PhasesResult:
    """``run_phases`` on ``transactions()`` (each a ``core.Transaction`` on
    one connection); durations in seconds, already checked.  The renewing
    thread uses ``renew_transactions`` (default ``transactions``) and calls
    ``renew_thread_exit`` when it ends (Django: close that thread's
    connection).  ``failure(err, permanent)``: what fail() stores."""
    names = [p.name for p in phases]
    if not phases:
        raise ValueError(f"{who}: phases must not be empty")
    if any(not n for n in names) or len(set(names)) != len(names):
        raise ValueError(f"{who}: phase names must be unique and not empty")
    lease_td = timedelta(seconds=lease)
    hook: Callable[[str], None] = after_commit or (lambda name: None)

    with transactions() as tx:
        if tx.nested:
            raise RuntimeError(f"{who}: phases commit one by one and cannot run inside an open "
                               "transaction (ATOMIC_REQUESTS, atomic(), a TestCase)")
        check_extension(tx.connection, lambda sql: tx.execute(sql, ()))
        row = tx.execute(BEGIN_SQL, (key, None if request is None else _dumps(request), scope,
                                     None if ttl is None else timedelta(seconds=ttl), lease_td))
    assert row is not None
    outcome, status, stored, attempt, point, saved = row
    if outcome == "replay":
        return PhasesResult("replay", _load_json(stored), attempt, point, status)
    hook("(begin)")

    start = 0
    state: State = {}
    if outcome == "retry" and point is not None:
        if point not in names:
            raise PhaseError(f'recovery point "{point}" is not one of the phases ({", ".join(names)})')
        start = names.index(point) + 1
        saved = _load_json(saved)
        state = dict(saved) if isinstance(saved, dict) else {}

    renewer = _Renewer(renew_transactions or transactions, key, scope, attempt, lease_td,
                       renew_every if renew_every is not None else max(0.05, lease / 3),
                       renew_thread_exit)
    thread = threading.Thread(target=renewer.loop, daemon=True)
    thread.start()
    derived: Dict[str, str] = {}

    def derive_key(step: str) -> str:
        if step not in derived:
            with transactions() as t:
                r = t.execute(DERIVE_SQL, (key, step, scope))
            assert r is not None
            derived[step] = str(r[0])
        return derived[step]

    def ctx(conn: Any) -> PhaseContext:
        return PhaseContext(conn, state, request, key, scope, attempt, outcome,
                            derive_key, renewer.taken_over, req)

    out: Json = None
    try:
        if start == len(phases):	# resumed after the last phase, before complete()
            with transactions() as tx:
                out = response(state)
                tx.execute(COMPLETE_SQL, (key, _dumps(out), scope, attempt))
            hook("(complete)")
        for i in range(start, len(phases)):
            phase = phases[i]
            last = i == len(phases) - 1
            if phase.external:
                result = phase.run(ctx(None))
                state = {**state, phase.name: result}
                with transactions() as tx:
                    if last:
                        out = response(state)
                        tx.execute(COMPLETE_SQL, (key, _dumps(out), scope, attempt))
                    else:
                        tx.execute(CHECKPOINT_SQL, (key, phase.name, _dumps(state), attempt, scope))
            else:
                with transactions() as tx:
                    result = phase.run(ctx(tx.connection))
                    state = {**state, phase.name: result}
                    if last:
                        out = response(state)
                        tx.execute(COMPLETE_SQL, (key, _dumps(out), scope, attempt))
                    else:
                        tx.execute(CHECKPOINT_SQL, (key, phase.name, _dumps(state), attempt, scope))
            hook("(complete)" if last else phase.name)
        return PhasesResult(outcome, out, attempt, point)
    except BaseException as e:
        from .core import sqlstate_of
        taken_over = sqlstate_of(e) == "IK004"
        if not taken_over and not renewer.taken_over.is_set() and isinstance(e, Exception):
            permanent = isinstance(e, PhaseError) and e.permanent
            try:
                stored_failure = failure(e, permanent)
            except Exception:
                stored_failure = default_failure(e, permanent)
            try:
                with transactions() as tx:
                    tx.execute(FAIL_SQL, (key, _dumps(stored_failure), scope, not permanent, attempt))
            except Exception:
                pass
        raise
    finally:
        renewer.stop.set()
        thread.join()
