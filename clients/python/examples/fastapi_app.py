"""Example (and test server): POST /payments on FastAPI + async psycopg 3.
The same contract as clients/node/examples/express.js ({"stream": true}: a
StreamingResponse, refused: TypeError, 500, rolled back; test/conformance).  Database from
DATABASE_HOST/PORT/NAME/USER; IDEMPOTENCY_BOUNCER=1: behind PgBouncer in
transaction mode (prepare_threshold=None).  Prints "listening <port>"."""
import asyncio
import json
import os
import socket
import urllib.request
from typing import Optional

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from psycopg import AsyncConnection
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from pg_idempotency.fastapi import AsyncPhase, PhaseError, idempotent, idempotent_phases

conninfo = make_conninfo(host=os.environ["DATABASE_HOST"], port=os.environ["DATABASE_PORT"],
                         dbname=os.environ["DATABASE_NAME"], user=os.environ["DATABASE_USER"])
bouncer = os.environ.get("IDEMPOTENCY_BOUNCER") == "1"
pool = AsyncConnectionPool(conninfo, min_size=2, max_size=10, open=False,
                           kwargs={"prepare_threshold": None} if bouncer else {})
app = FastAPI()
throttled = set()


@app.on_event("startup")
async def _open():
    await pool.open()


class Payment(BaseModel):
    amount: Optional[str] = None
    sleep: Optional[float] = None
    decline: bool = False
    boom: bool = False
    binary: bool = False
    throttle: bool = False
    stream: bool = False


def user(request: Request):
    return request.headers.get("x-user")	# stands in for the authenticated user


@app.post("/payments")
@idempotent(pool, scope="payments", user=user)
async def pay(p: Payment, request: Request, db: AsyncConnection):
    if p.decline:
        return JSONResponse({"error": "card_declined"}, status_code=402)
    cur = await db.execute("INSERT INTO payment (idem_key, amount) VALUES (%s, %s) RETURNING id",
                           (request.state.idempotency["key"], p.amount))
    (pid,) = await cur.fetchone()
    if p.sleep:
        await db.execute("SELECT pg_sleep(%s)", (p.sleep,))
    if p.boom:
        raise RuntimeError("boom")
    if p.throttle and request.state.idempotency["key"] not in throttled:
        throttled.add(request.state.idempotency["key"])	# 429: rolled back, not stored
        return JSONResponse({"error": "rate_limited"}, status_code=429, headers={"Retry-After": "1"})
    if p.stream:	# cannot be stored for replay: refused
        return StreamingResponse(iter([b'{"id":%d,' % pid, b'"streamed":true}']), media_type="application/json")
    if p.binary:
        return Response(b"\xff\x00\xfe" + str(pid).encode(), media_type="application/octet-stream")
    body = '{"status":"paid","id":%d,"amount":%s,"note":"caf\u00e9 \u2713"}' % (pid, json.dumps(p.amount))
    return Response(body, status_code=201, media_type="application/json",
                    headers={"Location": f"/payments/{pid}"})


# POST /transfers: debit (a transaction), charge (DOWNSTREAM_URL, outside any
# transaction, with a key derived from ours), finish; lease 2 s, renewed
# every 0.6 s.  X-Crash: charge / finish exits the process there (os._exit).
class Transfer(BaseModel):
    amount: str
    sleep: Optional[float] = None
    decline: bool = False


def crash(ctx, where):
    if ctx.req.headers.get("x-crash") == where:
        os._exit(1)


async def debit(ctx):
    body = ctx.request["body"]
    if body.get("decline"):
        raise PhaseError("card declined", permanent=True, status=402, body={"error": "card_declined"})
    await ctx.conn.execute("INSERT INTO transfer_step (idem_key, step) VALUES (%s, 'debit')", (ctx.key,))
    if body.get("sleep"):
        await ctx.conn.execute("SELECT pg_sleep(%s)", (body["sleep"],))
    return {"debited": body["amount"]}


def post_charge(amount, key):
    call = urllib.request.Request(
        os.environ["DOWNSTREAM_URL"] + "/charge", method="POST", data=json.dumps({"amount": amount}).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": key})
    with urllib.request.urlopen(call, timeout=10) as r:
        return json.load(r)


async def charge(ctx):
    answer = await asyncio.get_running_loop().run_in_executor(
        None, post_charge, ctx.request["body"]["amount"], await ctx.derive_key("charge"))
    crash(ctx, "charge")
    return answer


async def finish(ctx):
    crash(ctx, "finish")
    await ctx.conn.execute("INSERT INTO transfer_step (idem_key, step) VALUES (%s, 'finish')", (ctx.key,))


@app.post("/transfers")
@idempotent_phases(pool, scope="transfers", user=user,
                   phases=[AsyncPhase("debit", debit), AsyncPhase("charge", charge, external=True),
                           AsyncPhase("finish", finish)],
                   lease_seconds=2.0, renew_every_seconds=0.6)
async def transfer(state: dict, t: Transfer):
    body = json.dumps({"status": "done", "charge_id": state["charge"]["charge_id"], "amount": t.amount},
                      separators=(",", ":"))
    return Response(body, status_code=201, media_type="application/json")


if __name__ == "__main__":
    sock = socket.socket()
    sock.bind(("127.0.0.1", int(os.environ.get("PORT", "0"))))
    sock.listen(128)
    print(f"listening {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
