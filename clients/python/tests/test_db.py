"""Checks of pg_idempotency against the database (DATABASE_HOST/PORT/NAME/
USER, the `payment` table of test/clients/run), in process: FastAPI through
starlette's TestClient, Flask through its test client.  Prints "ok - ..." /
"not ok - ..." lines; test/clients/run runs it directly and through PgBouncer.

  - FastAPI: the route's status_code and response_model shape what is sent,
    stored and replayed;
  - pools in autocommit mode (sync and async);
  - the stored-status rule (429 not stored) and the `store` option;
  - idempotent_phases (Flask, FastAPI): a missing or malformed key, a phase
    that raises (500, resumed), a view's 503 (not stored), a permanent
    PhaseError without a status (400, stored)."""
import os
import sys
import time
import uuid
from typing import Optional

import psycopg
from fastapi import FastAPI, Request, Response
from fastapi.testclient import TestClient
from flask import Flask, g, request
from psycopg import AsyncConnection
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from pydantic import BaseModel

from pg_idempotency import Phase, PhaseError
from pg_idempotency.fastapi import AsyncPhase
from pg_idempotency.fastapi import idempotent as fastapi_idempotent
from pg_idempotency.fastapi import idempotent_phases as fastapi_idempotent_phases
from pg_idempotency.flask import idempotent as flask_idempotent
from pg_idempotency.flask import idempotent_phases as flask_idempotent_phases

MODE = "bouncer" if os.environ.get("IDEMPOTENCY_BOUNCER") == "1" else "direct"
conninfo = make_conninfo(host=os.environ["DATABASE_HOST"], port=os.environ["DATABASE_PORT"],
                         dbname=os.environ["DATABASE_NAME"], user=os.environ["DATABASE_USER"])
extra = {"prepare_threshold": None} if MODE == "bouncer" else {}
P = f"py-{MODE}-{uuid.uuid4().hex[:8]}-"
failed = 0


def check(desc, cond, diag=None):
    global failed
    failed += not cond
    print(f"{'ok' if cond else 'not ok'} - [python db {MODE}] {desc}", flush=True)
    if not cond and diag is not None:
        print(f"# {diag!r}"[:600])


def db(sql, *args):
    with psycopg.connect(make_conninfo(dbname=os.environ["DATABASE_NAME"]), autocommit=True) as c:
        return c.execute(sql, args).fetchone()[0]


def rows(key):
    return db("SELECT count(*) FROM payment WHERE idem_key = %s", key)


def stored(key):
    return db("SELECT count(*) FROM idempotency.idempotency_key WHERE key = %s", key)


def same(a, b):
    return a.status_code == b.status_code and a.content == b.content and \
        a.headers.get("content-type") == b.headers.get("content-type")


def replayed(r):
    return r.headers.get("idempotent-replayed") == "true"


# --- FastAPI ------------------------------------------------------------------
def fastapi_app(pool_kwargs, **options):
    pool = AsyncConnectionPool(conninfo, min_size=1, max_size=4, open=False, kwargs=pool_kwargs)
    app = FastAPI()
    throttled = set()

    @app.on_event("startup")
    async def _open():
        await pool.open()

    @app.on_event("shutdown")
    async def _close():
        await pool.close()

    class UserIn(BaseModel):
        name: str
        password: str
        throttle: bool = False

    class UserOut(BaseModel):
        id: int
        name: str

    @app.post("/users", status_code=201, response_model=UserOut)
    @fastapi_idempotent(pool, scope="users", **options)
    async def create_user(u: UserIn, request: Request, db: AsyncConnection):
        key = request.state.idempotency["key"]
        cur = await db.execute("INSERT INTO payment (idem_key, amount) VALUES (%s, 1) RETURNING id", (key,))
        (pid,) = await cur.fetchone()
        if u.throttle and key not in throttled:
            throttled.add(key)
            from fastapi.responses import JSONResponse
            return JSONResponse({"error": "slow down"}, status_code=429, headers={"Retry-After": "1"})
        return {"id": pid, "name": u.name, "password": u.password}	# password: dropped by UserOut

    @app.post("/accepted", status_code=201)
    @fastapi_idempotent(pool, scope="accepted", headers=["X-Job"], **options)
    async def accept(u: UserIn, response: Response):
        response.status_code = 202	# FastAPI's sub-response: its status and headers win
        response.headers["X-Job"] = "j-1"
        return {"name": u.name}

    return app


