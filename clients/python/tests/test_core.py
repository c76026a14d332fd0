"""Checks of the driver-agnostic core (pg_idempotency.core.run) outside any
web framework, on each driver of pg_idempotency.drivers: psycopg2 and
psycopg 3 connections, each in autocommit mode and not, against the
database (DATABASE_HOST/PORT/NAME/USER, the `payment` table of
test/clients/run).  The same checks for every driver; prints "ok - ..." /
"not ok - ..." lines."""
import json
import os
import sys
import uuid
from typing import Any, Callable, ContextManager, Dict, List, Optional

import psycopg
import psycopg2
from psycopg.conninfo import make_conninfo

from pg_idempotency import Captured, Options, run
from pg_idempotency.core import Transaction, sqlstate_of
from pg_idempotency.drivers import psycopg2_transaction, psycopg_transaction

MODE = "bouncer" if os.environ.get("IDEMPOTENCY_BOUNCER") == "1" else "direct"
conninfo = make_conninfo(host=os.environ["DATABASE_HOST"], port=os.environ["DATABASE_PORT"],
                         dbname=os.environ["DATABASE_NAME"], user=os.environ["DATABASE_USER"])
failed = 0
look = psycopg.connect(make_conninfo(dbname=os.environ["DATABASE_NAME"]), autocommit=True)


def check(desc: str, cond: bool, diag: Any = None) -> None:
    global failed
    failed += not cond
    print(f"{'ok' if cond else 'not ok'} - [python core {MODE}] {desc}", flush=True)
    if not cond and diag is not None:
        print(f"# {diag!r}"[:600], flush=True)


def rows(key: str) -> int:
    r = look.execute("SELECT count(*) FROM payment WHERE idem_key = %s", (key,)).fetchone()
    return int(r[0]) if r else -1


def stored(key: str) -> int:
    r = look.execute("SELECT count(*) FROM idempotency.idempotency_key WHERE key = %s", (key,)).fetchone()
    return int(r[0]) if r else -1


class Driver:
    def __init__(self, name: str, connect: Callable[[], Any],
                 transaction: Callable[[Any], ContextManager[Transaction]], idle: Callable[[Any], bool]):
        self.name, self.connect, self.transaction, self.idle = name, connect, transaction, idle


def pg2(autocommit: bool) -> Callable[[], Any]:
    def connect() -> Any:
        c = psycopg2.connect(conninfo)
        c.autocommit = autocommit
        return c
    return connect


def pg3(autocommit: bool) -> Callable[[], Any]:
    extra: Dict[str, Any] = {"prepare_threshold": None} if MODE == "bouncer" else {}
    return lambda: psycopg.connect(conninfo, autocommit=autocommit, **extra)


drivers = [
    Driver("psycopg2", pg2(False), psycopg2_transaction,
           lambda c: c.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE),
    Driver("psycopg2 autocommit", pg2(True), psycopg2_transaction,
           lambda c: c.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE),
    Driver("psycopg 3", pg3(False), psycopg_transaction,
           lambda c: c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE),
    Driver("psycopg 3 autocommit", pg3(True), psycopg_transaction,
           lambda c: c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE),
]


def insert(tx: Transaction, key: str, status: int = 201, fail: Optional[str] = None,
           calls: Optional[List[int]] = None) -> Captured:
    """The work: an insert on the guarded transaction's connection."""
    if calls is not None:
        calls.append(1)
    row = tx.execute("INSERT INTO payment (idem_key, amount) VALUES (%s, 1) RETURNING id", (key,))
    assert row is not None
    if fail == "error":
        raise RuntimeError("work failed")
    if fail is not None:	# a SQLSTATE raised by the server
        tx.execute("DO $$ BEGIN RAISE EXCEPTION 'test' USING ERRCODE = '%s'; END $$" % fail, ())
    body = json.dumps({"id": row[0]}).encode()
    return Captured(status, {"Content-Type": "application/json"}.get, body)


def req(amount: int) -> Dict[str, Any]:
    return {"method": "POST", "path": "/p", "body": {"amount": amount}}


