"""Django: ``@idempotent(scope=...)`` on a view, on Django's own connection.

    from pg_idempotency.django import idempotent

    @csrf_exempt
    @idempotent(scope="payments")
    def pay(request):
        p = Payment.objects.create(amount=json.loads(request.body)["amount"])
        return JsonResponse({"id": p.id}, status=201, headers={"Location": f"/payments/{p.id}"})

The view runs inside ``transaction.atomic(using)`` on ``connections[using]``
(Django's connection: psycopg2 on Django 3.2; psycopg 3 on 4.2+ goes through
the same code, untested under Django 4.2),
with ``idempotency.begin()`` before it and ``complete()`` after it in the same
transaction: its ORM writes commit with the stored answer or roll back with
it.  Answers as the FastAPI and Flask decorators: a missing key 400 (unless
``required=False``), a malformed one 400, another request under the key 422,
the key in flight 409 with Retry-After (from ``idempotency.lookup()``), a
finished key the stored status, headers and body byte for byte as an
HttpResponse with ``Idempotent-Replayed: true``; errors are
application/problem+json.  What is stored: ``store`` (``default_store``:
not 408, 409, 425, 429 nor 5xx: those roll back, ORM writes included, and a
resend runs again).  Http404, PermissionDenied, BadRequest and
SuspiciousOperation are answers (Django's 404, 403 and 400 responses, stored
by default); any other exception rolls back and Django answers 500.

A TemplateResponse (or a finalized DRF Response: put the decorator above
``@api_view`` or on ``dispatch``) is rendered before it is stored.  A
streaming response cannot be stored: TypeError, rolled back, 500.

Class-based views: decorate the class (its ``dispatch``), or use
``method_decorator(idempotent(...), name="post")``.  Only ``methods`` are
guarded (POST, PUT, PATCH, DELETE); GET, HEAD, OPTIONS pass through.

Inside a transaction already open on ``using`` (``ATOMIC_REQUESTS``, a
``TestCase``, the caller's own ``atomic()``) the guard is a savepoint: a
stored answer is released into the outer transaction and becomes durable
when it commits (a rollback of the outer transaction forgets the key with
its writes); a replay, a refused status or an error rolls back to the
savepoint; 40001/40P01 are not retried (the error propagates: only the
whole outer transaction can be retried).

``request.idempotency``: {"key", "scope", "using", "conn"} while the view runs.

Phases (a request that calls another system, resumable after a crash):
``@idempotent_phases(scope=..., phases=[...])`` on a view ``(request,
state)``, on Django's connection too (below).
"""
import functools
import inspect
import os
import re
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from django.conf import settings
from django.core.exceptions import (BadRequest, ImproperlyConfigured, PermissionDenied,
                                    SuspiciousOperation)
from django.db import NotSupportedError, connections, router, transaction
from django.db.migrations.operations.base import Operation
from django.http import Http404, HttpRequest, HttpResponse
from django.http.multipartparser import MultiPartParserError
from django.http.request import RawPostDataException

from ._compat import EXTENSION_MIN, VERSION, VERSION_SQL, _older
from ._phases import Json, Phase, PhaseError, State, run_phases_on
from .core import (Answer, Captured, InvalidKey, MissingKey, Options, Transaction, default_store,
                   lookup_retry_after, parse_key, problem, request_json, run)
from .phased import PhasedOptions, failure, outcome_answer, result_answer

__all__ = ["InstallIdempotency", "Phase", "PhaseError", "UNSAFE_METHODS", "django_transaction",
           "idempotent", "idempotent_phases", "send"]

UNSAFE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
# exceptions Django itself answers with a 4xx: answers like any other (stored
# by default), as Flask's abort(4xx) and FastAPI's HTTPException
CLIENT_ERRORS = (Http404, PermissionDenied, BadRequest, SuspiciousOperation, MultiPartParserError)
View = Callable[..., Any]


class _DjangoTx:
    """A core.Transaction on connections[using], in transaction.atomic()."""

    def __init__(self, using: str, nested: bool) -> None:
        self.using = using
        self.connection = connections[using]
        self.nested = nested

    def execute(self, sql: str, params: Sequence[Any]) -> Optional[Sequence[Any]]:
        with self.connection.cursor() as cur:
            cur.execute(sql, tuple(params))
            row: Optional[Sequence[Any]] = cur.fetchone() if cur.description else None
            return row

    def set_rollback(self) -> None:
        transaction.set_rollback(True, using=self.using)


@contextmanager
def django_transaction(using: str = "default") -> Iterator[_DjangoTx]:
    """One guarded transaction on Django's connection ``using``:
    ``transaction.atomic(using)``, a savepoint when one is open already."""
    nested = connections[using].in_atomic_block
    with transaction.atomic(using=using):
        yield _DjangoTx(using, nested)


