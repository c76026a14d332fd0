"""The client refuses a database whose idempotency extension is older than
it needs (docs/clients.md, "Versions"): a client x.y.z needs the extension
x.y.0 or newer.  Asked once per pool (``Guard``, ``AsyncGuard``) or per
connection (``core.run`` on a driver's connection, Django's connection,
the phases, the relay): the first guarded request sends one query, every
later one reuses the answer, so a request costs no extra round trip.  A
refusal is not remembered: after ``ALTER EXTENSION idempotency UPDATE`` the
next request asks again and goes through."""
import re
import threading
import weakref
from typing import Any, Awaitable, Callable, Dict, MutableMapping, Optional, Sequence

VERSION = "0.6.0"
# the oldest extension this client works with: its own major.minor
EXTENSION_MIN = re.sub(r"^(\d+)\.(\d+)\..*$", r"\1.\2.0", VERSION)
# the extension's version; a plain install of the portable edition (psql -f,
# no extension) records it in the schema's comment instead.  Its = is
# pg_catalog's whatever the search_path (a schema put before pg_catalog may
# have an = of its own)
VERSION_SQL = (
    "SELECT COALESCE((SELECT e.extversion FROM pg_catalog.pg_extension AS e"
    " WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency'),"
    " (SELECT pg_catalog.substring(pg_catalog.obj_description(n.oid, 'pg_namespace'),"
    " '^idempotency ([0-9.]+) \\(portable edition\\)$')"
    " FROM pg_catalog.pg_namespace AS n WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency'))"
    " AS extversion"
)

_weak: "MutableMapping[Any, str]" = weakref.WeakKeyDictionary()
_plain: Dict[Any, str] = {}
_lock = threading.Lock()
queries = 0	# version queries sent (the tests count them)


class ExtensionVersionError(RuntimeError):
    """The database's idempotency extension is older than this client needs
    (or missing): ``found`` (None when missing) and ``needed``."""

    def __init__(self, found: Optional[str]) -> None:
        self.found = found
        self.needed = EXTENSION_MIN
        if found is None:
            text = (f"pg_idempotency {VERSION} needs the idempotency extension {EXTENSION_MIN} or "
                    "newer; it is not installed in this database (CREATE EXTENSION idempotency, or psql -f of the portable edition)")
        else:
            text = (f"pg_idempotency {VERSION} needs the idempotency extension {EXTENSION_MIN} or "
                    f"newer; this database has {found} (ALTER EXTENSION idempotency UPDATE; a plain install: the portable upgrade script)")
        super().__init__(text)


def _parts(v: str) -> Sequence[int]:
    return [int(n) if n.isdigit() else 0 for n in v.split(".")]


def _older(a: str, b: str) -> bool:
    x, y = list(_parts(a)), list(_parts(b))
    n = max(len(x), len(y))
    return x + [0] * (n - len(x)) < y + [0] * (n - len(y))


def _known(key: Any) -> Optional[str]:
    with _lock:
        try:
            return _weak.get(key)
        except TypeError:
            return _plain.get(key)


def _remember(key: Any, found: str) -> None:
    with _lock:
        try:
            _weak[key] = found
        except TypeError:
            _plain[key] = found


def _verdict(row: Any) -> str:
    found = None if not row else row[0]
    if found is None or _older(str(found), EXTENSION_MIN):
        raise ExtensionVersionError(None if found is None else str(found))
    return str(found)


def check(key: Any, query: Callable[[str], Any]) -> str:
    """The extension's version for ``key`` (a pool, a connection): asked
    with ``query(VERSION_SQL)`` (-> its row, or None) the first time;
    raises ExtensionVersionError when it is older than EXTENSION_MIN."""
    global queries
    found = _known(key)
    if found is not None:
        return found
    queries += 1
    found = _verdict(query(VERSION_SQL))
    _remember(key, found)
    return found


async def check_async(key: Any, query: Callable[[str], Awaitable[Any]]) -> str:
    """``check`` for asyncio: ``await query(VERSION_SQL)`` -> its row."""
    global queries
    found = _known(key)
    if found is not None:
        return found
    queries += 1
    found = _verdict(await query(VERSION_SQL))
    _remember(key, found)
    return found
