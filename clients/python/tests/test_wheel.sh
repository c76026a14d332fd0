#!/usr/bin/env bash
# clients/python/tests/test_wheel.sh: the Python package as a user installs it,
# with no package index: `mypy --strict` on the source (Debian's python3-mypy),
# the wheel built offline (Debian's python3-build, --no-isolation), its
# contents (every module, py.typed, the README in its metadata), installed
# into a fresh venv that sees Debian's packages, then from that venv alone
# (no PYTHONPATH, not the checkout): a typed app checked by mypy --strict
# against the installed package, and the Django and Flask examples serving a
# guarded request and its replay over HTTP.  Prints "ok - ..." lines.
#
#   WORKDIR=... DATABASE_HOST/PORT/NAME/USER=... bash test_wheel.sh
# (test/clients/run runs it; psql reaches the database through libpq's env)
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
PY=/usr/bin/python3
W=${WORKDIR:?}/wheel
rm -rf "$W" && mkdir -p "$W/src" "$W/dist"
fails=0
check() {	# description command...
	local d=$1 t=$SECONDS; shift
	if "$@" >"$W/last.log" 2>&1; then
		echo "ok - [python wheel] $d"
		echo "# $((SECONDS - t))s"
	else
		echo "not ok - [python wheel] $d"
		sed 's/^/# /' "$W/last.log" | tail -15
		fails=$((fails + 1))
	fi
}

# mypy's cache of what it read of Django, FastAPI, ... (a cold run takes a
# minute of a loaded machine; the cache is checked against the files)
MYPY_CACHE=/var/cache/idempotency/mypy
mkdir -p "$MYPY_CACHE" 2>/dev/null || MYPY_CACHE=$W/mypy-cache
check "mypy --strict on the package source (Debian's python3-mypy): clean" \
	bash -c "cd '$SRC' && $PY -m mypy --strict --cache-dir '$MYPY_CACHE/src' pg_idempotency"

# a copy: a build writes build/ and *.egg-info next to the sources
cp -R "$SRC/pyproject.toml" "$SRC/README.md" "$SRC/pg_idempotency" "$W/src/"
find "$W/src" -name __pycache__ -prune -exec rm -rf {} +
check "python3 -m build --no-isolation --wheel: builds offline" \
	bash -c "cd '$W/src' && $PY -m build --no-isolation --wheel --outdir '$W/dist'"
WHL=$(ls "$W"/dist/*.whl 2>/dev/null | head -1)
echo "# wheel: $(basename "${WHL:-none}") $(stat -c %s "${WHL:-/dev/null}" 2>/dev/null) bytes"

wheel_has() {
	$PY - "$WHL" <<'EOF'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = set(z.namelist())
want = {f"pg_idempotency/{m}" for m in ("__init__.py", "core.py", "_core.py", "drivers.py", "guard.py",
                                        "django.py", "fastapi.py", "flask.py", "py.typed")}
missing = want - names
meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
text = z.read(meta).decode()
ok = not missing and "## Options (all integrations)" in text and "Version: 0.6.0" in text \
    and "Requires-Dist: psycopg" not in text.split("Provides-Extra")[0]
print(sorted(names), missing)
sys.exit(0 if ok else 1)
EOF
}
check "the wheel carries every module, py.typed, the README (its metadata) and no required dependency" wheel_has

V=$W/venv
check "a fresh venv (--system-site-packages) installs the wheel with pip --no-index" \
	bash -c "$PY -m venv --system-site-packages '$V' && '$V/bin/pip' install --no-index --no-cache-dir \
		--disable-pip-version-check -q '$WHL'"
installed() {
	cd / && env -u PYTHONPATH "$V/bin/python" -c '
import sys, pg_idempotency, pg_idempotency.django
assert pg_idempotency.__file__.startswith(sys.argv[1]), pg_idempotency.__file__
assert pg_idempotency.__version__ == "0.6.0"
print(pg_idempotency.__file__)' "$V/"
}
check "the venv imports pg_idempotency from the installed wheel (not the checkout)" installed

cat >"$W/typed_app.py" <<'EOF'
from pg_idempotency import Answer, MissingKey, Options, default_store, parse_key
from pg_idempotency.core import problem


def answer_for(values: list[str]) -> Answer:
    o = Options("payments", store=lambda s: default_store(s) or s == 429)
    try:
        key: str = parse_key(values)
    except MissingKey as e:
        return problem(400, "no key", f"{o.scope_for(None)}: {e}")
    return Answer(201, {"Location": f"/payments/{key}"}, b"")
EOF
cat >"$W/typed_bad.py" <<'EOF'
from pg_idempotency import parse_key

key: int = parse_key(["a"])
EOF
typed() {
	cd "$W" && env -u PYTHONPATH "$V/bin/python" -m mypy --strict --cache-dir "$MYPY_CACHE/app" typed_app.py || return 1
	! env -u PYTHONPATH "$V/bin/python" -m mypy --strict --cache-dir "$MYPY_CACHE/app" typed_bad.py >"$W/bad.log" 2>&1 &&
		grep -qiE 'incompatible types in assignment \(expression has type "str"' "$W/bad.log"
}
check "mypy --strict on a typed app against the installed package: clean; a type error in it is caught (py.typed read)" typed

serve() {	# example: start it from the venv, POST twice, check 201 + byte-exact replay + 1 row
	local app=$1 key="wheel-$1-$$-$RANDOM"
	# exec: $! is the server itself, which the kill below must reach (a
	# subshell's pid left the server running after the suite)
	(cd / && exec env -u PYTHONPATH PORT=0 "$V/bin/python" "$SRC/examples/$app" >"$W/$app.out" 2>"$W/$app.err") &
	local pid=$! port=""
	for _ in $(seq 150); do
		port=$(sed -n 's/^listening \([0-9]*\)$/\1/p' "$W/$app.out")
		[ -n "$port" ] && break
		sleep 0.1
	done
	"$V/bin/python" - "$port" "$key" <<'EOF'
import http.client, sys
def post():
    c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=20)
    c.request("POST", "/payments", b'{"amount": "3.00"}',
              {"Content-Type": "application/json", "Idempotency-Key": sys.argv[2]})
    r = c.getresponse()
    return r.status, r.getheader("Idempotent-Replayed"), r.read()
a, b = post(), post()
print(a, b)
sys.exit(0 if a[0] == 201 and a[1] is None and b[0] == 201 and b[1] == "true" and a[2] == b[2] else 1)
EOF
	local rc=$?
	kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
	[ "$rc" -eq 0 ] && [ "$(psql -qXAt -d "$DATABASE_NAME" -c "SELECT count(*) FROM payment WHERE idem_key = '$key'")" = 1 ] ||
		{ cat "$W/$app.err"; return 1; }
}
check "from the venv alone, the Django example (Django's connection, psycopg2) serves a guarded request, then its replay; 1 row" \
	serve django_app.py
check "from the venv alone, the Flask example (psycopg 3 pool) serves a guarded request, then its replay; 1 row" \
	serve flask_app.py
[ "$fails" -eq 0 ]