for d in drivers:
    conn = d.connect()
    tr = (lambda c: (lambda: d.transaction(c)))(conn)
    o = Options("core", lock_wait_ms=50)
    P = f"core-{MODE}-{d.name.replace(' ', '')}-{uuid.uuid4().hex[:6]}-"
    n = d.name

    k = P + "first"
    calls: List[int] = []
    a1 = run(tr, k, "core", req(1), lambda tx: insert(tx, k, calls=calls), o)
    committed = (rows(k), stored(k), d.idle(conn))
    a2 = run(tr, k, "core", req(1), lambda tx: insert(tx, k, calls=calls), o)
    a3 = run(tr, k, "core", req(2), lambda tx: insert(tx, k, calls=calls), o)
    check(f"{n}: first run commits the work and the key (connection idle after), its Answer carries "
          f"the body and stored headers; the resend replays them byte for byte without running the work; another request -> 422",
          a1.status == 201 and not a1.replayed and committed == (1, 1, True) and a2.replayed
          and a1.body == a2.body and a1.headers == a2.headers == {"Content-Type": "application/json"}
          and a2.status == 201 and a2.body == json.dumps({"id": json.loads(a2.body)["id"]}).encode()
          and len(calls) == 1 and a3.status == 422 and rows(k) == 1, [a1, committed, a2, a3, calls])

    k = P + "429"
    a = run(tr, k, "core", req(1), lambda tx: insert(tx, k, status=429), o)
    check(f"{n}: a 429 (default_store refuses it) rolls back the work, nothing stored",
          a.status == 429 and rows(k) == 0 and stored(k) == 0 and d.idle(conn), a)

    k = P + "error"
    try:
        run(tr, k, "core", req(1), lambda tx: insert(tx, k, fail="error"), o)
        err = ""
    except RuntimeError as e:
        err = str(e)
    a = run(tr, k, "core", req(1), lambda tx: insert(tx, k), o)
    check(f"{n}: an exception in the work propagates, rolled back; the resend runs (201, 1 row)",
          err == "work failed" and a.status == 201 and not a.replayed and rows(k) == 1, [err, a])

    k = P + "40001"
    calls = []
    a = run(tr, k, "core", req(1), lambda tx: insert(tx, k, fail="40001", calls=calls), o)
    check(f"{n}: 40001 from the work: rolled back and run again, 4 attempts, then 503 + Retry-After",
          a.status == 503 and a.headers.get("Retry-After") == "1" and len(calls) == 4 and rows(k) == 0
          and stored(k) == 0 and d.idle(conn), [a, calls])

    a = run(tr, "", "core", req(1), lambda tx: insert(tx, "x"), o)
    check(f"{n}: an empty key -> 400 (IK003's SQLSTATE read from {n.split()[0]}'s error)",
          a.status == 400 and a.headers["Content-Type"] == "application/problem+json", a)

    # 409: another connection holds the key (begun, not finished)
    k = P + "busy"
    # (as the requests' role: keys are per role)
    holder = psycopg.connect(make_conninfo(dbname=os.environ["DATABASE_NAME"], user=os.environ["DATABASE_USER"]))
    holder.execute("SELECT idempotency.begin(%s, %s::jsonb, 'core')", (k, json.dumps(req(1))))
    a = run(tr, k, "core", req(1), lambda tx: insert(tx, k), o)
    holder.rollback()
    holder.close()
    check(f"{n}: the key in flight on another connection -> 409 with Retry-After (lookup()), nothing written",
          a.status == 409 and a.headers.get("Retry-After", "").isdigit() and rows(k) == 0 and d.idle(conn), a)

    # nested: inside the caller's own transaction, the guard is a savepoint
    k = P + "nested"
    outer = d.connect()
    calls = []
    if getattr(outer, "autocommit", False):
        outer.autocommit = False
    cur = outer.cursor()
    cur.execute("SELECT 1")	# the caller's transaction is open
    a = run(lambda: d.transaction(outer), k, "core", req(1), lambda tx: insert(tx, k, calls=calls), o)
    inside = (not d.idle(outer), rows(k))
    k2 = P + "nested-40001"
    try:
        run(lambda: d.transaction(outer), k2, "core", req(1),
            lambda tx: insert(tx, k2, fail="40001", calls=calls), o)
        raised = ""
    except Exception as e:
        raised = sqlstate_of(e) or repr(e)
    cur.execute("SELECT count(*) FROM payment WHERE idem_key = %s", (k,))
    still = cur.fetchone()
    outer.rollback()
    check(f"{n}: inside the caller's transaction: a savepoint (the caller's transaction still open, "
          f"the row not yet visible outside); 40001 not retried (raised after 1 attempt), the caller's "
          f"transaction still usable; its rollback forgets row and key",
          a.status == 201 and inside == (True, 0) and raised == "40001" and len(calls) == 2
          and still is not None and still[0] == 1 and rows(k) == 0 and stored(k) == 0,
          [a, inside, raised, calls, still])
    outer.close()
    conn.close()


