"""Example (and test server): POST /payments on Flask + sync psycopg 3.
The same contract as clients/node/examples/express.js ({"stream": true}: a
streamed Response, refused: TypeError, 500, rolled back; test/conformance).  Database from
DATABASE_HOST/PORT/NAME/USER; IDEMPOTENCY_BOUNCER=1: behind PgBouncer in
transaction mode (prepare_threshold=None).  Prints "listening <port>"."""
import json
import os
import urllib.request

from flask import Flask, Response, g, jsonify, request
from psycopg.conninfo import make_conninfo
from psycopg_pool import ConnectionPool
from werkzeug.serving import make_server

from pg_idempotency.flask import Phase, PhaseError, idempotent, idempotent_phases

conninfo = make_conninfo(host=os.environ["DATABASE_HOST"], port=os.environ["DATABASE_PORT"],
                         dbname=os.environ["DATABASE_NAME"], user=os.environ["DATABASE_USER"])
bouncer = os.environ.get("IDEMPOTENCY_BOUNCER") == "1"
pool = ConnectionPool(conninfo, min_size=2, max_size=10,
                      kwargs={"prepare_threshold": None} if bouncer else {})
app = Flask(__name__)
throttled = set()


@app.post("/payments")
@idempotent(pool, scope="payments", user=lambda r: r.headers.get("X-User"))
def pay():
    p = request.get_json()
    if p.get("decline"):
        return jsonify(error="card_declined"), 402
    (pid,) = g.db.execute("INSERT INTO payment (idem_key, amount) VALUES (%s, %s) RETURNING id",
                          (g.idempotency["key"], p.get("amount"))).fetchone()
    if p.get("sleep"):
        g.db.execute("SELECT pg_sleep(%s)", (p["sleep"],))
    if p.get("boom"):
        raise RuntimeError("boom")
    if p.get("throttle") and g.idempotency["key"] not in throttled:
        throttled.add(g.idempotency["key"])	# 429: rolled back, not stored
        return jsonify(error="rate_limited"), 429, {"Retry-After": "1"}
    if p.get("stream"):	# cannot be stored for replay: refused
        return Response(iter([b'{"id":%d,' % pid, b'"streamed":true}']), mimetype="application/json")
    if p.get("binary"):
        return b"\xff\x00\xfe" + str(pid).encode(), 200, {"Content-Type": "application/octet-stream"}
    body = '{"status":"paid","id":%d,"amount":%s,"note":"caf\u00e9 \u2713"}' % (pid, json.dumps(p.get("amount")))
    return body, 201, {"Content-Type": "application/json", "Location": f"/payments/{pid}"}


# POST /transfers: debit (a transaction), charge (DOWNSTREAM_URL, outside any
# transaction, with a key derived from ours), finish; lease 2 s, renewed
# every 0.6 s.  X-Crash: charge / finish exits the process there (os._exit).
def crash(ctx, where):
    if ctx.req.headers.get("X-Crash") == where:
        os._exit(1)


def debit(ctx):
    body = ctx.request["body"]
    if body.get("decline"):
        raise PhaseError("card declined", permanent=True, status=402, body={"error": "card_declined"})
    ctx.conn.execute("INSERT INTO transfer_step (idem_key, step) VALUES (%s, 'debit')", (ctx.key,))
    if body.get("sleep"):
        ctx.conn.execute("SELECT pg_sleep(%s)", (body["sleep"],))
    return {"debited": body["amount"]}


def charge(ctx):
    call = urllib.request.Request(
        os.environ["DOWNSTREAM_URL"] + "/charge", method="POST",
        data=json.dumps({"amount": ctx.request["body"]["amount"]}).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": ctx.derive_key("charge")})
    with urllib.request.urlopen(call, timeout=10) as r:
        answer = json.load(r)
    crash(ctx, "charge")
    return answer


def finish(ctx):
    crash(ctx, "finish")
    ctx.conn.execute("INSERT INTO transfer_step (idem_key, step) VALUES (%s, 'finish')", (ctx.key,))


@app.post("/transfers")
@idempotent_phases(pool, scope="transfers", user=lambda r: r.headers.get("X-User"),
                   phases=[Phase("debit", debit), Phase("charge", charge, external=True),
                           Phase("finish", finish)],
                   lease_seconds=2.0, renew_every_seconds=0.6)
def transfer(state):
    body = json.dumps({"status": "done", "charge_id": state["charge"]["charge_id"],
                       "amount": request.get_json()["amount"]}, separators=(",", ":"))
    return body, 201, {"Content-Type": "application/json"}


if __name__ == "__main__":
    server = make_server("127.0.0.1", int(os.environ.get("PORT", "0")), app, threaded=True)
    print(f"listening {server.port}", flush=True)
    server.serve_forever()
