"""The guarded transaction on psycopg 3 pools, sync (``Guard``, on
``core.run`` and ``drivers.psycopg_pool_transaction``) and async
(``AsyncGuard``: the same steps, awaited).  See ``core`` for the steps:

    BEGIN; set_config('idempotency.lock_wait', ..., true)   -- SET LOCAL
    begin(key, request, scope, ttl)
      replay      -> ROLLBACK, the stored answer
      new / retry -> work(conn) on this connection; an answer to store
                     is stored with complete(), then COMMIT
    IK001 -> 422, IK002 -> 409 + Retry-After, IK003 -> 400;
    40001 / 40P01 anywhere: ROLLBACK and run it all again (``retries`` times);
    an answer that ``Options.store`` refuses (by default 408, 409, 425, 429
    and any 5xx) or an exception: ROLLBACK, nothing stored (the exception
    propagates, so the framework answers 500 and a resend runs again).
    The transaction is ``conn.transaction()``: pools in autocommit mode or
    not both work.

``work(conn)`` returns ``Captured(status, get_header, body, original)``.
"""
import asyncio
import json
from typing import Any, Awaitable, Callable, Optional

import psycopg

from ._compat import check_async as check_extension_async
from .core import (BEGIN_SETTING_SQL, COMPLETE_SQL, HAS_LOOKUP_SQL, LOOKUP_SQL, RETRYABLE,
                   SETUP_SQL, Answer, Captured, Options, Transaction, _backoff, decode_response,
                   encode_response, error_answer, fresh_answer, message_of, problem, run,
                   setup_params)
from .drivers import psycopg_pool_transaction

__all__ = ["AsyncGuard", "Captured", "Guard"]


async def _one(conn: Any, sql: str) -> Any:
    return await (await conn.execute(sql)).fetchone()


class Guard:
    """``Guard(pool, options).run(key, scope, request, work)`` on a
    psycopg_pool.ConnectionPool; ``work(conn)`` -> Captured."""

    def __init__(self, pool: Any, options: Options) -> None:
        self.pool = pool
        self.o = options

    def run(self, key: str, scope: str, request: Any,
            work: Callable[[Any], Captured]) -> Answer:
        def on_tx(tx: Transaction) -> Captured:
            return work(tx.connection)

        return run(lambda: psycopg_pool_transaction(self.pool), key, scope, request, on_tx, self.o,
                   compat_key=self.pool)


class AsyncGuard:
    """``await AsyncGuard(pool, options).run(key, scope, request, work)`` on
    a psycopg_pool.AsyncConnectionPool; ``await work(conn)`` -> Captured."""

    def __init__(self, pool: Any, options: Options) -> None:
        self.pool = pool
        self.o = options

    async def _retry_after(self, key: str, scope: str) -> str:
        try:
            async with self.pool.connection() as conn:
                async with conn.transaction() as tx:
                    has = await (await conn.execute(HAS_LOOKUP_SQL)).fetchone()
                    row = None
                    if has and has[0]:
                        row = await (await conn.execute(LOOKUP_SQL, (key, scope))).fetchone()
                    if row and row[0] and row[0] > 0:
                        return str(int(row[0]))
                    raise psycopg.Rollback(tx)
        except psycopg.Error:
            pass
        return "1"

    async def run(self, key: str, scope: str, request: Any,
                  work: Callable[[Any], Awaitable[Captured]]) -> Answer:
        for attempt in range(self.o.retries + 1):
            try:
                async with self.pool.connection() as conn:
                    async with conn.transaction() as tx:
                        await check_extension_async(self.pool, lambda sql: _one(conn, sql))
                        await conn.execute(SETUP_SQL, setup_params(request, self.o))
                        cur = await conn.execute(BEGIN_SETTING_SQL, (key, scope, self.o.ttl))
                        b = await cur.fetchone()
                        if b is None:
                            raise RuntimeError("idempotency.begin() returned no row")
                        if b[0] == "replay":
                            answer = decode_response(b[2], b[1])
                            raise psycopg.Rollback(tx)
                        got = await work(conn)
                        answer = fresh_answer(got, self.o)
                        if not self.o.store(got.status):
                            raise psycopg.Rollback(tx)
                        stored = encode_response(got.status, got.get_header, got.body,
                                                 self.o.header_names)
                        await conn.execute(COMPLETE_SQL, (key, json.dumps(stored), scope))
                return answer
            except psycopg.Error as e:
                if e.sqlstate in RETRYABLE and attempt < self.o.retries:
                    await asyncio.sleep(_backoff(attempt))
                    continue
                if e.sqlstate in RETRYABLE:
                    return problem(503, "Try again", message_of(e), Retry_After="1")
                retry_after = await self._retry_after(key, scope) if e.sqlstate == "IK002" else "1"
                answer_: Optional[Answer] = error_answer(e.sqlstate, message_of(e), retry_after)
                if answer_ is None:
                    raise
                return answer_
        raise AssertionError("unreachable")
