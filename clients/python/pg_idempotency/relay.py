"""Outbox relays on psycopg 3: deliver the messages of a topic that
``idempotency.publish()`` recorded, and a webhook deliverer.

``relay(topic, handler, options)`` claims as many messages as it has free
workers (``idempotency.claim``, with a visibility
timeout), runs ``handler(message)`` on up to ``options.concurrency`` of them
in threads, and acks each one whose handler returned (``idempotency.ack``) or
nacks it with the exception (``idempotency.nack``: retried with backoff, or
after ``RelayError.retry_in_seconds``; dead after the topic's max_attempts).
It claims again at once while claims return messages; when one returns none
it blocks in ``idempotency.wait_for()`` on a connection of its own until a
transaction that published to the topic commits (woken through the server's
shared memory: no LISTEN/NOTIFY; works through PgBouncer in transaction
mode), or ``poll_interval_seconds`` pass (retries that come due).  It passes
back the cursor wait_for() returned, read before its claim, so a commit
between an empty claim and the wait is not missed.  On a server without the
preloaded library (wait_for() raises 55000) it polls every
``poll_interval_seconds`` instead.  A key's messages arrive one at a time in commit
order.

Delivery is at least once (a relay that dies loses nothing: its claims lapse
after ``visibility_seconds`` and are handed out again), so the receiver must be
idempotent: ``message.message_id`` is the key to use.

``relay()`` blocks until ``Relay.stop()`` or SIGTERM/SIGINT (when called in
the main thread and ``handle_signals``): it stops claiming, lets the handlers
in hand finish and settle, and returns the Relay (see ``counts``); a wait in
progress is cancelled.  Database errors are reported to ``on_error`` and
retried after ``retry_delay_seconds``.

``webhook(url)`` returns a handler that POSTs the payload as JSON with
``Idempotency-Key: <message id>`` (urllib, no extra dependency); anything but
a 2xx answer raises ``WebhookError`` (with ``retry_in_seconds`` from Retry-After).
"""
from __future__ import annotations

import json
import os
import re
import select
import signal
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from types import FrameType
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

import psycopg

from ._compat import check as check_extension
from .core import seconds_option

__all__ = ["Message", "Relay", "RelayError", "RelayOptions", "WebhookError", "relay", "webhook"]

TOPIC_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,40}$")

CLAIM_SQL = (
    "SELECT id, message_id::text, topic, message_key, payload, headers, attempt,"
    " published_at, claim::text"
    " FROM idempotency.claim(%s, %s, make_interval(secs => %s))"
)
ACK_SQL = "SELECT idempotency.ack(%s::uuid, ARRAY[%s]::int8[])"
WAIT_SQL = (
    "SELECT cursor FROM idempotency.wait_for(ARRAY[%s::text], make_interval(secs => %s),"
    " %s::int8[])"
)
NACK_SQL = (
    "SELECT idempotency.nack(%s::uuid, ARRAY[%s]::int8[], %s::jsonb,"
    " CASE WHEN %s::float8 IS NULL THEN NULL ELSE make_interval(secs => %s::float8) END)"
)


@dataclass(frozen=True)
class Message:
    """One claimed outbox message."""

    id: int
    message_id: str
    topic: str
    key: Optional[str]
    payload: Any
    headers: Dict[str, str]
    attempt: int
    published_at: datetime
    claim: str


class RelayError(Exception):
    """Raise it from a handler to choose when the message is retried:
    ``retry_in_seconds`` (``retry_in``: its deprecated 0.5.0 name, seconds
    too; both attributes hold the value)."""

    def __init__(self, message: str, retry_in_seconds: Optional[float] = None, *,
                 retry_in: Optional[float] = None) -> None:
        super().__init__(message)
        secs = seconds_option("RelayError", "retry_in_seconds", retry_in_seconds, "retry_in",
                              retry_in)
        self.retry_in_seconds = secs
        self.retry_in = secs


class WebhookError(RelayError):
    """A webhook answered something other than 2xx, or nothing."""

    def __init__(self, message: str, status: Optional[int] = None,
                 retry_in_seconds: Optional[float] = None, body: str = "") -> None:
        super().__init__(message, retry_in_seconds)
        self.status = status
        self.body = body


Handler = Callable[[Message], object]


_RENAMED = (("visibility_seconds", "visibility", 30.0), ("poll_interval_seconds", "poll_interval", 5.0),
            ("retry_delay_seconds", "retry_delay", 1.0))


