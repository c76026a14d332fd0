"""Checks of pg_idempotency.django on Debian's Django (3.2, psycopg2) against
the database: the test project in tests/django_site (its migration creates
the extension), through Django's test client and over real HTTP (runserver's
threaded WSGI server in this process).  Prints "ok - ..." / "not ok - ..."
lines; test/clients/run runs it directly and through PgBouncer.

The database: a fresh one (DJANGO_DATABASE) created through the direct
connection (PGHOST, libpq's environment), owned by DATABASE_USER; Django
connects through DATABASE_HOST/PORT (PgBouncer when IDEMPOTENCY_BOUNCER=1).
IDEMPOTENCY_EDITION=portable: the server has no extension to create, and
the migration runs the script of IDEMPOTENCY_PORTABLE_SCRIPT."""
import http.client
import io
import json
import os
import sys
import threading
import time
import unittest
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
MODE = "bouncer" if os.environ.get("IDEMPOTENCY_BOUNCER") == "1" else "direct"
DBNAME = f"django_{MODE}"
os.environ["DJANGO_DATABASE"] = DBNAME
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_site.settings")

EDITION = os.environ.get("IDEMPOTENCY_EDITION", "c")
USER = os.environ["DATABASE_USER"]	# Django's role; a plain install's needs its database


def create_database(name: str) -> None:
    admin = psycopg2.connect(dbname=os.environ["DATABASE_NAME"])
    admin.autocommit = True
    with admin.cursor() as c:
        c.execute(f"DROP DATABASE IF EXISTS {name}")
        c.execute(f'CREATE DATABASE {name} OWNER "{USER}"')
    admin.close()


create_database(DBNAME)

import django  # noqa: E402

django.setup()
from django.core.management import call_command  # noqa: E402
from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.db import OperationalError, connection, connections  # noqa: E402
from django.test import Client, TestCase  # noqa: E402

from django_site.shop import views  # noqa: E402
from django_site.shop.models import Order  # noqa: E402

P = f"dj-{MODE}-{uuid.uuid4().hex[:8]}-"
failed = 0
db = psycopg2.connect(dbname=DBNAME)	# direct, for looking at what was committed
db.autocommit = True


def check(desc: str, cond: bool, diag: Any = None) -> None:
    global failed
    failed += not cond
    print(f"{'ok' if cond else 'not ok'} - [python django {MODE}] {desc}", flush=True)
    if not cond and diag is not None:
        print(f"# {diag!r}"[:800], flush=True)


def one(sql: str, *args: Any) -> Any:
    with db.cursor() as c:
        c.execute(sql, args)
        return c.fetchone()[0]


def rows(key: str) -> int:
    return int(one("SELECT count(*) FROM shop_order WHERE idem_key = %s", key))


def stored(key: str) -> int:
    return int(one("SELECT count(*) FROM idempotency.idempotency_key WHERE key = %s", key))