# --- a SQLAlchemy Session (1.4, psycopg2): ORM writes in the guarded transaction
from sqlalchemy import Column, Integer, Numeric, Text, create_engine, text  # noqa: E402
from sqlalchemy.orm import Session, declarative_base  # noqa: E402

from pg_idempotency.drivers import sqlalchemy_transaction  # noqa: E402

Base = declarative_base()


class PaymentRow(Base):  # type: ignore[misc, valid-type]
    __tablename__ = "payment"
    id = Column(Integer, primary_key=True)
    idem_key = Column(Text, nullable=False)
    amount = Column(Numeric)


engine = create_engine("postgresql+psycopg2://", creator=lambda: psycopg2.connect(conninfo))
session = Session(engine)
P = f"core-{MODE}-sqlalchemy-{uuid.uuid4().hex[:6]}-"
o = Options("core", lock_wait_ms=50)


def sa_work(key: str, status: int = 201, fail: Optional[str] = None,
            calls: Optional[List[int]] = None) -> Callable[[Transaction], Captured]:
    def work(tx: Transaction) -> Captured:
        if calls is not None:
            calls.append(1)
        row = PaymentRow(idem_key=key, amount=1)
        session.add(row)
        session.flush()
        if fail == "error":
            raise RuntimeError("work failed")
        if fail:
            session.execute(text("DO $$ BEGIN RAISE EXCEPTION 'test' USING ERRCODE = '%s'; END $$" % fail))
        return Captured(status, {"Content-Type": "application/json"}.get, json.dumps({"id": row.id}).encode())
    return work


def sa() -> Any:
    return sqlalchemy_transaction(session)


k = P + "first"
calls = []
a1 = run(sa, k, "core", req(1), sa_work(k, calls=calls), o)
committed = (rows(k), stored(k), session.in_transaction())
a2 = run(sa, k, "core", req(1), sa_work(k, calls=calls), o)
a3 = run(sa, k, "core", req(2), sa_work(k, calls=calls), o)
check("SQLAlchemy Session: the ORM insert commits with the key (session.begin()); the resend replays "
      "without running the work; another request -> 422",
      a1.status == 201 and committed == (1, 1, False) and a2.replayed and a2.body == a1.body
      and len(calls) == 1 and a3.status == 422 and rows(k) == 1, [a1, committed, a2, a3, calls])
k = P + "429"
a = run(sa, k, "core", req(1), sa_work(k, status=429), o)
check("SQLAlchemy Session: a 429 rolls back the ORM insert, nothing stored",
      a.status == 429 and rows(k) == 0 and stored(k) == 0, a)
k = P + "error"
try:
    run(sa, k, "core", req(1), sa_work(k, fail="error"), o)
    err = ""
except RuntimeError as e:
    err = str(e)
a = run(sa, k, "core", req(1), sa_work(k), o)
check("SQLAlchemy Session: an exception rolls back; the session is usable and the resend runs (1 row)",
      err == "work failed" and a.status == 201 and rows(k) == 1, [err, a])
k = P + "40001"
calls = []
a = run(sa, k, "core", req(1), sa_work(k, fail="40001", calls=calls), o)
check("SQLAlchemy Session: 40001 (wrapped in sqlalchemy.exc.OperationalError) retried, 4 attempts, then 503",
      a.status == 503 and len(calls) == 4 and rows(k) == 0 and stored(k) == 0, [a, calls])
k = P + "nested"
session.execute(text("SELECT 1"))	# the session's own transaction is open
a = run(sa, k, "core", req(1), sa_work(k), o)
inside = (session.in_transaction(), rows(k))
session.rollback()
check("SQLAlchemy Session inside its own transaction: a savepoint (begin_nested); the session's "
      "rollback forgets the row and the key",
      a.status == 201 and inside == (True, 0) and rows(k) == 0 and stored(k) == 0, [a, inside])
session.close()
engine.dispose()

look.close()
sys.exit(1 if failed else 0)