def send(answer: Answer) -> HttpResponse:
    """An Answer -> the HttpResponse to send: the view's own response when it
    ran, else the stored (or error) one, byte for byte."""
    if answer.original is not None:
        original: HttpResponse = answer.original
        return original
    resp = HttpResponse(answer.body, status=answer.status)
    if "Content-Type" not in answer.headers and "content-type" not in answer.headers:
        del resp["Content-Type"]
    for name, value in answer.headers.items():
        resp[name] = value
    if answer.replayed:
        resp["Idempotent-Replayed"] = "true"
    return resp


def _find_request(args: Tuple[Any, ...]) -> HttpRequest:
    """The HttpRequest among a view's first arguments: (request, ...) for a
    function, (self, request, ...) for a method; a DRF Request's own."""
    for a in args[:2]:
        if isinstance(a, HttpRequest):
            return a
        inner = getattr(a, "_request", None)
        if isinstance(inner, HttpRequest):
            return inner
    raise TypeError("@idempotent: the view was not called with an HttpRequest")


def _body(request: HttpRequest) -> bytes:
    try:
        return bytes(request.body)
    except RawPostDataException:
        raise TypeError("@idempotent: the request body was read as a stream before the guard; "
                        "put @idempotent outermost (above @api_view, or on dispatch)") from None


def _capture(response: Any) -> Captured:
    """The view's answer -> what is stored: rendered first (TemplateResponse,
    a finalized DRF Response); a streaming response is refused."""
    if getattr(response, "streaming", False):
        raise TypeError("@idempotent: a streaming response (StreamingHttpResponse, FileResponse) "
                        "cannot be stored for replay; return an HttpResponse")
    render = getattr(response, "render", None)
    if callable(render) and not getattr(response, "is_rendered", True):
        if hasattr(response, "data") and not hasattr(response, "accepted_renderer"):
            raise TypeError("@idempotent: a DRF Response reached the guard before DRF finalized "
                            "it; put @idempotent above @api_view (or on the APIView's dispatch)")
        response = render() or response
    if not isinstance(response, HttpResponse):
        raise TypeError(f"@idempotent: the view returned {type(response).__name__}, "
                        "not an HttpResponse")
    headers = getattr(response, "headers", None)
    get: Callable[[str], Optional[str]] = headers.get if headers is not None else response.get
    return Captured(response.status_code, get, bytes(response.content), response)


def idempotent(*, scope: Union[str, Callable[[Any], str]], using: str = "default",
               methods: Iterable[str] = UNSAFE_METHODS,
               user: Optional[Callable[[Any], Any]] = None, lock_wait_ms: Optional[int] = None,
               retries: int = 3, required: bool = True, headers: Iterable[str] = (),
               ttl: Optional[str] = None,
               store: Callable[[int], bool] = default_store,
               lock_wait_seconds: Optional[float] = None,
               ttl_seconds: Optional[float] = None) -> Callable[[Any], Any]:
    """The decorator: on a function view, a view method, or a View class
    (its ``dispatch``).  ``scope``: str or callable(request); ``user``:
    callable(request) -> id (a scope per user, e.g.
    ``lambda r: r.user.pk``); ``using``: the database alias; the rest as
    ``core.Options``."""
    options = Options(scope, user=user, lock_wait_ms=lock_wait_ms, retries=retries,
                      required=required, headers=headers, ttl=ttl, store=store,
                      lock_wait_seconds=lock_wait_seconds, ttl_seconds=ttl_seconds)
    guarded = frozenset(m.upper() for m in methods)

    def guard(view: View) -> View:
        if inspect.iscoroutinefunction(view):
            raise TypeError("@idempotent guards sync views: the transaction is Django's "
                            "(sync) connection's; write the view as a def")

        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            request = _find_request(args)
            if request.method not in guarded:
                return view(*args, **kwargs)
            try:
                key = parse_key([request.headers["Idempotency-Key"]]
                                if "Idempotency-Key" in request.headers else [])
            except MissingKey as e:
                if options.required:
                    return send(problem(400, "Idempotency-Key missing", str(e)))
                return view(*args, **kwargs)
            except InvalidKey as e:
                return send(problem(400, "Invalid Idempotency-Key", str(e)))
            fingerprint = request_json(str(request.method), request.get_full_path(),
                                       _body(request))
            scope_ = options.scope_for(request)

            def work(tx: Transaction) -> Captured:
                info: Dict[str, Any] = {"key": key, "scope": scope_, "using": using,
                                        "conn": tx.connection}
                setattr(request, "idempotency", info)
                try:
                    response = view(*args, **kwargs)
                except CLIENT_ERRORS as e:	# Django's own 404/403/400 page
                    from django.core.handlers.exception import response_for_exception
                    response = response_for_exception(request, e)
                return _capture(response)

            return send(run(lambda: django_transaction(using), key, scope_, fingerprint, work,
                            options))

        return wrapper

    def decorate(view: Any) -> Any:
        if isinstance(view, type):	# a class-based view: guard its dispatch
            setattr(view, "dispatch", guard(getattr(view, "dispatch")))
            return view
        return guard(view)

    return decorate