def sleeping() -> int:
    return int(one("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                   "AND query LIKE '%%pg\\_sleep%%' AND pid <> pg_backend_pid()"))


def wait_for(cond: Callable[[], bool], seconds: float = 15) -> bool:
    end = time.time() + seconds
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


client = Client(raise_request_exception=False)


def post(path: str, body: Dict[str, Any], key: Optional[str] = None, c: Client = client,
         **headers: str) -> Any:
    extra = {"HTTP_" + k.upper(): v for k, v in headers.items()}
    if key is not None:
        extra["HTTP_IDEMPOTENCY_KEY"] = key
    return c.post(path, data=json.dumps(body), content_type="application/json", **extra)


def replayed(r: Any) -> bool:
    return r.get("Idempotent-Replayed") == "true"


def same(a: Any, b: Any) -> bool:
    return (a.status_code == b.status_code and a.content == b.content
            and a.get("Content-Type") == b.get("Content-Type") and a.get("Location") == b.get("Location"))


def show(r: Any) -> Any:
    return r.status_code, dict(r.items()), r.content[:300]


# --- the migration ------------------------------------------------------------
call_command("migrate", verbosity=0)
if EDITION == "portable":
    check("the migration's InstallIdempotency() ran the portable edition's script as Django's role "
          "(the server offers no extension)",
          one("SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'") == 0
          and one("SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'idempotency'") == USER)
else:
    check("the migration's InstallIdempotency() created the extension",
          one("SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'") == 1)

# --- the test client, outside any transaction --------------------------------
k = P + "first"
r1 = post("/orders", {"amount": "10.50"}, k)
r2 = post("/orders", {"amount": "10.50"}, k)
resp = json.loads(one("SELECT response::text FROM idempotency.idempotency_key WHERE key = %s", k))
created = one("SELECT created_at FROM shop_order WHERE idem_key = %s", k)
body1 = json.loads(r1.content) if r1.status_code == 201 else {}
check("first request: 201 from the view, its ORM insert committed with the key",
      r1.status_code == 201 and not replayed(r1) and rows(k) == 1 and stored(k) == 1
      and body1.get("key") == k and r1["Location"] == f"/orders/{body1.get('id')}", show(r1))
check("the resend: the stored answer byte for byte (status, body, Content-Type, Location), "
      "Idempotent-Replayed: true; the view did not run again",
      replayed(r2) and same(r1, r2) and views.ATTEMPTS[k] == 1 and rows(k) == 1
      and r1.get("X-Not-Stored") == "1" and r2.get("X-Not-Stored") is None, [show(r1), show(r2)])
check("ORM default (auto_now_add): the row's created_at is in the stored body and the replay",
      body1.get("created_at") == created.isoformat() and resp["body"] == r1.content.decode()
      and json.loads(r2.content)["created_at"] == created.isoformat(), [body1, created, resp])

r = post("/orders", {"amount": "99.00"}, k)
check("same key, another body -> 422 problem+json, nothing written",
      r.status_code == 422 and r["Content-Type"] == "application/problem+json"
      and json.loads(r.content)["status"] == 422 and rows(k) == 1, show(r))
r = post("/orders", {"amount": "1.00"})
check("no Idempotency-Key -> 400 problem+json, the view not run",
      r.status_code == 400 and r["Content-Type"] == "application/problem+json", show(r))
r = post("/orders", {"amount": "1.00"}, '"unterminated')
check("malformed structured-field key -> 400", r.status_code == 400, show(r))
r = post("/orders", {"amount": "1.00"}, "x" * 300)
check("key longer than 255 characters -> 400 (IK003 from the extension through Django's DatabaseError)",
      r.status_code == 400 and "problem+json" in r["Content-Type"], show(r))
sf = post("/orders", {"amount": "2.00"}, f'"{P}sf"')
bare = post("/orders", {"amount": "2.00"}, f"{P}sf")
check('"k" (structured-field string) and bare k are one key', sf.status_code == 201 and replayed(bare)
      and same(sf, bare), [show(sf), show(bare)])

# --- a handler that fails, then its resend -----------------------------------
k = P + "fail"
r1 = post("/orders", {"amount": "3.00", "fail": True}, k)
n1, s1 = rows(k), stored(k)
r2 = post("/orders", {"amount": "3.00"}, k)
check("a view that raises after its ORM insert -> 500, rolled back, no key; the resend runs: 201, 1 row",
      r1.status_code == 500 and n1 == 0 and s1 == 0 and r2.status_code == 201 and not replayed(r2)
      and rows(k) == 1, [show(r1), n1, s1, show(r2)])

# --- statuses: the stored-status rule and `store` ----------------------------
k = P + "429"
r1 = post("/orders", {"amount": "4.00", "throttle": True}, k)
n1, s1 = rows(k), stored(k)
check("429 is not stored: its ORM insert rolled back, nothing stored, Retry-After passed through",
      r1.status_code == 429 and r1["Retry-After"] == "1" and n1 == 0 and s1 == 0, [show(r1), n1, s1])
k = P + "429s"
r1 = post("/orders-429", {"amount": "4.00", "throttle": True}, k)
r2 = post("/orders-429", {"amount": "4.00", "throttle": True}, k)
check("store=lambda s: s < 500 stores the 429 (and its insert); the resend replays it",
      r1.status_code == 429 and replayed(r2) and same(r1, r2) and rows(k) == 1, [show(r1), show(r2)])

k = P + "404"
r1 = post("/orders", {"amount": "4.50", "missing": True}, k)
r2 = post("/orders", {"amount": "4.50", "missing": True}, k)
check("Http404 raised by the view is an answer (Django's 404 page), stored and replayed; the view ran once",
      r1.status_code == 404 and not replayed(r1) and replayed(r2) and same(r1, r2)
      and views.ATTEMPTS[k] == 1 and stored(k) == 1, [show(r1), show(r2)])

# --- 40001: retried outside a transaction -------------------------------------
k = P + "40001"
r = post("/orders", {"amount": "5.00", "serialization": True}, k)
check("40001 raised by the view: rolled back and run again (retries=3: 4 attempts), then 503 "
      "with Retry-After; nothing written",
      r.status_code == 503 and r["Retry-After"] == "1" and views.ATTEMPTS[k] == 4
      and rows(k) == 0 and stored(k) == 0, [show(r), views.ATTEMPTS[k]])

# --- responses: rendered, refused, class-based, DRF ---------------------------
k = P + "tpl"
r1 = post("/orders-template", {"amount": "6.00"}, k)
r2 = post("/orders-template", {"amount": "6.00"}, k)
check("a TemplateResponse is rendered before it is stored; replayed byte for byte",
      r1.status_code == 201 and r1.content.startswith(b"order ") and b"created 20" in r1.content
      and replayed(r2) and same(r1, r2), [show(r1), show(r2)])
k = P + "stream"
r = post("/orders", {"amount": "7.00", "stream": True}, k)
check("a StreamingHttpResponse is refused: 500, its insert rolled back, nothing stored",
      r.status_code == 500 and rows(k) == 0 and stored(k) == 0, show(r))
try:
    Client().post("/orders", data=json.dumps({"amount": "7.00", "stream": True}),
                  content_type="application/json", HTTP_IDEMPOTENCY_KEY=P + "stream2")
    msg = ""
except TypeError as e:
    msg = str(e)
check("... with a TypeError that says why", "streaming response" in msg and "cannot be stored" in msg, msg)
k = P + "cbv"
g = client.get("/orders-class")
r1 = post("/orders-class", {"amount": "8.00"}, k)
r2 = post("/orders-class", {"amount": "8.00"}, k)
r3 = post("/orders-class", {"amount": "8.00"})
check("a decorated class-based view: GET unguarded (no key needed), POST guarded (201, replay, 400 "
      "without a key)", g.status_code == 200 and r1.status_code == 201 and replayed(r2) and same(r1, r2)
      and r3.status_code == 400 and rows(k) == 1, [show(g), show(r1), show(r2), show(r3)])
k = P + "method"
r1 = post("/orders-method", {"amount": "8.50"}, k)
r2 = post("/orders-method", {"amount": "8.50"}, k)
check("method_decorator(idempotent(...), name-free) on a View's post(): 201, then its replay",
      r1.status_code == 201 and replayed(r2) and same(r1, r2) and rows(k) == 1, [show(r1), show(r2)])
k = P + "drf"
r1 = post("/orders-drf", {"amount": "9.00"}, k)
r2 = post("/orders-drf", {"amount": "9.00"}, k)
check("a DRF Response (decorator above @api_view) is rendered, stored, replayed byte for byte",
      r1.status_code == 201 and r1["Content-Type"] == "application/json" and b'"created_at"' in r1.content
      and replayed(r2) and same(r1, r2) and rows(k) == 1, [show(r1), show(r2)])
k = P + "drf-wrong"
r = post("/orders-drf-wrong", {"amount": "9.00"}, k)
check("the decorator under @api_view (a Response DRF has not finalized): refused, 500, nothing stored",
      r.status_code == 500 and stored(k) == 0, show(r))
r1 = post("/orders-optional", {})
r2 = post("/orders-optional", {}, P + "opt")
check("required=False: no key runs the view unguarded; with a key it is guarded",
      r1.status_code == 201 and json.loads(r1.content) == {"guarded": False}
      and json.loads(r2.content) == {"guarded": True} and stored(P + "opt") == 1, [show(r1), show(r2)])

try:
    from pg_idempotency.django import idempotent

    @idempotent(scope="async")
    async def async_view(request: Any) -> Any:
        return None
    msg = ""
except TypeError as e:
    msg = str(e)
check("an async view is refused when it is decorated, with a TypeError that says why",
      "sync views" in msg, msg)

# --- ATOMIC_REQUESTS: the guard is a savepoint in Django's transaction ---------
k = P + "atomic"
r1 = post("/orders-atomic", {"amount": "11.00"}, k)
r2 = post("/orders-atomic", {"amount": "11.00"}, k)
r3 = post("/orders-atomic", {"amount": "12.00"}, k)
check("ATOMIC_REQUESTS: 201 committed with Django's transaction; replay byte for byte; 422",
      r1.status_code == 201 and replayed(r2) and same(r1, r2) and r3.status_code == 422
      and rows(k) == 1 and stored(k) == 1, [show(r1), show(r2), show(r3)])
k = P + "atomic-fail"
r1 = post("/orders-atomic", {"amount": "13.00", "fail": True}, k)
n1, s1 = rows(k), stored(k)
r2 = post("/orders-atomic", {"amount": "13.00"}, k)
check("ATOMIC_REQUESTS: a view that fails -> 500, rolled back; its resend: 201, 1 row",
      r1.status_code == 500 and n1 == 0 and s1 == 0 and r2.status_code == 201 and rows(k) == 1,
      [show(r1), n1, s1, show(r2)])
k = P + "atomic-429"
r1 = post("/orders-atomic", {"amount": "14.00", "throttle": True}, k)
check("ATOMIC_REQUESTS: 429 rolls back to the savepoint: no row, no key",
      r1.status_code == 429 and rows(k) == 0 and stored(k) == 0, show(r1))
k = P + "atomic-40001"
r = post("/orders-atomic", {"amount": "15.00", "serialization": True}, k)
check("ATOMIC_REQUESTS: 40001 is not retried inside Django's transaction (1 attempt): the error "
      "propagates, 500, nothing written",
      r.status_code == 500 and views.ATTEMPTS[k] == 1 and rows(k) == 0 and stored(k) == 0,
      [show(r), views.ATTEMPTS[k]])


# --- Django's TestCase: everything in the test's transaction, rolled back -----
class GuardInTestCase(TestCase):
    key = P + "testcase"

    def test_guard(self) -> None:
        self.assertTrue(connection.in_atomic_block)
        r1 = post("/orders", {"amount": "16.00"}, self.key, c=self.client)
        r2 = post("/orders", {"amount": "16.00"}, self.key, c=self.client)
        r3 = post("/orders", {"amount": "17.00"}, self.key, c=self.client)
        self.assertEqual(r1.status_code, 201)
        self.assertTrue(replayed(r2) and same(r1, r2))
        self.assertEqual(r3.status_code, 422)
        self.assertEqual(Order.objects.filter(idem_key=self.key).count(), 1)
        k2 = self.key + "-40001"
        with self.assertRaises(OperationalError):
            post("/orders", {"amount": "18.00", "serialization": True}, k2, c=self.client)
        self.assertEqual(views.ATTEMPTS[k2], 1)
        self.assertEqual(Order.objects.filter(idem_key=k2).count(), 0)


out = io.StringIO()
result = unittest.TextTestRunner(stream=out, verbosity=0).run(
    unittest.defaultTestLoader.loadTestsFromTestCase(GuardInTestCase))
check("TestCase: the guard is a savepoint in the test's transaction: 201, replay, 422, one row seen "
      "by the ORM; 40001 not retried (OperationalError, 1 attempt)", result.wasSuccessful(),
      out.getvalue()[-600:])
check("TestCase: afterwards the row and the key are gone with the test's transaction",
      rows(GuardInTestCase.key) == 0 and stored(GuardInTestCase.key) == 0)

# --- in flight: 409 with Retry-After (test client, two threads) ----------------
k = P + "busy"
wait_for(lambda: sleeping() == 0)
first: List[Any] = []
t = threading.Thread(target=lambda: first.append(post("/orders", {"amount": "19.00", "sleep": 1.5}, k,
                                                       c=Client(raise_request_exception=False))))
t.start()
in_flight = wait_for(lambda: sleeping() > 0)
r = post("/orders", {"amount": "19.00", "sleep": 1.5}, k)
t.join()
r2 = post("/orders", {"amount": "19.00", "sleep": 1.5}, k)
check("a duplicate while the first is in flight -> 409 problem+json with Retry-After (lookup()); "
      "after it, the replay",
      in_flight and r.status_code == 409 and r["Retry-After"].isdigit() and int(r["Retry-After"]) >= 1
      and first and first[0].status_code == 201 and replayed(r2) and same(first[0], r2) and rows(k) == 1,
      [show(r), first and show(first[0]), show(r2)])

# --- over real HTTP: runserver's threaded WSGI server ------------------------
connections.close_all()
server = ThreadedWSGIServer(("127.0.0.1", 0), WSGIRequestHandler)
server.request_queue_size = 64
server.set_app(get_wsgi_application())
threading.Thread(target=server.serve_forever, daemon=True).start()
port = server.server_port


def http_post(path: str, body: Dict[str, Any], key: Optional[str]) -> Tuple[int, Dict[str, str], bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    h = {"Content-Type": "application/json"}
    if key is not None:
        h["Idempotency-Key"] = key
    c.request("POST", path, json.dumps(body).encode(), h)
    resp = c.getresponse()
    out = (resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    c.close()
    return out


def http_retry(path: str, body: Dict[str, Any], key: str) -> Tuple[int, Dict[str, str], bytes]:
    for _ in range(200):
        r = http_post(path, body, key)
        if r[0] != 409:
            return r
        time.sleep(min(0.1, float(r[1].get("retry-after", "1"))))
    return r


for path, label in (("/orders", "Django's connection"), ("/orders-atomic", "ATOMIC_REQUESTS")):
    k = P + "c10" + path.replace("/", "-")
    results: List[Tuple[int, Dict[str, str], bytes]] = []
    threads = [threading.Thread(target=lambda: results.append(http_retry(path, {"amount": "20.00"}, k)))
               for _ in range(10)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    firsts = [x for x in results if x[1].get("idempotent-replayed") != "true"]
    check(f"over HTTP ({label}): 10 concurrent duplicates -> 1 row, 10 byte-identical 201s, 9 replayed",
          len(results) == 10 and rows(k) == 1 and all(x[0] == 201 and x[2] == results[0][2] for x in results)
          and len(firsts) == 1, [(x[0], x[2][:80]) for x in results])

k = P + "http-fail"
a = http_post("/orders", {"amount": "21.00", "fail": True}, k)
b = http_post("/orders", {"amount": "21.00"}, k)
c2 = http_post("/orders", {"amount": "21.00"}, k)
check("over HTTP: a failing view (500), its resend 201, then byte-exact replays; 1 row",
      a[0] == 500 and b[0] == 201 and c2[1].get("idempotent-replayed") == "true" and c2[2] == b[2]
      and c2[1].get("location") == b[1].get("location") and rows(k) == 1, [a[0], b, c2])
server.shutdown()
server.server_close()
connections.close_all()

# --- InstallIdempotency on other databases (directly: Django's test database
# is made and dropped through its own connection) -----------------------------
if MODE == "direct":
    from django.core.exceptions import ImproperlyConfigured
    from django.db import NotSupportedError
    from django.db.migrations.state import ProjectState
    from django.test.utils import override_settings

    from pg_idempotency.django import InstallIdempotency

    def django_db(name: str, **extra: Any) -> Any:
        connections.databases[name] = dict(connections.databases["default"], NAME=name,
                                           **dict({"TEST": {"NAME": f"test_{name}"}}, **extra))
        return connections[name]

    def run_op(conn: Any, op: InstallIdempotency, forwards: bool = True) -> Optional[Exception]:
        try:
            with conn.schema_editor() as se:
                f = op.database_forwards if forwards else op.database_backwards
                f("shop", se, ProjectState(), ProjectState())
        except Exception as e:	# noqa: BLE001 (what the checks look at)
            return e
        return None

    def installed(name: str) -> Tuple[bool, bool]:
        """(an extension row, idempotency.begin()) in database name, seen directly"""
        d = psycopg2.connect(dbname=name)
        with d.cursor() as c:
            c.execute("SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'idempotency'), "
                      "EXISTS (SELECT FROM pg_proc WHERE proname = 'begin' "
                      "AND pronamespace = to_regnamespace('idempotency'))")
            got = c.fetchone()
        d.close()
        return bool(got[0]), bool(got[1])

    n_objects = "SELECT count(*) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace"
    before = (one(n_objects), one("SELECT count(*) FROM idempotency.idempotency_key"))
    e = run_op(connection, InstallIdempotency())
    check("InstallIdempotency() where idempotency is installed: nothing done, nothing changed",
          e is None and (one(n_objects), one("SELECT count(*) FROM idempotency.idempotency_key")) == before,
          [e, before])

    buf = io.StringIO()
    call_command("sqlmigrate", "shop", "0001", stdout=buf)
    check("sqlmigrate: the operation is shown as one that cannot be written as SQL, with its "
          "description, and nothing runs",
          "CANNOT BE WRITTEN AS SQL" in buf.getvalue() and InstallIdempotency().describe() in buf.getvalue()
          and (one(n_objects), one("SELECT count(*) FROM idempotency.idempotency_key")) == before,
          buf.getvalue()[:600])

    bare = DBNAME + "_bare"
    create_database(bare)
    conn = django_db(bare)
    if EDITION == "portable":
        with override_settings(IDEMPOTENCY_PORTABLE_SCRIPT=None):
            e = run_op(conn, InstallIdempotency())
        check("no extension on the server and no script: ImproperlyConfigured naming "
              "IDEMPOTENCY_PORTABLE_SCRIPT, nothing written",
              isinstance(e, ImproperlyConfigured) and "IDEMPOTENCY_PORTABLE_SCRIPT" in str(e)
              and installed(bare) == (False, False), [e, installed(bare)])
        with override_settings(IDEMPOTENCY_PORTABLE_SCRIPT=None):
            e = run_op(conn, InstallIdempotency(portable_script=os.environ["IDEMPOTENCY_PORTABLE_SCRIPT"]))
        check("InstallIdempotency(portable_script=...): the script runs (no setting needed)",
              e is None and installed(bare) == (False, True), [e, installed(bare)])
        e = run_op(conn, InstallIdempotency(), forwards=False)
        check("migrating back over a plain install: NotSupportedError (DROP SCHEMA is its owner's), "
              "the install stays",
              isinstance(e, NotSupportedError) and "DROP SCHEMA idempotency CASCADE" in str(e)
              and installed(bare) == (False, True), [e, installed(bare)])
    else:
        e = run_op(conn, InstallIdempotency())
        check("InstallIdempotency() where the server offers the extension: CREATE EXTENSION",
              e is None and installed(bare) == (True, True), [e, installed(bare)])
        e = run_op(conn, InstallIdempotency(), forwards=False)
        check("migrating back: DROP EXTENSION", e is None and installed(bare) == (False, False),
              [e, installed(bare)])
        e = run_op(conn, InstallIdempotency())
        check("forwards again, over the empty schema DROP EXTENSION leaves: CREATE EXTENSION",
              e is None and installed(bare) == (True, True), [e, installed(bare)])

    if EDITION == "portable" and os.environ.get("IDEMPOTENCY_PGTLE") == "1":
        # the portable edition registered with pg_tle (RDS, Supabase): the
        # server offers the extension, and the same migration creates it
        script = os.environ["IDEMPOTENCY_PORTABLE_SCRIPT"]
        tle = DBNAME + "_tle"
        create_database(tle)
        su = psycopg2.connect(dbname=tle)	# pg_tle is the service's (rds_superuser)
        su.autocommit = True
        with su.cursor() as c:
            c.execute("SET client_min_messages = warning")
            c.execute("CREATE EXTENSION pg_tle")
            c.execute(f'GRANT pgtle_admin TO "{USER}"')
            c.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'idempotency'")
            listed = c.fetchone()[0]
        su.close()
        conn = django_db(tle)
        with conn.cursor() as c:
            with open(script, encoding="utf-8") as f:
                c.execute("SELECT pgtle.install_extension('idempotency', %s, 'portable edition', %s, "
                          "NULL, 'idempotency')",
                          [os.path.basename(script)[len("idempotency--"):-len(".sql")], f.read()])
        with override_settings(IDEMPOTENCY_PORTABLE_SCRIPT=None):
            e = run_op(conn, InstallIdempotency())
        check("the portable edition registered with pg_tle (pgtle.available_extensions(), not in "
              "pg_available_extensions): InstallIdempotency() runs CREATE EXTENSION, no script needed",
              e is None and listed == 0 and installed(tle) == (True, True), [e, listed, installed(tle)])
        connections[tle].close()
        admin = psycopg2.connect(dbname=os.environ["DATABASE_NAME"])
        admin.autocommit = True
        with admin.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {tle}")
        admin.close()

    # a search_path naming a schema with its own = before pg_catalog (Django's
    # OPTIONS "-c search_path=..."): the operation's catalog queries must not
    # take that = (which found an extension row in every database: nothing installed)
    from pg_idempotency._compat import VERSION_SQL
    hostile = DBNAME + "_path"
    create_database(hostile)
    su = psycopg2.connect(dbname=hostile, user=USER)	# the owner's own schema
    su.autocommit = True
    with su.cursor() as c:
        c.execute("CREATE SCHEMA evil")
        for t in ("name", "text"):
            c.execute(f"CREATE FUNCTION evil.eq_{t}({t}, {t}) RETURNS bool LANGUAGE sql AS 'SELECT true'")
            c.execute(f"CREATE OPERATOR evil.= (LEFTARG = {t}, RIGHTARG = {t}, FUNCTION = evil.eq_{t})")
    su.close()
    conn = django_db(hostile, OPTIONS={"options": "-c search_path=evil,pg_catalog"})
    e = run_op(conn, InstallIdempotency())
    with conn.cursor() as c:
        c.execute("SHOW search_path")
        path = c.fetchone()[0]
        c.execute(VERSION_SQL)
        seen = c.fetchone()[0]
    want = (False, True) if EDITION == "portable" else (True, True)
    check("a search_path with its own = before pg_catalog (OPTIONS -c search_path=evil,pg_catalog): "
          "InstallIdempotency() installs all the same, and the version query on that path answers "
          "the installed version",
          e is None and path == "evil,pg_catalog" and installed(hostile) == want
          and seen == one(VERSION_SQL), [e, path, installed(hostile), seen])
    conn.close()

    if EDITION == "portable":
        # a schema named pgtle without the pg_tle extension (made by a role with
        # CREATE on the database), whose available_extensions() lists
        # idempotency: not pg_tle, so the script runs
        fake = DBNAME + "_fake"
        create_database(fake)
        own = psycopg2.connect(dbname=fake, user=USER)
        own.autocommit = True
        with own.cursor() as c:
            c.execute("CREATE SCHEMA pgtle")
            c.execute("CREATE FUNCTION pgtle.available_extensions() RETURNS TABLE (name name) "
                      "LANGUAGE sql AS $$SELECT 'idempotency'::name$$")
        own.close()
        conn = django_db(fake)
        e = run_op(conn, InstallIdempotency())
        check("a schema pgtle that is not the pg_tle extension (its own available_extensions() lists "
              "idempotency): the portable script runs, no CREATE EXTENSION",
              e is None and installed(fake) == (False, True), [e, installed(fake)])
        conn.close()

        # a script that is not the portable edition's install script: a clear
        # error before anything runs, nothing written
        here = os.path.dirname(os.path.abspath(__file__))
        script = os.environ["IDEMPOTENCY_PORTABLE_SCRIPT"]
        version = os.path.basename(script)[len("idempotency--"):-len(".sql")]
        c_script = os.path.join(here, "..", "..", "..", os.path.basename(script))	# the C edition's
        bad = DBNAME + "_bad"
        create_database(bad)
        conn = django_db(bad)
        e = run_op(conn, InstallIdempotency(portable_script=c_script))
        check("portable_script= the C edition's install script: ImproperlyConfigured naming the file "
              "(not a syntax error from the server), nothing written",
              isinstance(e, ImproperlyConfigured) and os.path.basename(script) in str(e)
              and "portable edition" in str(e) and installed(bad) == (False, False), [e, installed(bad)])
        e = run_op(conn, InstallIdempotency(portable_script=os.path.join(here, "no-such.sql")))
        check("portable_script= a path that does not exist: an error naming it, nothing written",
              isinstance(e, (OSError, ImproperlyConfigured)) and "no-such.sql" in str(e)
              and installed(bad) == (False, False), [e, installed(bad)])
        import tempfile
        from pg_idempotency._compat import EXTENSION_MIN
        with open(script, encoding="utf-8") as f:
            text = f.read()
        with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as old:
            old.write(text.replace(f"'idempotency {version} (portable edition)'",
                                   "'idempotency 0.0.1 (portable edition)'"))
        e = run_op(conn, InstallIdempotency(portable_script=old.name))
        os.unlink(old.name)
        check("portable_script= an install script of a version older than this client needs: "
              "ImproperlyConfigured naming both versions, nothing written (the app's requests would "
              "all be refused)",
              isinstance(e, ImproperlyConfigured) and "0.0.1" in str(e) and EXTENSION_MIN in str(e)
              and installed(bad) == (False, False), [e, installed(bad)])
        conn.close()

    # Django's test runner: a test database made anew, migrated, then dropped
    fresh = django_db(DBNAME + "_fresh")
    try:
        old_name = fresh.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        test_db = fresh.settings_dict["NAME"]
        got = installed(test_db)
        fresh.creation.destroy_test_db(old_name, verbosity=0)
        e = None
    except Exception as x:	# noqa: BLE001
        e, got = x, None
    check("Django's test database (create_test_db, as its test runner makes it) gets idempotency "
          "by the same migration", e is None and got == ((False, True) if EDITION == "portable" else (True, True)),
          [e, got])
    if EDITION == "c":
        # the C edition needs a superuser to create (superuser = true), in the
        # test database too: a role that is none gets it there from a template
        # that has it (TEST["TEMPLATE"]), and the migration then does nothing
        tpl = DBNAME + "_tpl"
        admin = psycopg2.connect(dbname=os.environ["DATABASE_NAME"])
        admin.autocommit = True
        with admin.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {tpl}")
            c.execute("DROP ROLE IF EXISTS dj_app")
            c.execute("CREATE ROLE dj_app LOGIN CREATEDB")
            c.execute(f"CREATE DATABASE {tpl} OWNER dj_app")
        su = psycopg2.connect(dbname=tpl)
        su.autocommit = True
        with su.cursor() as c:
            c.execute("CREATE EXTENSION idempotency")
        su.close()
        results = []
        for name, test in (("app", {"TEMPLATE": tpl}), ("app_bare", {})):
            app = django_db(f"{DBNAME}_{name}", USER="dj_app",
                            TEST=dict(test, NAME=f"test_{DBNAME}_{name}"))
            try:
                old_name = app.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
                results.append(installed(app.settings_dict["NAME"]))
                app.creation.destroy_test_db(old_name, verbosity=0)
            except Exception as x:	# noqa: BLE001
                results.append(x)
            app.close()
        check("the C edition, a role that is no superuser: its test database made from a template "
              "with the extension (TEST[\"TEMPLATE\"]) has it, the migration does nothing; without "
              "one, CREATE EXTENSION is refused (must be superuser), as the README says",
              results[0] == (True, True) and isinstance(results[1], Exception)
              and "superuser" in str(results[1]), results)
        with admin.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS test_{DBNAME}_app_bare")
            c.execute(f"DROP DATABASE IF EXISTS {tpl}")
            c.execute("DROP ROLE dj_app")
        admin.close()

    connections.close_all()
    admin = psycopg2.connect(dbname=os.environ["DATABASE_NAME"])
    admin.autocommit = True
    with admin.cursor() as c:
        for name in (bare, hostile, DBNAME + "_fake", DBNAME + "_bad"):
            c.execute(f"DROP DATABASE IF EXISTS {name}")
    admin.close()

db.close()
sys.exit(1 if failed else 0)
