"""test/recovery/app_async.py: the shop's payment endpoint on FastAPI and
asyncio (uvicorn, AsyncConnectionPool, httpx), as a real process: the same
contract as app.py, with pg_idempotency.run_phases_async.  KILL_AT and
SLOW_CHARGE_MS as in app.js.  Prints "listening <port>" when ready."""
import asyncio
import json
import os
import signal
import socket
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../clients/python"))
import httpx  # noqa: E402
import psycopg  # noqa: E402
import uvicorn  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import Response  # noqa: E402
from psycopg_pool import AsyncConnectionPool  # noqa: E402
from pg_idempotency.phases import AsyncPhase, AsyncPhaseContext, Json, State, run_phases_async  # noqa: E402

KILL_AT = os.environ.get("KILL_AT", "")
PROCESSOR = os.environ["PROCESSOR_URL"]
SLOW_CHARGE = float(os.environ.get("SLOW_CHARGE_MS", "0")) / 1000
pool = AsyncConnectionPool("", min_size=1, max_size=4, open=False)
app = FastAPI()


@app.on_event("startup")
async def _open() -> None:
    await pool.open()


async def die(at: str) -> None:
    if KILL_AT == at:
        os.kill(os.getpid(), signal.SIGKILL)


async def order(ctx: AsyncPhaseContext) -> Json:
    assert ctx.conn is not None and isinstance(ctx.request, dict)
    cur = await ctx.conn.execute("INSERT INTO shop_order (idem_key, amount) VALUES (%s, %s) RETURNING id, amount",
                                 (ctx.key, ctx.request["amount"]))
    row = await cur.fetchone()
    assert row is not None
    return {"id": int(row[0]), "amount": row[1]}


async def charge(ctx: AsyncPhaseContext) -> Json:
    if SLOW_CHARGE:
        await asyncio.sleep(SLOW_CHARGE)
    o: Any = ctx.state["order"]
    async with httpx.AsyncClient() as client:
        res = await client.post(f"{PROCESSOR}/charges", json={"amount": o["amount"], "request": ctx.key},
                                headers={"Idempotency-Key": await ctx.derive_key("charge")})
    res.raise_for_status()
    await die("charge:called")
    return {"id": res.json()["id"]}


async def record(ctx: AsyncPhaseContext) -> Json:
    assert ctx.conn is not None
    o: Any = ctx.state["order"]
    c: Any = ctx.state["charge"]
    await ctx.conn.execute("INSERT INTO shop_charge (idem_key, order_id, charge_id) VALUES (%s, %s, %s)",
                           (ctx.key, o["id"], c["id"]))
    return True


async def receipt(ctx: AsyncPhaseContext) -> Json:
    assert ctx.conn is not None
    o: Any = ctx.state["order"]
    c: Any = ctx.state["charge"]
    await ctx.conn.execute("INSERT INTO shop_receipt (idem_key, order_id, charge_id) VALUES (%s, %s, %s)",
                           (ctx.key, o["id"], c["id"]))
    return True


PHASES = [AsyncPhase("order", order), AsyncPhase("charge", charge, external=True),
          AsyncPhase("record", record), AsyncPhase("receipt", receipt)]


def answer(s: State) -> Json:
    o: Any = s["order"]
    c: Any = s["charge"]
    return {"status": 201, "body": json.dumps({"order": o["id"], "charge": c["id"], "amount": o["amount"]})}


@app.post("/payments")
async def payments(request: Request) -> Response:
    key = request.headers.get("Idempotency-Key")
    if not key:
        return Response('{"error": "bad request"}', status_code=400, media_type="application/json")
    try:
        r = await run_phases_async(pool, key, PHASES, answer, scope="payments", request=await request.json(),
                                   lease=1.0, renew_every=0.3, after_commit=die)
    except psycopg.Error as e:
        status = 409 if e.sqlstate == "IK002" else 422 if e.sqlstate == "IK001" else 500
        return Response(json.dumps({"error": str(e)}), status_code=status, media_type="application/json",
                        headers={"Retry-After": "1"} if status == 409 else {})
    resp: Any = r.response
    if r.status == "failed":
        return Response(json.dumps(resp), status_code=500, media_type="application/json")
    return Response(resp["body"], status_code=resp["status"], media_type="application/json",
                    headers={"Idempotent-Replayed": "true"} if r.outcome == "replay" else {})


if __name__ == "__main__":
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    print(f"listening {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
