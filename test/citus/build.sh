#!/usr/bin/env bash
# test/citus/build.sh — a private PostgreSQL prefix with Citus built into it,
# for the Citus suite (test/citus/run) and bench/citus.sh: PostgreSQL 15
# (PGMAJOR=N for another installed major: 17 with Citus 13.2.2, 18 with
# 14.0.1; `make test PG=17|18` runs it in that major's chroot, where the
# prefix is kept in the cached chroot's /var/cache/idempotency, see
# test/chroot.sh scratch).
#
#   bash test/citus/build.sh        prints the prefix's bin directory
#
# The prefix is a copy of the host's PostgreSQL (/usr/lib/postgresql/15,
# /usr/share/postgresql/15, /usr/include/postgresql) laid out as Debian lays
# it out, so the copied binaries find their share and lib directories by
# relative path.  Citus is configured with that copy's pg_config and
# installed into it: the host's own PostgreSQL is never touched.  Nothing of
# Citus enters the repository: it is built from the release tarball in
# ../shared/vendor (VENDOR_DIR) at test time.
#
# Cached: a second run with the same host PostgreSQL and the same tarball
# does nothing (stamp file).  A cold build takes about two minutes here
# (Citus 14.0.1 in the sid chroot: 84 s, and about 10 s of apt-get).
# Exit status: 0 ready, 3 the tarball is absent (the caller skips), other
# values a failure (its log is printed).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# ../shared/vendor beside the checkout
VENDOR_DIR=${VENDOR_DIR:-$(cd "$here/../../.." && pwd)/shared/vendor}
# PGMAJOR (15) picks the server; Citus 13.2.2 builds against 15-17, 14.0.1
# against 16-18 (18 needs a system that has PostgreSQL 18: a chroot)
PGMAJOR=${PGMAJOR:-15}
if [ "$PGMAJOR" -ge 18 ]; then CITUS_VERSION=${CITUS_VERSION:-14.0.1}; fi
CITUS_VERSION=${CITUS_VERSION:-13.2.2}
TARBALL=$VENDOR_DIR/citus-$CITUS_VERSION.tar.gz
PREFIX=${CITUS_PREFIX:-/var/cache/idempotency/citus-pg$PGMAJOR}
HOSTBIN=/usr/lib/postgresql/$PGMAJOR/bin

[ -f "$TARBALL" ] || { echo "no $TARBALL" >&2; exit 3; }
[ -x "$HOSTBIN/postgres" ] || { echo "no PostgreSQL $PGMAJOR at $HOSTBIN" >&2; exit 2; }

