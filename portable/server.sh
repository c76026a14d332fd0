#!/usr/bin/env bash
# portable/server.sh — a private copy of the host's PostgreSQL without any
# file of the idempotency C extension, for the portable edition's tests
# (portable/check refuses a PostgreSQL that has the library).
#
#   bash portable/server.sh        prints the copy's pg_config
#
# The copy (PORTABLE_PREFIX, default /var/cache/idempotency/portable-pgN,
# N = PGMAJOR, else the major pg_config names, else 15) holds the host's
# /usr/lib/postgresql/N, /usr/share/postgresql/N and /usr/include/postgresql,
# laid out as Debian lays them out so the copied binaries find their
# directories by relative path; idempotency.so, its bitcode, its control
# file and its scripts are removed from it.  The host's PostgreSQL is only
# read.  Everything in the copy stays readable by every user (the server
# runs as the postgres user), and nothing in it points back into the
# checkout, which may be a directory only root can enter.
#
# Cached: the copy is made again only when the host's server changes (its
# `postgres --version`, which names the Debian package version, and the
# size and time of the binary).  pg_tle.sh installs pg_tle into the same
# copy.  Exit status: 0 ready, 2 a failure.
set -u
if [ -z "${PGMAJOR:-}" ]; then
	PGMAJOR=$(${PG_CONFIG:-pg_config} --version 2>/dev/null | sed -nE 's/^PostgreSQL ([0-9]+).*/\1/p')
	PGMAJOR=${PGMAJOR:-15}
fi
PREFIX=${PORTABLE_PREFIX:-/var/cache/idempotency/portable-pg$PGMAJOR}
HOSTBIN=/usr/lib/postgresql/$PGMAJOR/bin
BIN=$PREFIX/lib/postgresql/$PGMAJOR/bin
LIB=$PREFIX/lib/postgresql/$PGMAJOR/lib
EXT=$PREFIX/share/postgresql/$PGMAJOR/extension

[ -x "$HOSTBIN/postgres" ] || { echo "portable/server.sh: no PostgreSQL $PGMAJOR at $HOSTBIN" >&2; exit 2; }
key="$("$HOSTBIN/postgres" --version) $(stat -c '%s %Y' "$HOSTBIN/postgres")"
ready() {
	[ "$(cat "$PREFIX/.server-stamp" 2>/dev/null)" = "$key" ] && [ -x "$BIN/postgres" ] &&
		[ ! -e "$LIB/idempotency.so" ]
}
if ready; then
	echo "$BIN/pg_config"
	exit 0
fi

# one copier at a time; the others wait and then find the copy ready
mkdir -p "$(dirname "$PREFIX")"
exec 9>"$PREFIX.lock"
flock 9
if ! ready; then
	rm -rf "$PREFIX"
	mkdir -p "$PREFIX/lib/postgresql" "$PREFIX/share/postgresql" "$PREFIX/include" &&
		cp -a "/usr/lib/postgresql/$PGMAJOR" "$PREFIX/lib/postgresql/" &&
		cp -a "/usr/share/postgresql/$PGMAJOR" "$PREFIX/share/postgresql/" &&
		cp -a /usr/include/postgresql "$PREFIX/include/" || {
		echo "portable/server.sh: could not copy PostgreSQL $PGMAJOR into $PREFIX" >&2
		exit 2
	}
	rm -f "$LIB/idempotency.so" "$EXT/idempotency.control" "$EXT"/idempotency--*.sql
	rm -rf "$LIB/bitcode/idempotency" "$LIB/bitcode/idempotency.index.bc"
	chmod -R a+rX "$PREFIX"
	echo "$key" >"$PREFIX/.server-stamp"
fi
ready || { echo "portable/server.sh: $PREFIX is not a PostgreSQL without idempotency" >&2; exit 2; }
echo "$BIN/pg_config"