def fastapi_checks():
    with TestClient(fastapi_app(extra), raise_server_exceptions=False) as c:
        k = P + "fa-model"
        body = {"name": "ann", "password": "secret"}
        r1 = c.post("/users", json=body, headers={"Idempotency-Key": k})
        r2 = c.post("/users", json=body, headers={"Idempotency-Key": k})
        resp = db("SELECT response FROM idempotency.idempotency_key WHERE key = %s", k)
        check("FastAPI: the route's status_code=201 and response_model (drops a field) apply to the "
              "first answer, the stored one and the replay, byte-identical",
              r1.status_code == 201 and b"password" not in r1.content and r1.json().get("name") == "ann"
              and not replayed(r1) and replayed(r2) and same(r1, r2) and rows(k) == 1
              and resp["status"] == 201 and "password" not in resp["body"],
              [r1.status_code, r1.content, r2.status_code, r2.content, resp])
        k = P + "fa-429"
        body = {"name": "bo", "password": "x", "throttle": True}
        r1 = c.post("/users", json=body, headers={"Idempotency-Key": k})
        n1, s1 = rows(k), stored(k)
        r2 = c.post("/users", json=body, headers={"Idempotency-Key": k})
        check("FastAPI: 429 is not stored (rolled back); the resend runs and gets 201",
              r1.status_code == 429 and n1 == 0 and s1 == 0 and r2.status_code == 201
              and not replayed(r2) and rows(k) == 1, [r1.status_code, n1, s1, r2.status_code, r2.content])

        k = P + "fa-sub"
        r1 = c.post("/accepted", json={"name": "fi", "password": "x"}, headers={"Idempotency-Key": k})
        r2 = c.post("/accepted", json={"name": "fi", "password": "x"}, headers={"Idempotency-Key": k})
        check("FastAPI: a `response: Response` parameter's status (202) and header apply, stored and replayed",
              r1.status_code == 202 and r1.headers.get("x-job") == "j-1" and replayed(r2) and same(r1, r2)
              and r2.headers.get("x-job") == "j-1", [r1.status_code, r1.headers, r2.status_code, r2.headers])

    with TestClient(fastapi_app({**extra, "autocommit": True}), raise_server_exceptions=False) as c:
        k = P + "fa-auto"
        body = {"name": "cy", "password": "x"}
        r1 = c.post("/users", json=body, headers={"Idempotency-Key": k})
        r2 = c.post("/users", json=body, headers={"Idempotency-Key": k})
        check("FastAPI on an autocommit AsyncConnectionPool: 201, then its replay, one row",
              r1.status_code == 201 and replayed(r2) and same(r1, r2) and rows(k) == 1,
              [r1.status_code, r1.content, r2.status_code, r2.content])
        k = P + "fa-auto-429"
        body = {"name": "di", "password": "x", "throttle": True}
        r1 = c.post("/users", json=body, headers={"Idempotency-Key": k})
        check("FastAPI on an autocommit pool: a 429's insert is rolled back, nothing stored",
              r1.status_code == 429 and rows(k) == 0 and stored(k) == 0, [r1.status_code, r1.content])

    with TestClient(fastapi_app(extra, store=lambda status: status < 500), raise_server_exceptions=False) as c:
        k = P + "fa-store"
        body = {"name": "ed", "password": "x", "throttle": True}
        r1 = c.post("/users", json=body, headers={"Idempotency-Key": k})
        r2 = c.post("/users", json=body, headers={"Idempotency-Key": k})
        check("FastAPI: store=lambda s: s < 500 stores the 429, and it is replayed",
              r1.status_code == 429 and replayed(r2) and same(r1, r2) and rows(k) == 1,
              [r1.status_code, r2.status_code, r2.headers])


