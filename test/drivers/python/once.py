# psycopg 3: once() as one statement in autocommit with ordinary bind
# parameters: strings (psycopg sends them untyped), then typed values
# (Decimal, int: psycopg sends them typed).
from decimal import Decimal
import sys

import psycopg
from psycopg.types.json import Jsonb

INSERT = "INSERT INTO drv_payment (amount, note) VALUES ($1, $2) RETURNING amount, note"
ONCE = "SELECT outcome, response FROM idempotency.once(%s, %s, %s, %s, %s)"
BODY = '{"zeta": 1,  "alpha": [1.10, 2e3],\n\t"t": "caf\\u00e9 é 😀 \\"q\\""}\r\n'
failures = 0


def check(desc, cond, got=None):
    global failures
    if not cond:
        failures += 1
    print(f"{'ok' if cond else 'not ok'} - psycopg: {desc}" + ("" if cond or got is None else f" (got {got!r})"))


def sqlstate(conn, query, params):
    try:
        conn.execute(query, params)
        return "no error"
    except psycopg.Error as e:
        return e.sqlstate


with psycopg.connect(autocommit=True) as conn:
    req = Jsonb({"amount": "49.90"})
    out, resp = conn.execute(ONCE, ("py-1", req, INSERT, "49.90", "py-1")).fetchone()
    check("new: the work ran once, its row is the response",
          out == "new" and resp["note"] == "py-1" and Decimal(str(resp["amount"])) == Decimal("49.90"), (out, resp))
    out, resp = conn.execute(ONCE, ("py-1", req, INSERT, "49.90", "py-1")).fetchone()
    check("replay: the stored response comes back", out == "replay" and resp["note"] == "py-1", (out, resp))
    n = conn.execute("SELECT count(*) FROM drv_payment WHERE note = 'py-1'").fetchone()[0]
    check("replay: the work did not run again", n == 1, n)
    # typed arguments (VARIADIC "any"): Decimal and int as psycopg types them
    typed = "INSERT INTO drv_payment (amount, note) VALUES ($1, 'py-typed-' || $2) RETURNING amount, note"
    out, resp = conn.execute(ONCE, ("py-4", None, typed, Decimal("12.34"), 7)).fetchone()
    check("typed Decimal and int arguments", out == "new" and resp["note"] == "py-typed-7", (out, resp))

    check("another request under the same key: IK001",
          sqlstate(conn, ONCE, ("py-1", Jsonb({"amount": "1"}), INSERT, "1", "py-1")) == "IK001")
    check("an error in the work: its SQLSTATE (22P02)",
          sqlstate(conn, ONCE, ("py-2", None, INSERT, "lots", "py-2")) == "22P02")
    n = conn.execute("SELECT count(*) FROM idempotency.lookup(%s)", ("py-2",)).fetchone()[0]
    check("an error in the work: nothing stored", n == 0, n)

    http = "SELECT idempotency.http_response(201, $1, $2::jsonb) AS r"
    headers = '{"Content-Type": "application/json", "Location": "/p/1"}'
    conn.execute(ONCE, ("py-3", None, http, BODY, headers))
    out, resp = conn.execute(ONCE, ("py-3", None, http, BODY, headers)).fetchone()
    check("HTTP replay: status and headers",
          out == "replay" and resp["status"] == 201 and resp["headers"]["Location"] == "/p/1", resp)
    check("HTTP replay: the body byte for byte", resp["body"].encode() == BODY.encode(), resp["body"])

    row = conn.execute("SELECT status, attempts, retry_after FROM idempotency.lookup(%s, %s)", ("py-1", "")).fetchone()
    check("lookup(): completed, no retry needed", row == ("completed", 1, None), row)

sys.exit(1 if failures else 0)