def idempotent_phases(*, scope: Union[str, Callable[[Any], str]], phases: Sequence[Phase],
                      using: str = "default", user: Optional[Callable[[Any], Any]] = None,
                      lease_seconds: Optional[float] = None,
                      renew_every_seconds: Optional[float] = None,
                      ttl_seconds: Optional[float] = None, headers: Iterable[str] = (),
                      store: Callable[[int], bool] = default_store) -> Callable[[View], View]:
    """Phases behind one decorator (``pg_idempotency.phased`` has the HTTP
    rules), on Django's connection ``using``: begin() in a transaction of
    its own, each phase in ``transaction.atomic(using)`` with its checkpoint
    (its ORM writes commit with it), an ``external`` phase outside any;
    the lease renewed by a thread on its own connection (closed when it
    ends).  Each phase gets ``ctx.conn`` (``connections[using]``),
    ``ctx.req`` (the HttpRequest) and ``ctx.request`` (the fingerprinted
    {"method", "path", "body"}).  The view is the response: ``view(request,
    state)`` (the final state: every phase's result under its name), called
    in the last phase's transaction, returns an HttpResponse, stored and
    replayed byte for byte.  Not inside an open transaction
    (ATOMIC_REQUESTS): the phases commit one by one (RuntimeError).

        @csrf_exempt
        @idempotent_phases(scope="transfers", phases=[Phase("debit", debit), ...])
        def transfer(request, state): return JsonResponse(state["charge"], status=201)
    """
    o = PhasedOptions("idempotent_phases", scope, phases, user=user, lease_seconds=lease_seconds,
                      renew_every_seconds=renew_every_seconds, ttl_seconds=ttl_seconds,
                      headers=headers, store=store)

    def transactions() -> Any:
        return django_transaction(using)

    def close_thread_connection() -> None:
        connections[using].close()

    def guard(view: View) -> View:
        if inspect.iscoroutinefunction(view):
            raise TypeError("@idempotent_phases runs sync views (Django's connection is sync)")

        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            request = _find_request(args)
            try:
                key = parse_key([request.headers["Idempotency-Key"]]
                                if "Idempotency-Key" in request.headers else [])
            except InvalidKey as e:
                title = "Idempotency-Key missing" if isinstance(e, MissingKey) else "Invalid Idempotency-Key"
                return send(problem(400, title, str(e)))
            fingerprint = request_json(str(request.method), request.get_full_path(), _body(request))
            scope_ = o.scope_for(request)
            fresh: List[Captured] = []

            def respond(state: State) -> Json:
                try:
                    response = view(*args, state, **kwargs)
                except CLIENT_ERRORS as e:
                    from django.core.handlers.exception import response_for_exception
                    response = response_for_exception(request, e)
                got = _capture(response)
                stored = o.stored(got)
                fresh.append(got)
                return stored

            try:
                r = run_phases_on(transactions, key, o.phases, respond, who="idempotent_phases",
                                  scope=scope_, request=fingerprint, lease=o.lease_seconds,
                                  renew_every=o.renew_every_seconds, ttl=o.ttl_seconds,
                                  failure=failure, renew_thread_exit=close_thread_connection,
                                  req=request)
            except Exception as e:
                answer = outcome_answer(e, lambda: lookup_retry_after(transactions, key, scope_))
                if answer is None:
                    raise
                return send(answer)
            if r.outcome != "replay" and fresh:
                return fresh[-1].original
            return send(result_answer(r.outcome, r.response, r.status))

        return wrapper

    return guard


# what the portable edition's install script records in the schema's comment
_PORTABLE_RECORD = re.compile(
    r"COMMENT ON SCHEMA idempotency IS 'idempotency ([0-9][0-9.]*) \(portable edition\)'")


def _portable_install_script(script: "Union[str, os.PathLike[str]]") -> str:
    """The text of the portable edition's install script at ``script``;
    ImproperlyConfigured, before anything runs, for a file that cannot be
    read, that is not that script (the C edition's idempotency--X.sql is
    for CREATE EXTENSION: psql meta-commands, C functions), or whose version
    is older than this client needs (every request would be refused)."""
    path = os.fspath(script)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ImproperlyConfigured(
            f"the portable edition's script {path!r} (IDEMPOTENCY_PORTABLE_SCRIPT or "
            f"InstallIdempotency(portable_script=...)) cannot be read: {e}") from e
    m = _PORTABLE_RECORD.search(text)
    if m is None:
        raise ImproperlyConfigured(
            f"{path!r} is not the portable edition's install script (portable/build/"
            "idempotency--<version>.sql, which records 'idempotency <version> (portable "
            "edition)' in the schema's comment); the C edition's idempotency--<version>.sql "
            "is for CREATE EXTENSION only")
    if _older(m.group(1), EXTENSION_MIN):
        raise ImproperlyConfigured(
            f"{path!r} installs idempotency {m.group(1)}; pg_idempotency {VERSION} needs "
            f"{EXTENSION_MIN} or newer: use the portable edition's script of that version")
    return text


