"""pg_idempotency: Idempotency-Key handling for web apps on the idempotency
PostgreSQL extension.  ``pg_idempotency.fastapi.idempotent`` (async,
psycopg 3), ``pg_idempotency.flask.idempotent`` (sync, psycopg 3),
``pg_idempotency.django.idempotent`` (Django's own connection: psycopg2 or
psycopg 3); ``Guard`` / ``AsyncGuard`` on psycopg 3 pools, and
``pg_idempotency.core.run`` with a driver from ``pg_idempotency.drivers``
for anything else; ``run_phases`` / ``run_phases_async`` for requests that
call other systems, in phases resumable after a crash.  clients/python/README.md documents them all.

Importing the package imports no driver: ``Guard`` and ``AsyncGuard``
(psycopg 3) load on first use."""
import importlib
from typing import Any

from ._compat import EXTENSION_MIN, VERSION, ExtensionVersionError
from .core import (Answer, Captured, InvalidKey, MissingKey, Options, decode_response,
                   default_store, encode_response, error_answer, message_of, parse_key, problem,
                   request_json, run, sqlstate_of)

__all__ = ["EXTENSION_MIN", "VERSION", "ExtensionVersionError",
           "Answer", "AsyncGuard", "Captured", "Guard", "InvalidKey", "MissingKey", "Options",
           "decode_response", "default_store", "encode_response", "error_answer", "message_of",
           "parse_key", "problem", "request_json", "run", "sqlstate_of",
           "AsyncPhase", "AsyncPhaseContext", "Phase", "PhaseContext", "PhaseError", "PhasesResult",
           "run_phases", "run_phases_async"]
__version__ = VERSION	# the extension it goes with: docs/clients.md, "Versions"


# names whose modules import a driver (psycopg 3): loaded on first use, so
# that `import pg_idempotency` (and a Django app on psycopg2) needs none
_LAZY = {"Guard": "guard", "AsyncGuard": "guard",
         # recovery points (pg_idempotency.phases, psycopg 3), where present
         "Phase": "phases", "PhaseContext": "phases", "PhaseError": "phases",
         "PhasesResult": "phases", "run_phases": "phases",
         "AsyncPhase": "phases", "AsyncPhaseContext": "phases", "run_phases_async": "phases"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        try:
            module = importlib.import_module(f".{_LAZY[name]}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{_LAZY[name]}":
                raise	# the module is there; a driver it needs is not
            raise AttributeError(f"module 'pg_idempotency' has no attribute {name!r}") from None
        return getattr(module, name)
    raise AttributeError(f"module 'pg_idempotency' has no attribute {name!r}")
