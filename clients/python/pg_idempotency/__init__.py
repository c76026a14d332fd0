"""pg_idempotency: Idempotency-Key handling for web apps on psycopg 3 and the
idempotency PostgreSQL extension.  ``pg_idempotency.fastapi.idempotent``
(async), ``pg_idempotency.flask.idempotent`` (sync); ``Guard`` /
``AsyncGuard`` for anything else; ``run_phases`` / ``run_phases_async`` for requests that call
other systems, in phases resumable after a crash."""
from ._core import Answer, Options, default_store, parse_key
from .guard import AsyncGuard, Captured, Guard
from .phases import (AsyncPhase, AsyncPhaseContext, Phase, PhaseContext, PhaseError, PhasesResult,
                     run_phases, run_phases_async)

__all__ = ["Answer", "AsyncGuard", "Captured", "Guard", "Options", "default_store", "parse_key",
           "AsyncPhase", "AsyncPhaseContext", "Phase", "PhaseContext", "PhaseError", "PhasesResult",
           "run_phases", "run_phases_async"]
__version__ = "0.4.0"