# Debian packages, installed when missing (as root)
need() {
	local p pkgs=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || pkgs+=("$p")
	done
	[ ${#pkgs[@]} -eq 0 ] && return 0
	[ "$(id -u)" = 0 ] || { echo "missing Debian packages: ${pkgs[*]}" >&2; exit 2; }
	echo "installing ${pkgs[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	{ apt-get update -qq && apt-get install -y -qq "${pkgs[@]}"; } >/dev/null 2>&1 ||
		{ echo "apt-get install ${pkgs[*]} failed" >&2; exit 2; }
}
# what the suite needs even from a warm cache (a fresh chroot whose
# /var/cache/idempotency is kept between runs, test/chroot.sh run): gdb, for
# the suite's crash between PREPARE and COMMIT PREPARED
need gdb

# the cache key: the host server's version and the tarball's checksum
key="$("$HOSTBIN/postgres" --version) $(sha256sum "$TARBALL" | cut -d' ' -f1)"
BIN=$PREFIX/lib/postgresql/$PGMAJOR/bin
if [ -f "$PREFIX/.stamp" ] && [ "$(cat "$PREFIX/.stamp")" = "$key" ] &&
	[ -f "$PREFIX/lib/postgresql/$PGMAJOR/lib/citus.so" ]; then
	echo "$BIN"
	exit 0
fi

# the build dependencies: what Citus links (lz4, zstd, ssl, curl: see
# configure below) and what the server's headers include (gssapi and
# openssl in libpq-int.h, ICU in pg_locale.h).  Not the server's whole
# build-dependency list: sid's libselinux1-dev, say, is at times not
# installable beside its libselinux1, and Citus does not need it.
need liblz4-dev libzstd-dev libkrb5-dev libssl-dev libicu-dev libcurl4-openssl-dev \
	zlib1g-dev make gcc postgresql-server-dev-$PGMAJOR

# one builder at a time; others wait and then find the cache warm
mkdir -p "$(dirname "$PREFIX")"
exec 9>"$PREFIX.lock"
flock 9
if [ -f "$PREFIX/.stamp" ] && [ "$(cat "$PREFIX/.stamp")" = "$key" ]; then
	echo "$BIN"
	exit 0
fi

echo "building Citus $CITUS_VERSION into $PREFIX (cold cache)" >&2
start=$(date +%s)
rm -rf "$PREFIX"
mkdir -p "$PREFIX/lib/postgresql" "$PREFIX/share/postgresql" "$PREFIX/include"
cp -a /usr/lib/postgresql/$PGMAJOR "$PREFIX/lib/postgresql/" &&
	cp -a /usr/share/postgresql/$PGMAJOR "$PREFIX/share/postgresql/" &&
	cp -a /usr/include/postgresql "$PREFIX/include/" || exit 2

SRC=$(mktemp -d /tmp/citus-build.XXXXXX)
trap 'rm -rf "$SRC"' EXIT
LOG=$SRC/build.log
tar -xzf "$TARBALL" -C "$SRC" --strip-components=1 || exit 2
# PostgreSQL 15.20 (and later 15.x) exports have_createdb_privilege(), which
# Citus 13.2.2 defines itself as a static inline for PostgreSQL < 16: when
# the server's header declares it, drop Citus's copy (a build-time edit of
# the unpacked source; nothing of it is kept)
if grep -q 'extern bool have_createdb_privilege' \
	"$PREFIX/include/postgresql/$PGMAJOR/server/commands/dbcommands.h"; then
	perl -0pi -e 's/static inline bool\nhave_createdb_privilege\(void\)\n\{.*?\n\}\n//s' \
		"$SRC/src/include/pg_version_compat.h" || exit 2
fi
# Citus without libcurl (it would only report usage statistics, which
# configure leaves off anyway), unless the server itself was built with it
# (PostgreSQL 18: OAuth): its pg_config.h then defines HAVE_LIBCURL, and
# Citus's statistics code includes curl.h and calls libcurl whatever
# --without-libcurl says, so it must link it
curl=--without-libcurl
grep -q '^#define HAVE_LIBCURL 1' "$PREFIX/include/postgresql/$PGMAJOR/server/pg_config.h" &&
	curl=--with-libcurl
# Citus is built with its own flags only: not with ours (make test
# COPT=-Werror passes COPT to every make below it in MAKEFLAGS, and
# PostgreSQL 18's PGXS warns about Citus's code with
# -Wmissing-variable-declarations: a cold build on 18 failed under CI)
unset COPT PROFILE MAKEFLAGS MFLAGS MAKELEVEL
(
	cd "$SRC" &&
		./configure "$curl" PG_CONFIG="$BIN/pg_config" &&
		make -j2 PG_CONFIG="$BIN/pg_config" &&
		make install PG_CONFIG="$BIN/pg_config"
) >"$LOG" 2>&1 || { tail -n 60 "$LOG" >&2; exit 2; }
# the copy must still be ours: Citus went into the prefix, not the host
[ -f "$PREFIX/lib/postgresql/$PGMAJOR/lib/citus.so" ] || { echo "citus.so not in $PREFIX" >&2; exit 2; }
echo "$key" >"$PREFIX/.stamp"
echo "built in $(($(date +%s) - start)) s" >&2
echo "$BIN"
