"""The guarded transaction on psycopg 3, sync (``Guard``) and async
(``AsyncGuard``): the same steps, written twice.

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
import random
import time
import asyncio
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

import psycopg
from psycopg.types.json import Jsonb

from ._core import (Answer, BEGIN_SQL, COMPLETE_SQL, HAS_LOOKUP_SQL, LOCK_WAIT_SQL,
                    LOOKUP_SQL, RETRYABLE, decode_response, encode_response, problem)

_has_lookup = weakref.WeakKeyDictionary()	# pool -> bool, asked once per pool


@dataclass
class Captured:
    status: int
    get_header: Callable[[str], Optional[str]]
    body: bytes
    original: Any = None


def _error_answer(e: psycopg.Error, retry_after: str) -> Optional[Answer]:
    if e.sqlstate == "IK001":
        return problem(422, "Idempotency-Key reused",
                       "This Idempotency-Key was used with a different request.")
    if e.sqlstate == "IK002":
        return problem(409, "Idempotency-Key in use",
                       "A request with this Idempotency-Key is being processed; retry later.",
                       Retry_After=retry_after)
    if e.sqlstate == "IK003":
        return problem(400, "Invalid Idempotency-Key", str(e.diag.message_primary))
    return None


def _backoff(attempt: int) -> float:
    return (5 * (attempt + 1) + random.random() * 20) / 1000


class Guard:
    def __init__(self, pool, options):
        self.pool = pool
        self.o = options

    def _retry_after(self, conn, key, scope) -> str:
        try:
            with conn.transaction():
                if self.pool not in _has_lookup:
                    _has_lookup[self.pool] = conn.execute(HAS_LOOKUP_SQL).fetchone()[0]
                if _has_lookup[self.pool]:
                    row = conn.execute(LOOKUP_SQL, (key, scope)).fetchone()
                    if row and row[0] and row[0] > 0:
                        return str(int(row[0]))
        except psycopg.Error:
            pass
        return "1"

    def run(self, key: str, scope: str, request, work) -> Answer:
        for attempt in range(self.o.retries + 1):
            with self.pool.connection() as conn:
                try:
                    # conn.transaction(): BEGIN ... COMMIT whether the pool's
                    # connections are in autocommit or not; psycopg.Rollback
                    # leaves it rolled back, any exception rolls it back
                    with conn.transaction() as tx:
                        conn.execute(LOCK_WAIT_SQL, (self.o.lock_wait,))
                        b = conn.execute(BEGIN_SQL, (key, Jsonb(request), scope, self.o.ttl)).fetchone()
                        if b[0] == "replay":
                            answer = decode_response(b[2], b[1])
                            raise psycopg.Rollback(tx)
                        got = work(conn)
                        answer = Answer(got.status, original=got.original)
                        if not self.o.store(got.status):
                            raise psycopg.Rollback(tx)
                        stored = encode_response(got.status, got.get_header, got.body,
                                                 self.o.header_names)
                        conn.execute(COMPLETE_SQL, (key, Jsonb(stored), scope))
                    return answer
                except psycopg.Error as e:
                    if e.sqlstate in RETRYABLE and attempt < self.o.retries:
                        time.sleep(_backoff(attempt))
                        continue
                    if e.sqlstate in RETRYABLE:
                        return problem(503, "Try again", str(e.diag.message_primary), Retry_After="1")
                    answer = _error_answer(
                        e, self._retry_after(conn, key, scope) if e.sqlstate == "IK002" else "1")
                    if answer is None:
                        raise
                    return answer
        raise AssertionError("unreachable")


class AsyncGuard:
    def __init__(self, pool, options):
        self.pool = pool
        self.o = options

    async def _retry_after(self, conn, key, scope) -> str:
        try:
            async with conn.transaction():
                if self.pool not in _has_lookup:
                    _has_lookup[self.pool] = (await (await conn.execute(HAS_LOOKUP_SQL)).fetchone())[0]
                if _has_lookup[self.pool]:
                    row = await (await conn.execute(LOOKUP_SQL, (key, scope))).fetchone()
                    if row and row[0] and row[0] > 0:
                        return str(int(row[0]))
        except psycopg.Error:
            pass
        return "1"

    async def run(self, key: str, scope: str, request, work) -> Answer:
        for attempt in range(self.o.retries + 1):
            async with self.pool.connection() as conn:
                try:
                    async with conn.transaction() as tx:
                        await conn.execute(LOCK_WAIT_SQL, (self.o.lock_wait,))
                        cur = await conn.execute(BEGIN_SQL, (key, Jsonb(request), scope, self.o.ttl))
                        b = await cur.fetchone()
                        if b[0] == "replay":
                            answer = decode_response(b[2], b[1])
                            raise psycopg.Rollback(tx)
                        got = await work(conn)
                        answer = Answer(got.status, original=got.original)
                        if not self.o.store(got.status):
                            raise psycopg.Rollback(tx)
                        stored = encode_response(got.status, got.get_header, got.body,
                                                 self.o.header_names)
                        await conn.execute(COMPLETE_SQL, (key, Jsonb(stored), scope))
                    return answer
                except psycopg.Error as e:
                    if e.sqlstate in RETRYABLE and attempt < self.o.retries:
                        await asyncio.sleep(_backoff(attempt))
                        continue
                    if e.sqlstate in RETRYABLE:
                        return problem(503, "Try again", str(e.diag.message_primary), Retry_After="1")
                    answer = _error_answer(
                        e, await self._retry_after(conn, key, scope) if e.sqlstate == "IK002" else "1")
                    if answer is None:
                        raise
                    return answer
        raise AssertionError("unreachable")
