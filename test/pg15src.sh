#!/usr/bin/env bash
# test/pg15src.sh — PostgreSQL 15 built from Debian's source package, for what
# the packaged server cannot do: assertions (test/cassert/run) and pg_upgrade
# from 15 to 17 or 18 (test/upgrade/run), which needs the old and the new
# major in one system while each Debian suite ships one.
#
#   test/pg15src.sh ensure          cached bookworm chroot with PostgreSQL 15
#                                   from `apt-get source postgresql-15`,
#                                   configured --enable-cassert --enable-debug,
#                                   in /opt/pg15-cassert (with amcheck,
#                                   pg_stat_statements and the isolation
#                                   tester); built once, then reused: prints
#                                   its directory
#   test/pg15src.sh upgrade MAJOR   cached copy of `test/chroot.sh ensure MAJOR`
#                                   (17: trixie, 18: sid) with that same
#                                   /opt/pg15-cassert copied in: prints its
#                                   directory
#
# One build serves both: the binaries are built against bookworm's glibc
# (2.36) and link nothing else (no readline, zlib, ICU or OpenSSL), so they
# run unchanged under trixie's and sid's newer glibc.  The old cluster of the
# upgrade test therefore runs with assertions too; its catalog and on-disk
# format are those of any 15 (pg_upgrade checks the catalog version and
# pg_controldata, which --enable-cassert does not change).
#
# The cache lives in $IDEM_CACHE (default /var/cache/idempotency), beside
# test/chroot.sh's: chroot/pg15-cassert and chroot/pgMAJOR-from15.  A build
# that was interrupted has no .ready file and is done again; concurrent
# callers wait for one another (flock).  Logs of a failed build stay in
# chroot/NAME.log.
set -eu -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
CACHE=${IDEM_CACHE:-/var/cache/idempotency}
# the Debian mirror: $IDEM_MIRROR, else the one this machine's apt uses,
# else deb.debian.org (test/mirror.sh)
. "$here/mirror.sh"
MIRROR=$(idem_mirror)
PREFIX=/opt/pg15-cassert
JOBS=${IDEM_JOBS:-2}
# bump when the build changes: a cache built by another recipe is built again
RECIPE="pg15src 2: upstream tree of Debian's postgresql-15 source, --enable-cassert --enable-debug"

die() { echo "test/pg15src.sh: $*" >&2; exit 2; }
ready() { [ "$(cat "$1/.ready" 2>/dev/null)" = "$RECIPE" ]; }
# remove a chroot that nothing runs in: a chroot in use has the host's
# /etc/ssl/certs and the apt cache bind-mounted, which rm must never reach
safe_rm() {
	local d
	for d in "$@"; do
		[ -e "$d" ] || continue
		if awk -v p="$d/" 'index($2, p) == 1 { found = 1 } END { exit !found }' /proc/mounts; then
			die "$d is in use (mounts below it); stop what runs there first"
		fi
		rm -rf --one-file-system "$d"
	done
}

# the build, run inside the bookworm chroot
build_script() {
	cat <<-EOF
		set -eu
		echo "deb-src $MIRROR bookworm main" >/etc/apt/sources.list.d/bookworm-src.list
		apt-get update -qq
		# the downloaded-package cache is shared by every chroot of the suite:
		# wait while another chroot's apt-get holds its lock
		for i in \$(seq 1 90); do
			apt-get install -y -qq gcc make libc6-dev dpkg-dev bzip2 xz-utils perl \
				libipc-run-perl ca-certificates >/dev/null && break
			[ "\$i" = 90 ] && exit 1
			sleep 10
		done
		id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql \
			--create-home --shell /bin/bash postgres
		rm -rf /usr/src/pg15 && mkdir -p /usr/src/pg15 && cd /usr/src/pg15
		# upstream's tree: Debian's patches move the server's files into
		# Debian's layout (/usr/lib/postgresql/15/lib whatever the prefix)
		apt-get source -qq --download-only postgresql-15 2>&1 | grep -v 'unsandboxed' || true
		dpkg-source --skip-patches -x postgresql-15_*.dsc >/dev/null
		cd postgresql-15-*/
		./configure --prefix=$PREFIX --enable-cassert --enable-debug \
			--without-readline --without-zlib --without-icu >/dev/null
		make -s -j$JOBS >/dev/null
		make -s install >/dev/null
		make -s -C src/test/isolation install >/dev/null
		make -s -C contrib/amcheck install >/dev/null
		make -s -C contrib/pg_stat_statements install >/dev/null
		$PREFIX/bin/pg_config --version
		$PREFIX/bin/pg_config --configure
		cd / && rm -rf /usr/src/pg15
	EOF
}

ensure() {
	local dir=$CACHE/chroot/pg15-cassert t0
	ready "$dir" && { echo "$dir"; return 0; }
	[ "$(id -u)" = 0 ] || die "building needs root"
	mkdir -p "$CACHE/chroot"
	exec 9>"$dir.lock"
	flock 9
	ready "$dir" && { echo "$dir"; return 0; }
	safe_rm "$dir.build"
	t0=$(date +%s)
	echo "building PostgreSQL 15 with assertions from Debian's source package (once)" >&2
	bash "$here/chroot.sh" fresh 15 "$dir.build" >/dev/null
	if ! bash "$here/chroot.sh" run "$dir.build" bash -c "$(build_script)" >"$dir.log" 2>&1; then
		tail -n 30 "$dir.log" >&2
		die "building PostgreSQL 15 in $dir.build failed (log: $dir.log)"
	fi
	echo "built in $(($(date +%s) - t0)) s: $(grep -m1 "^PostgreSQL 15" "$dir.log")" >&2
	echo "$RECIPE" >"$dir.build/.ready"
	safe_rm "$dir"
	mv "$dir.build" "$dir"
	echo "$dir"
}

upgrade() {	# major
	local major=$1 base src dir
	case "$major" in 17 | 18) ;; *) die "pg_upgrade targets: 17 or 18" ;; esac
	dir=$CACHE/chroot/pg$major-from15
	ready "$dir" && { echo "$dir"; return 0; }
	[ "$(id -u)" = 0 ] || die "building needs root"
	src=$(ensure)
	base=$(bash "$here/chroot.sh" ensure "$major")
	exec 8>"$dir.lock"
	flock 8
	ready "$dir" && { echo "$dir"; return 0; }
	safe_rm "$dir" "$dir.tmp"
	cp -a "$base" "$dir.tmp"
	mkdir -p "$dir.tmp/opt"
	cp -a "$src$PREFIX" "$dir.tmp/opt/"
	echo "$RECIPE" >"$dir.tmp/.ready"
	mv "$dir.tmp" "$dir"
	echo "$dir"
}

case "${1:-}" in
ensure) ensure ;;
upgrade) upgrade "${2:?MAJOR}" ;;
*)
	sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
	;;
esac
