"""Example (and test server): POST /payments on Django, one decorator line,
the ORM write in the guarded transaction on Django's own connection
(psycopg2 on Debian 12's Django 3.2).  The same contract as
clients/node/examples/express.js ({"stream": true}: a StreamingHttpResponse,
refused: TypeError, 500, rolled back, logged by django.request; test/conformance).  Database from DATABASE_HOST/PORT/NAME/
USER (a `payment` table: id bigserial, idem_key text, amount numeric);
IDEMPOTENCY_BOUNCER=1 changes nothing (psycopg2 sends no named prepared
statements, so PgBouncer in transaction mode works as it is).  Served by
runserver's threaded WSGI server; prints "listening <port>".

A one-file Django project; in a real one the view is in views.py, the model
in models.py, and the table comes from a migration (see the README)."""
import json
import os
import socketserver
import urllib.request

import django
from django.conf import settings

settings.configure(
    DEBUG=False,
    SECRET_KEY="example",
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=[],
    MIDDLEWARE=[],
    USE_TZ=True,
    DATABASES={"default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ["DATABASE_HOST"], "PORT": os.environ["DATABASE_PORT"],
        "NAME": os.environ["DATABASE_NAME"], "USER": os.environ["DATABASE_USER"],
    }},
    LOGGING={"version": 1, "disable_existing_loggers": False,
             "handlers": {"stderr": {"class": "logging.StreamHandler"}},
             "loggers": {"django.server": {"level": "WARNING"},
                         "django.request": {"handlers": ["stderr"], "level": "ERROR"}}},
)
django.setup()

from django.db import connection, models  # noqa: E402
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

from pg_idempotency.django import Phase, PhaseError, idempotent, idempotent_phases  # noqa: E402


class Payment(models.Model):
    id = models.BigAutoField(primary_key=True)
    idem_key = models.TextField()
    amount = models.DecimalField(max_digits=12, decimal_places=2, null=True)

    class Meta:
        app_label = "payments"
        db_table = "payment"
        managed = False


throttled = set()


@csrf_exempt
@idempotent(scope="payments", user=lambda r: r.headers.get("X-User"))
def pay(request):
    p = json.loads(request.body)
    key = request.idempotency["key"]
    if p.get("decline"):
        return JsonResponse({"error": "card_declined"}, status=402)
    payment = Payment.objects.create(idem_key=key, amount=p.get("amount"))
    if p.get("sleep"):
        with connection.cursor() as c:
            c.execute("SELECT pg_sleep(%s)", [p["sleep"]])
    if p.get("boom"):
        raise RuntimeError("boom")
    if p.get("throttle") and key not in throttled:
        throttled.add(key)	# 429: rolled back, not stored
        return JsonResponse({"error": "rate_limited"}, status=429, headers={"Retry-After": "1"})
    if p.get("stream"):	# cannot be stored for replay: refused
        return StreamingHttpResponse(iter([b'{"id":%d,' % payment.id, b'"streamed":true}']),
                                     content_type="application/json")
    if p.get("binary"):
        return HttpResponse(b"\xff\x00\xfe" + str(payment.id).encode(),
                            content_type="application/octet-stream")
    body = '{"status":"paid","id":%d,"amount":%s,"note":"caf\u00e9 \u2713"}' % (
        payment.id, json.dumps(p.get("amount")))
    return HttpResponse(body, status=201, content_type="application/json",
                        headers={"Location": f"/payments/{payment.id}"})


class TransferStep(models.Model):
    id = models.BigAutoField(primary_key=True)
    idem_key = models.TextField()
    step = models.TextField()

    class Meta:
        app_label = "payments"
        db_table = "transfer_step"
        managed = False


# POST /transfers: debit (an ORM write in the phase's transaction), charge
# (DOWNSTREAM_URL, outside any transaction, with a key derived from ours),
# finish; lease 2 s, renewed every 0.6 s.  X-Crash: charge / finish exits the
# process there (os._exit).
def crash(ctx, where):
    if ctx.req.headers.get("X-Crash") == where:
        os._exit(1)


def debit(ctx):
    body = ctx.request["body"]
    if body.get("decline"):
        raise PhaseError("card declined", permanent=True, status=402, body={"error": "card_declined"})
    TransferStep.objects.create(idem_key=ctx.key, step="debit")
    if body.get("sleep"):
        with connection.cursor() as c:
            c.execute("SELECT pg_sleep(%s)", [body["sleep"]])
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
    TransferStep.objects.create(idem_key=ctx.key, step="finish")


@csrf_exempt
@idempotent_phases(scope="transfers", user=lambda r: r.headers.get("X-User"),
                   phases=[Phase("debit", debit), Phase("charge", charge, external=True),
                           Phase("finish", finish)],
                   lease_seconds=2.0, renew_every_seconds=0.6)
def transfer(request, state):
    body = json.dumps({"status": "done", "charge_id": state["charge"]["charge_id"],
                       "amount": json.loads(request.body)["amount"]}, separators=(",", ":"))
    return HttpResponse(body, status=201, content_type="application/json")


urlpatterns = [path("payments", pay), path("transfers", transfer)]


if __name__ == "__main__":
    from django.core.servers.basehttp import WSGIRequestHandler, WSGIServer
    from django.core.wsgi import get_wsgi_application

    class Server(socketserver.ThreadingMixIn, WSGIServer):	# runserver's, threaded
        daemon_threads = True
        request_queue_size = 128

    server = Server(("127.0.0.1", int(os.environ.get("PORT", "0"))), WSGIRequestHandler)
    server.set_app(get_wsgi_application())
    print(f"listening {server.server_port}", flush=True)
    server.serve_forever()
