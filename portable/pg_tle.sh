#!/usr/bin/env bash
# portable/pg_tle.sh — a private PostgreSQL prefix with pg_tle and without
# the idempotency C library, for the portable edition's tests (portable/check
# INSTALL=pgtle).
#
#   bash portable/pg_tle.sh        prints the prefix's pg_config
#
# The prefix (PORTABLE_PREFIX, default /var/cache/idempotency/portable-pgN)
# is portable/server.sh's copy of the host's PostgreSQL N without any file
# of the idempotency extension (the portable edition is tested where no
# library of ours exists).  pg_tle is built from its release tarball in
# ../shared/vendor (VENDOR_DIR) with the copy's pg_config and installed into
# the copy: the host's PostgreSQL is never touched and nothing of pg_tle
# enters the repository.
#
# Needs Debian's postgresql-server-dev-N flex bison libkrb5-dev (installed
# when missing, as root).  Cached: a
# second run finds pg_tle.so of the same tarball and does nothing.  Exit
# status: 0 ready, 3 the tarball is absent (the caller skips), others a
# failure (its log is printed).
set -u
here=$(cd "$(dirname "$0")" && pwd)
VENDOR_DIR=${VENDOR_DIR:-$(cd "$here/../.." && pwd)/shared/vendor}
if [ -z "${PGMAJOR:-}" ]; then
	PGMAJOR=$(${PG_CONFIG:-pg_config} --version 2>/dev/null | sed -nE 's/^PostgreSQL ([0-9]+).*/\1/p')
	PGMAJOR=${PGMAJOR:-15}
fi
TLE_VERSION=${TLE_VERSION:-1.5.2}
TARBALL=$VENDOR_DIR/pg_tle-$TLE_VERSION.tar.gz
PREFIX=${PORTABLE_PREFIX:-/var/cache/idempotency/portable-pg$PGMAJOR}
BIN=$PREFIX/lib/postgresql/$PGMAJOR/bin
LIB=$PREFIX/lib/postgresql/$PGMAJOR/lib
EXT=$PREFIX/share/postgresql/$PGMAJOR/extension

[ -f "$TARBALL" ] || { echo "no $TARBALL" >&2; exit 3; }
# the copy of the server without our files (portable/server.sh; it makes
# the copy again, without pg_tle, when the host's server changed)
PGMAJOR=$PGMAJOR PORTABLE_PREFIX=$PREFIX bash "$here/server.sh" >/dev/null || exit 2
key="pg_tle $(sha256sum "$TARBALL" | cut -d' ' -f1)"
if [ -f "$LIB/pg_tle.so" ] && [ "$(cat "$PREFIX/.pg_tle-stamp" 2>/dev/null)" = "$key" ]; then
	echo "$BIN/pg_config"
	exit 0
fi

# the build dependencies (Debian), installed when missing
pkgs=()
for p in flex bison libkrb5-dev make gcc postgresql-server-dev-$PGMAJOR; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || pkgs+=("$p")
done
if [ ${#pkgs[@]} -gt 0 ]; then
	[ "$(id -u)" = 0 ] || { echo "missing Debian packages: ${pkgs[*]}" >&2; exit 2; }
	echo "installing ${pkgs[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	{ apt-get update -qq && apt-get install -y -qq "${pkgs[@]}"; } >/dev/null 2>&1 ||
		{ echo "apt-get install ${pkgs[*]} failed" >&2; exit 2; }
fi

exec 9>"$PREFIX.lock"
flock 9
if [ -f "$LIB/pg_tle.so" ] && [ "$(cat "$PREFIX/.pg_tle-stamp" 2>/dev/null)" = "$key" ]; then
	echo "$BIN/pg_config"
	exit 0
fi

SRC=$(mktemp -d /tmp/pg_tle-build.XXXXXX)
trap 'rm -rf "$SRC"' EXIT
tar -xzf "$TARBALL" -C "$SRC" --strip-components=1 || exit 2
unset COPT PROFILE MAKEFLAGS MFLAGS MAKELEVEL
(
	cd "$SRC" &&
		make -j2 PG_CONFIG="$BIN/pg_config" &&
		make install PG_CONFIG="$BIN/pg_config"
) >"$SRC/build.log" 2>&1 || { tail -n 40 "$SRC/build.log" >&2; exit 2; }
[ -f "$LIB/pg_tle.so" ] || { echo "pg_tle.so not in $PREFIX" >&2; exit 2; }
echo "$key" >"$PREFIX/.pg_tle-stamp"
echo "$BIN/pg_config"