def _migrating(schema_editor: Any, app_label: str) -> Any:
    """The connection a migration of app_label runs on, if PostgreSQL's and
    the routers let it migrate there; else None (the operation is skipped)."""
    conn = schema_editor.connection
    if conn.vendor != "postgresql" or not router.allow_migrate(conn.alias, app_label):
        return None
    return conn


class InstallIdempotency(Operation):  # type: ignore[misc]  # Django ships no types
    """A migration operation that installs ``idempotency`` in the database by
    whichever edition the server offers, so that one migration serves both:

        from django.db import migrations
        from pg_idempotency.django import InstallIdempotency

        class Migration(migrations.Migration):
            dependencies = []
            operations = [InstallIdempotency()]

    Nothing happens where idempotency is installed already (the extension,
    or a plain install of the portable edition, which records its version in
    its schema's comment).  Where the server offers the extension (the C
    edition's control file, or the portable edition registered with
    pg_tle): ``CREATE EXTENSION idempotency``.  Elsewhere (Cloud SQL, Azure, Neon: a plain install):
    the portable edition's script, read from ``portable_script`` or the
    setting ``IDEMPOTENCY_PORTABLE_SCRIPT`` (a path), run as the migrating
    role, which must own the database.  ImproperlyConfigured, before
    anything is written: neither is set, or the file is not that script, or
    it installs an older version than this client needs.  A test database
    Django makes gets it the same way (the C edition's CREATE EXTENSION
    needs a superuser there too, or a template database that has the
    extension: TEST["TEMPLATE"]).  Migrating back drops the extension and
    every stored key; a plain install is left for its owner to remove
    (NotSupportedError: ``DROP SCHEMA idempotency CASCADE`` removes it with
    every stored key)."""

    reversible = True
    reduces_to_sql = False	# decided when it runs: sqlmigrate shows describe()

    def __init__(self, portable_script: Optional[str] = None) -> None:
        self.portable_script = portable_script

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def describe(self) -> str:
        return "Installs idempotency (the extension, or the portable edition's script)"

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        conn = _migrating(schema_editor, app_label)
        if conn is None:
            return
        with conn.cursor() as c:
            c.execute(VERSION_SQL)
            if c.fetchone()[0] is not None:
                return
            # pg_catalog's = on any search_path; pg_tle is its extension
            # row (a schema named pgtle may be anyone's)
            c.execute("SELECT EXISTS (SELECT FROM pg_catalog.pg_available_extensions AS a "
                      "WHERE a.name OPERATOR(pg_catalog.=) 'idempotency'), "
                      "EXISTS (SELECT FROM pg_catalog.pg_extension AS e "
                      "WHERE e.extname OPERATOR(pg_catalog.=) 'pg_tle')")
            available, pgtle = c.fetchone()
            if not available and pgtle:
                c.execute("SELECT EXISTS (SELECT FROM pgtle.available_extensions() AS a "
                          "WHERE a.name OPERATOR(pg_catalog.=) 'idempotency')")
                available = c.fetchone()[0]
            if available:
                c.execute("CREATE EXTENSION idempotency")
                return
            script = self.portable_script or getattr(settings, "IDEMPOTENCY_PORTABLE_SCRIPT", None)
            if not script:
                raise ImproperlyConfigured(
                    "this server offers no idempotency extension (no control file, no pg_tle "
                    "registration): set IDEMPOTENCY_PORTABLE_SCRIPT (or InstallIdempotency("
                    "portable_script=...)) to the path of the portable edition's "
                    "idempotency--<version>.sql, which this migration then runs")
            c.execute(_portable_install_script(script))

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        conn = _migrating(schema_editor, app_label)
        if conn is None:
            return
        with conn.cursor() as c:
            c.execute("SELECT EXISTS (SELECT FROM pg_catalog.pg_extension AS e "
                      "WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency')")
            extension = c.fetchone()[0]
            c.execute(VERSION_SQL)
            if extension:
                c.execute("DROP EXTENSION idempotency")
            elif c.fetchone()[0] is not None:
                raise NotSupportedError(
                    "idempotency is a plain install here (the portable edition by its script): "
                    "its owner removes it with DROP SCHEMA idempotency CASCADE, every stored key with it")