# --- Flask --------------------------------------------------------------------
def flask_app(pool):
    app = Flask(__name__)

    @app.post("/payments")
    @flask_idempotent(pool, scope="payments")
    def pay():
        (pid,) = g.db.execute("INSERT INTO payment (idem_key, amount) VALUES (%s, 2) RETURNING id",
                              (g.idempotency["key"],)).fetchone()
        return {"id": pid}, 201

    return app


def flask_checks():
    with ConnectionPool(conninfo, min_size=1, max_size=2, kwargs={**extra, "autocommit": True}) as pool:
        c = flask_app(pool).test_client()
        k = P + "fl-auto"
        r1 = c.post("/payments", json={"a": 1}, headers={"Idempotency-Key": k})
        r2 = c.post("/payments", json={"a": 1}, headers={"Idempotency-Key": k})
        r3 = c.post("/payments", json={"a": 2}, headers={"Idempotency-Key": k})
        check("Flask on an autocommit ConnectionPool: 201, its replay, 422 for another body, one row",
              r1.status_code == 201 and r2.status_code == 201 and r2.headers.get("Idempotent-Replayed") == "true"
              and r1.data == r2.data and r3.status_code == 422 and rows(k) == 1,
              [r1.status_code, r1.data, r2.status_code, r3.status_code])


# --- idempotent_phases: the error paths (the conformance suite has the rest) ------
# phases: "a" inserts a payment row (amount 1), "b" (external) raises the
# first time a key asks for it ("fail_once"), "c" inserts amount 3; the view
# answers 503 the first time a key asks for it ("unavailable_once"), else 201
def key_status(key):
    return db("SELECT coalesce(min(status || ':' || coalesce(retryable::text, '-')), 'none') "
              "FROM idempotency.idempotency_key WHERE key = %s", key)


def phased_checks(label, post):
    """``post(key, body, headers=None)`` -> (status, headers, bytes)."""
    r = post(None, {"n": 1})
    m = post(P + label + "-bad", {"n": 1}, {"Idempotency-Key": '"unterminated'})
    check(f"{label} idempotent_phases: no key -> 400, a malformed key -> 400 (problem+json), nothing stored",
          r[0] == 400 and m[0] == 400 and "problem+json" in (r[1].get("content-type") or "")
          and stored(P + label + "-bad") == 0, [r, m])

    k = P + label + "-fail"
    a = post(k, {"fail_once": True})
    after = (rows(k), key_status(k))
    b = post(k, {"fail_once": True})
    c = post(k, {"fail_once": True})
    check(f"{label} idempotent_phases: a phase that raises -> 500, the key failed retryably (phase a's row "
          "committed, nothing replayed); the resend resumes after a (one a, one c), then replays",
          a[0] == 500 and after == (1, "failed:true") and b[0] == 201 and c[0] == 201
          and c[1].get("idempotent-replayed") == "true" and b[2] == c[2]
          and b[1].get("idempotent-replayed") is None and rows(k) == 2
          and key_status(k) == "completed:-", [a[0], after, b, c, rows(k), key_status(k)])

    k = P + label + "-503"
    a = post(k, {"unavailable_once": True})
    after = (rows(k), key_status(k))
    b = post(k, {"unavailable_once": True})
    check(f"{label} idempotent_phases: the view's 503 is not stored (the last phase rolled back, the key "
          "failed retryably, Retry-After sent); the resend runs the last phase again: 201, one a, one c",
          a[0] == 503 and a[1].get("retry-after") == "7" and after == (1, "failed:true") and b[0] == 201
          and rows(k) == 2 and key_status(k) == "completed:-", [a, after, b, rows(k)])

    k = P + label + "-perm"
    a = post(k, {"permanent": True})
    b = post(k, {"permanent": True})
    check(f"{label} idempotent_phases: a permanent PhaseError without a status -> 400 "
          '{"error":"<message>"} (application/json), stored (failed, not retryable), replayed',
          a[0] == 400 and a[2] == b'{"error":"no such account"}' and "application/json" in (a[1].get("content-type") or "")
          and b[1].get("idempotent-replayed") == "true" and b[2] == a[2] and rows(k) == 0
          and key_status(k) == "failed:false", [a, b, key_status(k)])