@dataclass
class RelayOptions:
    """How a relay connects and paces itself.  Durations are seconds (int
    or float), in names that end in ``_seconds``: ``visibility_seconds``
    (30: how long a claim keeps a message from other relays),
    ``poll_interval_seconds`` (5: the longest wait for a commit before
    claiming again), ``retry_delay_seconds`` (1: after a database error).
    ``visibility``, ``poll_interval`` and ``retry_delay`` are their
    deprecated 0.5.0 names (seconds too; a DeprecationWarning, moved to the
    new name when the options are made)."""

    conninfo: str = ""
    batch_size: int = 10
    concurrency: int = 4
    visibility_seconds: Optional[float] = None
    poll_interval_seconds: Optional[float] = None
    retry_delay_seconds: Optional[float] = None
    handle_signals: bool = True
    on_error: Optional[Callable[[BaseException], None]] = None
    connect_kwargs: Dict[str, Any] = field(default_factory=dict)
    visibility: Optional[float] = None
    poll_interval: Optional[float] = None
    retry_delay: Optional[float] = None

    def __post_init__(self) -> None:
        for name, old, default in _RENAMED:
            v = seconds_option("RelayOptions", name, getattr(self, name), old, getattr(self, old), 4)
            setattr(self, name, default if v is None else v)
            setattr(self, old, None)

    def durations(self) -> Tuple[float, float, float]:
        """(visibility, poll interval, retry delay) in seconds."""
        self.__post_init__()	# fields set after the options were made
        v, p, r = self.visibility_seconds, self.poll_interval_seconds, self.retry_delay_seconds
        assert v is not None and p is not None and r is not None
        return v, p, r


class Relay:
    """A relay of one topic; ``run()`` blocks until ``stop()``."""

    def __init__(self, topic: str, handler: Handler, options: Optional[RelayOptions] = None) -> None:
        if not TOPIC_RE.match(topic):
            raise ValueError("relay: topic must be 1 to 40 of A-Z a-z 0-9 _ . : -")
        self.topic = topic
        self.handler = handler
        self.options = options or RelayOptions()
        o = self.options
        self._visibility, self._poll_interval, self._retry_delay = o.durations()
        for name in ("batch_size", "concurrency", "visibility_seconds", "poll_interval_seconds",
                     "retry_delay_seconds"):
            if not getattr(o, name) > 0:
                raise ValueError(f"relay: {name} must be positive")
        self.counts: Dict[str, int] = {"claimed": 0, "acked": 0, "nacked": 0, "errors": 0}
        self._stopping = False
        self._lock = threading.Lock()
        self._running = 0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._work: Optional[psycopg.Connection[Any]] = None
        self._waiter: Optional[psycopg.Connection[Any]] = None  # wait_for() blocks here
        self._waiting = False
        self._cursor: Optional[Any] = None  # wait_for()'s cursor
        self._polling = False  # no wait_for() on this server: poll

    # -- control ----------------------------------------------------------
    def stop(self) -> None:
        """Stop claiming; run() returns once the handlers in hand settle.
        Safe from a signal handler and from other threads."""
        self._stopping = True
        self._poke()
        waiter = self._waiter
        if self._waiting and waiter is not None:
            try:
                waiter.cancel()  # PQcancel: safe from a signal handler and other threads
            except Exception:
                pass

    def _poke(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _report(self, err: BaseException) -> None:
        self.counts["errors"] += 1
        if self.options.on_error is not None:
            try:
                self.options.on_error(err)
            except Exception:
                pass

    # -- connections ------------------------------------------------------
    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.options.conninfo, autocommit=True, **self.options.connect_kwargs)

    def _ensure(self) -> None:
        if self._work is None or self._work.closed or self._work.broken:
            self._work = self._connect()
            work = self._work
            check_extension(work, lambda sql: work.execute(sql).fetchone())
        if self._waiter is None or self._waiter.closed or self._waiter.broken:
            self._waiter = self._connect()
            self._cursor = None

    def _drop(self) -> None:
        for conn in (self._work, self._waiter):
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass
        self._work = self._waiter = None
        self._cursor = None

    # -- waiting ----------------------------------------------------------
    def _wait(self, timeout: float) -> None:
        """Until a poke (stop, a free worker) or timeout."""
        ready, _, _ = select.select([self._wake_r], [], [], timeout)
        if self._wake_r in ready:
            os.read(self._wake_r, 4096)

    def _wait_for(self, timeout: float) -> None:
        """Until a commit that published to the topic since the cursor, or
        timeout (0: just read the cursor); stop() cancels it."""
        assert self._waiter is not None
        self._waiting = True
        try:
            if self._stopping:
                return
            row = self._waiter.execute(WAIT_SQL, (self.topic, timeout, self._cursor)).fetchone()
            self._cursor = row[0] if row is not None else None
        except psycopg.errors.ObjectNotInPrerequisiteState as err:
            self._polling = True  # the server lacks the preloaded library
            self._report(err)
        except psycopg.errors.QueryCanceled:
            if not self._stopping:
                raise
        finally:
            self._waiting = False

    # -- the loop ---------------------------------------------------------
    def run(self) -> "Relay":
        """Deliver until stop(); returns self."""
        o = self.options
        previous: Dict[int, Any] = {}
        if o.handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        pool = ThreadPoolExecutor(max_workers=o.concurrency, thread_name_prefix="relay")
        try:
            while not self._stopping:
                try:
                    self._ensure()
                    if not self._polling and self._cursor is None:
                        self._wait_for(0)
                    with self._lock:
                        free = o.concurrency - self._running
                    if free <= 0:
                        self._wait(self._poll_interval)
                        continue
                    assert self._work is not None
                    rows = self._work.execute(
                        CLAIM_SQL, (self.topic, min(o.batch_size, free), self._visibility)).fetchall()
                    self.counts["claimed"] += len(rows)
                    for row in rows:
                        msg = Message(id=int(row[0]), message_id=row[1], topic=row[2], key=row[3],
                                      payload=row[4], headers=dict(row[5] or {}), attempt=int(row[6]),
                                      published_at=row[7], claim=row[8])
                        with self._lock:
                            self._running += 1
                        pool.submit(self._deliver, msg)
                    if not rows and not self._stopping:
                        if self._polling:
                            self._wait(self._poll_interval)
                        else:
                            self._wait_for(self._poll_interval)
                except psycopg.Error as err:
                    if self._stopping:
                        break
                    self._report(err)
                    if self._work is not None and self._work.broken or \
                            self._waiter is not None and self._waiter.broken:
                        self._drop()
                    self._wait(self._retry_delay)
        finally:
            pool.shutdown(wait=True)
            self._drop()
            for signum, old in previous.items():
                signal.signal(signum, old)
            os.close(self._wake_r)
            os.close(self._wake_w)
        return self

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        self.stop()

    def _deliver(self, msg: Message) -> None:
        failure: Optional[BaseException] = None
        try:
            self.handler(msg)
        except Exception as err:
            failure = err
        try:
            self._settle(msg, failure)
        finally:
            with self._lock:
                self._running -= 1
            self._poke()

    def _settle(self, msg: Message, failure: Optional[BaseException]) -> None:
        """ack or nack; on a database error the claim lapses and the message
        is delivered again (at least once)."""
        for _ in range(5):
            try:
                conn = self._work
                if conn is None or conn.closed or conn.broken:
                    conn = self._connect()
                    close_after = True
                else:
                    close_after = False
                try:
                    if failure is None:
                        conn.execute(ACK_SQL, (msg.claim, msg.id))
                        self.counts["acked"] += 1
                    else:
                        retry_in = getattr(failure, "retry_in_seconds", None)
                        if retry_in is None:
                            retry_in = getattr(failure, "retry_in", None)
                        err: Dict[str, Any] = {"error": str(failure)}
                        status = getattr(failure, "status", None)
                        if status is not None:
                            err["status"] = status
                        conn.execute(NACK_SQL, (msg.claim, msg.id, json.dumps(err), retry_in, retry_in))
                        self.counts["nacked"] += 1
                finally:
                    if close_after:
                        conn.close()
                return
            except psycopg.Error as err:
                self._report(err)
                if self._stopping:
                    return
                threading.Event().wait(self._retry_delay)


