"""0.4.0's module of shared parts, kept importable: everything is now in
the public ``pg_idempotency.core`` (documented in clients/python/README.md)."""
from .core import *	# noqa: F401,F403
from .core import (BEGIN_SQL, COMPLETE_SQL, HAS_LOOKUP_SQL, LOCK_WAIT_SQL, LOOKUP_SQL,	# noqa: F401
                   KeyError400)
