"""Drivers for ``pg_idempotency.core.run``: psycopg 3 and psycopg2.

Each function opens one guarded transaction on a connection and yields a
``core.Transaction``.  Whatever state the connection is in:

    idle, autocommit or not   BEGIN ... COMMIT (ROLLBACK on an exception or
                              set_rollback())
    inside a transaction      SAVEPOINT ... RELEASE (ROLLBACK TO on an
                              exception or set_rollback()); ``nested``: run()
                              never retries 40001/40P01 there

    from pg_idempotency import Options, run
    from pg_idempotency.drivers import psycopg2_transaction

    answer = run(lambda: psycopg2_transaction(conn), key, "payments",
                 {"method": "POST", "path": "/payments", "body": body},
                 work, Options("payments"))

A SQLAlchemy ``Session`` (psycopg2, or psycopg 3 on SQLAlchemy 2):
``sqlalchemy_transaction(session)``: ``session.begin()`` when the session has
no transaction, ``session.begin_nested()`` (a savepoint, ``nested``) when it
has; the ORM's flushes and the guard's statements share the connection.

The drivers are imported only when one of these is called: the package
needs neither.
"""
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence

__all__ = ["psycopg_transaction", "psycopg_pool_transaction", "psycopg2_transaction",
           "sqlalchemy_transaction"]

_SAVEPOINT = "pg_idempotency_guard"


class _Tx:
    """A core.Transaction over a DB-API cursor factory."""

    def __init__(self, connection: Any, nested: bool) -> None:
        self.connection = connection
        self.nested = nested
        self.rollback_only = False

    def execute(self, sql: str, params: Sequence[Any]) -> Optional[Sequence[Any]]:
        cur = self.connection.cursor()
        try:
            cur.execute(sql, tuple(params))
            row: Optional[Sequence[Any]] = cur.fetchone() if cur.description else None
            return row
        finally:
            cur.close()

    def set_rollback(self) -> None:
        self.rollback_only = True


@contextmanager
def psycopg_transaction(conn: Any) -> Iterator[_Tx]:
    """psycopg 3 (sync) connection: ``conn.transaction()``, which is BEGIN
    ... COMMIT on an idle connection (autocommit or not) and a savepoint
    inside an open transaction."""
    import psycopg
    from psycopg.pq import TransactionStatus

    nested = conn.info.transaction_status != TransactionStatus.IDLE
    with conn.transaction() as t:
        tx = _Tx(conn, nested)
        yield tx
        if tx.rollback_only:
            raise psycopg.Rollback(t)


@contextmanager
def psycopg_pool_transaction(pool: Any) -> Iterator[_Tx]:
    """A connection from a psycopg_pool.ConnectionPool, for one guarded
    transaction (``psycopg_transaction``), then back to the pool."""
    with pool.connection() as conn:
        with psycopg_transaction(conn) as tx:
            yield tx


@contextmanager
def psycopg2_transaction(conn: Any) -> Iterator[_Tx]:
    """psycopg2 connection: BEGIN ... COMMIT when idle (``conn.commit()``,
    or explicit statements in autocommit mode), a savepoint inside an open
    transaction."""
    from psycopg2 import extensions

    status = conn.info.transaction_status
    if status == extensions.TRANSACTION_STATUS_INERROR:
        raise RuntimeError("the connection's transaction is aborted; roll it back first")
    nested = status != extensions.TRANSACTION_STATUS_IDLE
    explicit = conn.autocommit and not nested
    tx = _Tx(conn, nested)

    def end(commit: bool) -> None:
        if nested:
            tx.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}" if commit
                       else f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}", ())
            if not commit:
                tx.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}", ())
        elif explicit:
            tx.execute("COMMIT" if commit else "ROLLBACK", ())
        elif commit:
            conn.commit()
        else:
            conn.rollback()

    if nested:
        tx.execute(f"SAVEPOINT {_SAVEPOINT}", ())
    elif explicit:
        tx.execute("BEGIN", ())
    # else psycopg2 opens the transaction with the first statement
    try:
        yield tx
    except BaseException:
        try:
            end(False)
        except Exception:	# the connection is gone: the original error says why
            pass
        raise
    end(not tx.rollback_only)


class _Rollback(Exception):
    """Ends a SQLAlchemy transaction block by rolling it back."""


class _SessionTx(_Tx):
    """A core.Transaction on a SQLAlchemy Session: statements on its DB-API
    connection (in the session's transaction), %s parameters."""

    def __init__(self, session: Any, nested: bool) -> None:
        super().__init__(session.connection().connection, nested)
        self.session = session

    def execute(self, sql: str, params: Sequence[Any]) -> Optional[Sequence[Any]]:
        self.session.flush()	# the ORM's pending writes first, in order
        return super().execute(sql, params)


@contextmanager
def sqlalchemy_transaction(session: Any) -> Iterator[_Tx]:
    """A SQLAlchemy ``Session``: ``session.begin()`` (committed at the end),
    or ``session.begin_nested()`` inside the session's open transaction.
    ``tx.session`` is the session the work uses."""
    nested = bool(session.in_transaction())
    try:
        with (session.begin_nested() if nested else session.begin()):
            tx = _SessionTx(session, nested)
            yield tx
            if tx.rollback_only:
                raise _Rollback
    except _Rollback:
        pass
