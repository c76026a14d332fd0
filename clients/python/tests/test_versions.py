"""The compatibility rule (docs/clients.md, "Versions"), against a database
of its own whose extension is 0.5.0, then updated (DATABASE_HOST/PORT/NAME/
USER name the server and a superuser); prints "ok - ..." / "not ok - ..." lines.

- Guard (Flask's), AsyncGuard (FastAPI's), core.run on psycopg 3 and
  psycopg2 connections and run_phases refuse the old extension with
  ExtensionVersionError, both versions in the message, nothing written;
- after ALTER EXTENSION idempotency UPDATE the next request goes through
  (a refusal is not remembered);
- the version is asked once per pool: 11 requests through one Guard send
  one version query."""
import asyncio
import os
import sys
from typing import Any

import psycopg
import psycopg2
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import pg_idempotency
from pg_idempotency import (AsyncGuard, Captured, ExtensionVersionError, Guard, Options, Phase,
                            run, run_phases)
from pg_idempotency import _compat
from pg_idempotency.drivers import psycopg2_transaction, psycopg_transaction

env = dict(host=os.environ["DATABASE_HOST"], port=os.environ["DATABASE_PORT"],
           user=os.environ["DATABASE_USER"])
DB = f"compat_py_{os.getpid()}"
admin = psycopg.connect(make_conninfo(dbname=os.environ["DATABASE_NAME"], **env), autocommit=True)
admin.execute(f"DROP DATABASE IF EXISTS {DB}")
admin.execute(f"CREATE DATABASE {DB}")
conninfo = make_conninfo(dbname=DB, **env)
failed = 0


def check(desc: str, cond: bool, diag: Any = None) -> None:
    global failed
    failed += not cond
    print(f"{'ok' if cond else 'not ok'} - [python versions] {desc}", flush=True)
    if not cond and diag is not None:
        print(f"# {diag!r}"[:600], flush=True)


def work(conn: Any) -> Captured:
    conn.execute("INSERT INTO written VALUES (1)")
    return Captured(201, {"Content-Type": "application/json"}.get, b"{}")


def refused(f: Any) -> Any:
    try:
        f()
    except ExtensionVersionError as e:
        return e
    except Exception as e:	# noqa: BLE001 (the wrong error is the finding)
        return e
    return None


WANT = ("pg_idempotency 0.6.0 needs the idempotency extension 0.6.0 or newer; "
        "this database has 0.5.0 (ALTER EXTENSION idempotency UPDATE; a plain install: the portable upgrade script)")
try:
    with psycopg.connect(conninfo, autocommit=True) as c:
        c.execute("CREATE EXTENSION idempotency VERSION '0.5.0'")
        c.execute("CREATE TABLE written (n int)")
    pool = ConnectionPool(conninfo, min_size=1, max_size=2, open=True)
    guard = Guard(pool, Options("compat"))
    conn3 = psycopg.connect(conninfo)
    conn2 = psycopg2.connect(conninfo)

    async def async_guard() -> Any:
        apool = AsyncConnectionPool(conninfo, min_size=1, max_size=2, open=False)
        await apool.open()
        try:
            async def awork(conn: Any) -> Captured:
                await conn.execute("INSERT INTO written VALUES (1)")
                return Captured(201, {}.get, b"{}")
            return await AsyncGuard(apool, Options("compat")).run("a1", "compat", {"n": 1}, awork)
        except Exception as e:	# noqa: BLE001
            return e
        finally:
            await apool.close()

    errs = [
        refused(lambda: guard.run("k1", "compat", {"n": 1}, work)),
        asyncio.run(async_guard()),
        refused(lambda: run(lambda: psycopg_transaction(conn3), "k2", "compat", {"n": 1},
                            lambda tx: work(tx.connection), Options("compat"))),
        refused(lambda: run(lambda: psycopg2_transaction(conn2), "k3", "compat", {"n": 1},
                            lambda tx: Captured(201, {}.get, b"{}"), Options("compat"))),
        refused(lambda: run_phases(pool, "k4", [Phase("a", lambda ctx: 1)], lambda s: {})),
    ]
    with psycopg.connect(conninfo, autocommit=True) as c:
        n = c.execute("SELECT count(*) FROM written").fetchone()
        keys = c.execute("SELECT count(*) FROM idempotency.idempotency_key").fetchone()
    check(f'an extension older than the client: Guard, AsyncGuard, core.run (psycopg 3, psycopg2) and '
          f'run_phases refuse it, nothing written: "{WANT}"',
          all(isinstance(e, ExtensionVersionError) and str(e) == WANT and e.found == "0.5.0"
              and e.needed == pg_idempotency.EXTENSION_MIN for e in errs)
          and pg_idempotency.VERSION == "0.6.0" and n == (0,) and keys == (0,), [str(e) for e in errs] + [n, keys])

    with psycopg.connect(conninfo, autocommit=True) as c:
        c.execute("ALTER EXTENSION idempotency UPDATE")
    before = _compat.queries
    answers = [guard.run(f"after-{i}", "compat", {"n": i}, work) for i in range(11)]
    with psycopg.connect(conninfo, autocommit=True) as c:
        n = c.execute("SELECT count(*) FROM written").fetchone()
    check("after ALTER EXTENSION UPDATE the next request goes through; 11 requests through one pool "
          f"asked the version {_compat.queries - before} time(s)",
          all(a.status == 201 for a in answers) and n == (11,) and _compat.queries - before == 1,
          [[a.status for a in answers], n, _compat.queries - before])
    conn3.close()
    conn2.close()
    pool.close()
finally:
    admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
sys.exit(1 if failed else 0)
