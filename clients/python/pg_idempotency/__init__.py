"""pg_idempotency: Idempotency-Key handling for web apps on psycopg 3 and the
idempotency PostgreSQL extension.  ``pg_idempotency.fastapi.idempotent``
(async), ``pg_idempotency.flask.idempotent`` (sync); ``Guard`` /
``AsyncGuard`` for anything else."""
from ._core import Answer, Options, default_store, parse_key
from .guard import AsyncGuard, Captured, Guard

__all__ = ["Answer", "AsyncGuard", "Captured", "Guard", "Options", "default_store", "parse_key"]
__version__ = "0.4.0"
