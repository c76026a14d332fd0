"""Views of the test project: one handler behind every way of guarding it.

POST body {"amount": "1.00"} -> 201, {"id", "amount", "created_at", "key"}
with Location; {"fail": true} raises after its insert; {"sleep": s} holds the
transaction; {"throttle": true} -> 429 after its insert; {"stream": true}
-> a StreamingHttpResponse; {"missing": true} raises Http404 before any
write; {"serialization": true} raises 40001 after its
insert (attempts counted in ATTEMPTS)."""
import json
from collections import Counter
from typing import Any

from django.db import connections
from django.http import Http404, HttpResponse, JsonResponse, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from rest_framework.decorators import api_view
from rest_framework.response import Response

from pg_idempotency.django import idempotent

from .models import Order

ATTEMPTS: Counter = Counter()


def handle(request: Any, alias: str) -> HttpResponse:
    p = json.loads(request.body)
    key = request.idempotency["key"]
    ATTEMPTS[key] += 1
    if p.get("missing"):
        raise Http404("no such customer")
    order = Order.objects.using(alias).create(idem_key=key, amount=p["amount"])
    if p.get("sleep"):
        with connections[alias].cursor() as c:
            c.execute("SELECT pg_sleep(%s)", [p["sleep"]])
    if p.get("serialization"):
        with connections[alias].cursor() as c:
            c.execute("DO $$ BEGIN RAISE EXCEPTION 'could not serialize (test)' "
                      "USING ERRCODE = '40001'; END $$")
    if p.get("fail"):
        raise RuntimeError("the handler failed")
    if p.get("throttle"):
        return JsonResponse({"error": "slow down"}, status=429, headers={"Retry-After": "1"})
    if p.get("stream"):
        return StreamingHttpResponse(iter([b"a", b"b"]))
    order.refresh_from_db()
    return JsonResponse({"id": order.id, "amount": str(order.amount),
                         "created_at": order.created_at.isoformat(), "key": key},
                        status=201, headers={"Location": f"/orders/{order.id}",
                                             "X-Not-Stored": str(ATTEMPTS[key])})


@csrf_exempt
@idempotent(scope="orders")
def orders(request: Any) -> HttpResponse:
    return handle(request, "default")


@csrf_exempt
@idempotent(scope="orders-atomic", using="atomic")
def orders_atomic(request: Any) -> HttpResponse:
    """ATOMIC_REQUESTS: Django's transaction around the view, the guard a
    savepoint in it."""
    return handle(request, "atomic")


@csrf_exempt
@idempotent(scope="orders-429", store=lambda status: status < 500)
def orders_store_429(request: Any) -> HttpResponse:
    return handle(request, "default")


@csrf_exempt
@idempotent(scope="orders-optional", required=False)
def orders_optional(request: Any) -> HttpResponse:
    return JsonResponse({"guarded": hasattr(request, "idempotency")}, status=201)


@csrf_exempt
@idempotent(scope="orders-template")
def orders_template(request: Any) -> TemplateResponse:
    p = json.loads(request.body)
    order = Order.objects.create(idem_key=request.idempotency["key"], amount=p["amount"])
    return TemplateResponse(request, "order.txt", {"order": order}, status=201,
                            content_type="text/plain; charset=utf-8")


@method_decorator(csrf_exempt, name="dispatch")
@idempotent(scope="orders-class")
class OrderView(View):
    """A class-based view: POST guarded, GET not."""

    def get(self, request: Any) -> HttpResponse:
        return JsonResponse({"orders": Order.objects.count()})

    def post(self, request: Any) -> HttpResponse:
        return handle(request, "default")


class OrderMethodView(View):
    @method_decorator(idempotent(scope="orders-method"))
    def post(self, request: Any) -> HttpResponse:
        return handle(request, "default")


@csrf_exempt
@idempotent(scope="orders-drf")
@api_view(["POST"])
def orders_drf(request: Any) -> Response:
    order = Order.objects.create(idem_key=request._request.idempotency["key"],
                                 amount=request.data["amount"])
    return Response({"id": order.id, "created_at": order.created_at}, status=201)


@api_view(["POST"])
@idempotent(scope="orders-drf-wrong")
def orders_drf_wrong(request: Any) -> Response:	# the guard under @api_view: refused clearly
    return Response({"ok": True}, status=201)