def relay(topic: str, handler: Handler, options: Optional[RelayOptions] = None) -> Relay:
    """Deliver the messages of topic to handler until stopped (SIGTERM)."""
    return Relay(topic, handler, options).run()


def webhook(url: Union[str, Callable[[Message], str]], timeout_seconds: Optional[float] = None,
            headers: Optional[Mapping[str, str]] = None, *,
            timeout: Optional[float] = None) -> Callable[[Message], int]:
    """A handler that POSTs message.payload as JSON to url with
    Idempotency-Key: message.message_id; returns the HTTP status (2xx),
    raises WebhookError otherwise.  ``timeout_seconds`` (10): how long it
    waits for an answer (``timeout``: its deprecated 0.5.0 name)."""
    extra = dict(headers or {})
    secs = seconds_option("webhook", "timeout_seconds", timeout_seconds, "timeout", timeout)
    wait = 10.0 if secs is None else secs

    def deliver(msg: Message) -> int:
        target = url(msg) if callable(url) else url
        h: Dict[str, str] = {"Content-Type": "application/json"}
        h.update(msg.headers)
        h.update(extra)
        h["Idempotency-Key"] = msg.message_id
        req = urllib.request.Request(target, data=json.dumps(msg.payload).encode(), headers=h,
                                     method="POST")
        try:
            with urllib.request.urlopen(req, timeout=wait) as res:
                res.read()
                status: int = res.status
                return status
        except urllib.error.HTTPError as e:
            body = e.read().decode("utf-8", "replace")[:1000]
            retry_in: Optional[float] = None
            ra = e.headers.get("Retry-After") if e.headers is not None else None
            if ra is not None and ra.strip().isdigit():
                retry_in = float(ra)
            raise WebhookError(f"webhook: HTTP {e.code}", status=e.code, retry_in_seconds=retry_in,
                               body=body) from None
        except (urllib.error.URLError, OSError) as e:
            raise WebhookError(f"webhook: {e}") from None

    return deliver

