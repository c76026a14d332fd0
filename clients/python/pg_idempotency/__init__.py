"""pg_idempotency: Idempotency-Key handling for web apps on the idempotency
PostgreSQL extension.  ``pg_idempotency.fastapi.idempotent`` (async,
psycopg 3), ``pg_idempotency.flask.idempotent`` (sync, psycopg 3),
``pg_idempotency.django.idempotent`` (Django's own connection: psycopg2 or
psycopg 3); ``Guard`` / ``AsyncGuard`` on psycopg 3 pools, and
``pg_idempotency.core.run`` with a driver from ``pg_idempotency.drivers``
for anything else.  clients/python/README.md documents them all.

Importing the package imports no driver: ``Guard`` and ``AsyncGuard``
(psycopg 3) load on first use."""
from typing import Any

from .core import (Answer, Captured, InvalidKey, Options, decode_response, default_store,
                   encode_response, error_answer, message_of, parse_key, problem, request_json,
                   run, sqlstate_of)

__all__ = ["Answer", "AsyncGuard", "Captured", "Guard", "InvalidKey", "Options",
           "decode_response", "default_store", "encode_response", "error_answer", "message_of",
           "parse_key", "problem", "request_json", "run", "sqlstate_of"]
__version__ = "0.5.0"


def __getattr__(name: str) -> Any:
    if name in ("Guard", "AsyncGuard"):
        from . import guard
        return getattr(guard, name)
    raise AttributeError(f"module 'pg_idempotency' has no attribute {name!r}")
