"""test/recovery/app.py: the shop's payment endpoint in Python, as a real
process: POST /payments (Idempotency-Key header, {"amount": n}) runs
order -> charge -> record -> receipt with pg_idempotency.run_phases.
KILL_AT=<boundary> makes the process SIGKILL itself at that boundary (see
app.js for the list); SLOW_CHARGE_MS slows the charge phase.  Prints "listening <port>" when ready."""
import json
import os
import signal
import sys
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../clients/python"))
import psycopg  # noqa: E402
from psycopg_pool import ConnectionPool  # noqa: E402
from pg_idempotency.phases import Json, Phase, PhaseContext, State, run_phases  # noqa: E402

KILL_AT = os.environ.get("KILL_AT", "")
SLOW_CHARGE = float(os.environ.get("SLOW_CHARGE_MS", "0")) / 1000  # longer than the lease: renewal
PROCESSOR = os.environ["PROCESSOR_URL"]
# not in autocommit: run_phases works in conn.transaction() either way
pool = ConnectionPool("", min_size=1, max_size=4)


def die(at: str) -> None:
    if KILL_AT == at:
        os.kill(os.getpid(), signal.SIGKILL)


def order(ctx: PhaseContext) -> Json:
    assert ctx.conn is not None and isinstance(ctx.request, dict)
    row = ctx.conn.execute("INSERT INTO shop_order (idem_key, amount) VALUES (%s, %s) RETURNING id, amount",
                           (ctx.key, ctx.request["amount"])).fetchone()
    assert row is not None
    return {"id": int(row[0]), "amount": row[1]}


def charge(ctx: PhaseContext) -> Json:
    if SLOW_CHARGE:
        time.sleep(SLOW_CHARGE)
    o: Any = ctx.state["order"]
    req = urllib.request.Request(
        f"{PROCESSOR}/charges", method="POST",
        data=json.dumps({"amount": o["amount"], "request": ctx.key}).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": ctx.derive_key("charge")})
    with urllib.request.urlopen(req, timeout=10) as res:
        ch = json.loads(res.read())
    die("charge:called")
    return {"id": ch["id"]}


def record(ctx: PhaseContext) -> Json:
    assert ctx.conn is not None
    o: Any = ctx.state["order"]
    c: Any = ctx.state["charge"]
    ctx.conn.execute("INSERT INTO shop_charge (idem_key, order_id, charge_id) VALUES (%s, %s, %s)",
                     (ctx.key, o["id"], c["id"]))
    return True


def receipt(ctx: PhaseContext) -> Json:
    assert ctx.conn is not None
    o: Any = ctx.state["order"]
    c: Any = ctx.state["charge"]
    ctx.conn.execute("INSERT INTO shop_receipt (idem_key, order_id, charge_id) VALUES (%s, %s, %s)",
                     (ctx.key, o["id"], c["id"]))
    return True


PHASES = [Phase("order", order), Phase("charge", charge, external=True),
          Phase("record", record), Phase("receipt", receipt)]


def answer(s: State) -> Json:
    o: Any = s["order"]
    c: Any = s["charge"]
    # the exact bytes to answer with (jsonb would reorder an object's keys)
    return {"status": 201, "body": json.dumps({"order": o["id"], "charge": c["id"], "amount": o["amount"]})}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send(self, status: int, body: str, headers: Dict[str, str]) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        key = self.headers.get("Idempotency-Key")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/payments" or not key:
            return self.send(400, '{"error": "bad request"}', {})
        try:
            r = run_phases(pool, key, PHASES, answer, scope="payments", request=json.loads(body or b"{}"),
                           lease=1.0, renew_every=0.3, after_commit=die)
        except psycopg.Error as e:
            if e.sqlstate == "IK002":
                return self.send(409, json.dumps({"error": str(e)}), {"Retry-After": "1"})
            if e.sqlstate == "IK001":
                return self.send(422, json.dumps({"error": str(e)}), {})
            return self.send(500, json.dumps({"error": str(e)}), {})
        except Exception as e:
            return self.send(500, json.dumps({"error": str(e)}), {})
        resp: Any = r.response
        if r.status == "failed":
            return self.send(500, json.dumps(resp), {})
        self.send(resp["status"], resp["body"], {"Idempotent-Replayed": "true"} if r.outcome == "replay" else {})


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"listening {server.server_address[1]}", flush=True)
try:
    server.serve_forever()
except KeyboardInterrupt:
    pass