failed_once = set()


def _phase_a(ctx):
    if ctx.request["body"].get("permanent"):
        raise PhaseError("no such account", permanent=True)
    ctx.conn.execute("INSERT INTO payment (idem_key, amount) VALUES (%s, 1)", (ctx.key,))
    return {"a": 1}


def _phase_b(ctx):
    if ctx.request["body"].get("fail_once") and ctx.key not in failed_once:
        failed_once.add(ctx.key)
        raise RuntimeError("downstream down")
    return {"b": ctx.derive_key("b")}


def _phase_c(ctx):
    ctx.conn.execute("INSERT INTO payment (idem_key, amount) VALUES (%s, 3)", (ctx.key,))
    return {"c": 3}


unavailable = set()


def _status_for(key, body):
    if body.get("unavailable_once") and key not in unavailable:
        unavailable.add(key)
        return 503
    return 201


def flask_phased_checks():
    with ConnectionPool(conninfo, min_size=1, max_size=4, kwargs=extra) as pool:
        app = Flask(__name__)
        app.logger.disabled = True

        @app.post("/ph")
        @flask_idempotent_phases(pool, scope="ph", lease_seconds=5,
                                 phases=[Phase("a", _phase_a), Phase("b", _phase_b, external=True),
                                         Phase("c", _phase_c)])
        def ph(state):
            st = _status_for(request.headers["Idempotency-Key"], request.get_json())
            return {"state": state}, st, {"Retry-After": "7"} if st == 503 else {}

        c = app.test_client()

        def post(key, body, headers=None):
            h = dict(headers or ({"Idempotency-Key": key} if key else {}))
            r = c.post("/ph", json=body, headers=h)
            return r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.data

        phased_checks("Flask", post)


def fastapi_phased_checks():
    pool = AsyncConnectionPool(conninfo, min_size=1, max_size=4, kwargs=extra, open=False)
    app = FastAPI()

    @app.on_event("startup")
    async def _open():
        await pool.open()

    @app.on_event("shutdown")
    async def _close():
        await pool.close()

    async def a(ctx):
        if ctx.request["body"].get("permanent"):
            raise PhaseError("no such account", permanent=True)
        await ctx.conn.execute("INSERT INTO payment (idem_key, amount) VALUES (%s, 1)", (ctx.key,))
        return {"a": 1}

    async def b(ctx):
        if ctx.request["body"].get("fail_once") and ctx.key not in failed_once:
            failed_once.add(ctx.key)
            raise RuntimeError("downstream down")
        return {"b": await ctx.derive_key("b")}

    async def c_(ctx):
        await ctx.conn.execute("INSERT INTO payment (idem_key, amount) VALUES (%s, 3)", (ctx.key,))
        return {"c": 3}

    @app.post("/ph", status_code=201)
    @fastapi_idempotent_phases(pool, scope="ph", lease_seconds=5,
                               phases=[AsyncPhase("a", a), AsyncPhase("b", b, external=True),
                                       AsyncPhase("c", c_)])
    async def ph(state: dict, request: Request, response: Response):
        st = _status_for(request.headers["idempotency-key"], await request.json())
        if st == 503:
            response.status_code = 503
            response.headers["Retry-After"] = "7"
        return {"state": state}

    with TestClient(app, raise_server_exceptions=False) as c:
        def post(key, body, headers=None):
            h = dict(headers or ({"Idempotency-Key": key} if key else {}))
            r = c.post("/ph", json=body, headers=h)
            return r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content

        phased_checks("FastAPI", post)


start = time.time()
fastapi_checks()
flask_checks()
flask_phased_checks()
fastapi_phased_checks()
sys.exit(1 if failed else 0)
