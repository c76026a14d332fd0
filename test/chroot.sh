#!/usr/bin/env bash
# test/chroot.sh — Debian chroots with another PostgreSQL major, for the
# version matrix (and anything else that must not touch the host's server).
#
#   test/chroot.sh ensure MAJOR       cached chroot with PostgreSQL MAJOR and its
#                                     server headers, pgTAP, the TAP modules, a
#                                     compiler and the driver/client suites'
#                                     packages; built once (debootstrap + apt),
#                                     then reused: prints its directory
#   test/chroot.sh fresh MAJOR DIR    a new chroot in DIR, nothing installed but
#                                     debootstrap's minbase (downloaded .deb files
#                                     come from the cache); for "does a fresh
#                                     machine have everything it needs"
#   test/chroot.sh run DIR CMD...     run CMD as root inside chroot DIR with /proc,
#                                     a tmpfs /dev/shm, /dev/pts, the host's TLS
#                                     roots and name resolution; unmounted after;
#                                     in a chroot made by fresh, /var/cache/
#                                     idempotency (the tests' builds) is
#                                     $IDEM_CACHE/builds/SUITE, kept
#   test/chroot.sh scratch MAJOR SRC CMD...
#                                     run CMD in a throwaway copy-on-write layer
#                                     (overlayfs) over the cached chroot of MAJOR,
#                                     from a copy of the checkout SRC in /root/src
#                                     (mode 700, without .git and build products);
#                                     nothing it installs or writes reaches the
#                                     cache, and runs in parallel do not collide;
#                                     except /var/cache/idempotency there, the
#                                     chroot's own cache of builds (Citus:
#                                     test/citus/build.sh), bind-mounted from
#                                     the cached chroot and kept, like the host's
#   test/chroot.sh copy SRC DEST      copy a checkout as scratch does (for fresh)
#   test/chroot.sh remove DIR         remove a chroot made by fresh, refusing while
#                                     anything is mounted below it
#   test/chroot.sh suite MAJOR        the Debian suite that ships MAJOR
#   test/chroot.sh mirror             the Debian mirror it downloads from:
#                                     $IDEM_MIRROR, else the first Debian archive
#                                     of this machine's apt sources, else
#                                     deb.debian.org (test/mirror.sh)
#
# MAJOR: 15 (bookworm), 17 (trixie), 18 (sid).  The cache lives outside the
# checkout, in $IDEM_CACHE (default /var/cache/idempotency): chroots in
# chroot/pgMAJOR, downloaded packages in apt/SUITE (shared by every chroot of
# that suite, so a fresh chroot downloads nothing twice; see mount_all).  A chroot whose
# build was interrupted has no .ready file and is built again.
set -eu -o pipefail

CACHE=${IDEM_CACHE:-/var/cache/idempotency}
# the Debian mirror: $IDEM_MIRROR, else the one this machine's apt uses,
# else deb.debian.org (test/mirror.sh)
. "$(dirname "${BASH_SOURCE[0]}")/mirror.sh"
MIRROR=$(idem_mirror)

die() { echo "test/chroot.sh: $*" >&2; exit 2; }

suite_of() {
	case "$1" in
	15) echo bookworm ;;
	17) echo trixie ;;
	18) echo sid ;;
	*) die "no Debian suite known for PostgreSQL $1 (15, 17 or 18)" ;;
	esac
}

# debootstrap on the host, installed by the first of the runs beside each
# other (CI's two chains) that needs it: apt-get fails at once on the lock
# another apt-get holds, so they take turns on a lock of our own
need_host_tools() {
	command -v debootstrap >/dev/null && return 0
	[ "$(id -u)" = 0 ] || die "debootstrap is missing (run as root to install it)"
	(
		flock 9
		command -v debootstrap >/dev/null && exit 0
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
			{ apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
	) 9>/var/lock/idempotency-host-apt.lock
}

# mount what a chroot needs to run servers and package tools; umount_all
# undoes it.  Downloaded packages: a chroot of our own (ensure, fresh) gets
# hard links to the cached .deb files of its suite before, and the cache
# gets the new ones after (seed_debs, harvest_debs): sharing the archive
# directory itself would make two apt-get runs of one suite fail on its lock.
# A scratch layer, which installs nothing as a rule, mounts it (shared=1).
MOUNTED=()
mount_all() {	# dir suite [shared]
	local dir=$1 suite=$2 shared=${3:-0}
	mkdir -p "$dir/proc" "$dir/dev/shm" "$dir/dev/pts" "$dir/usr/local/share/ca-host" \
		"$dir/var/cache/apt/archives" "$CACHE/apt/$suite"
	mount -t proc proc "$dir/proc" && MOUNTED+=("$dir/proc")
	mount -t tmpfs -o size=2g,mode=1777 shm "$dir/dev/shm" && MOUNTED+=("$dir/dev/shm")
	mount -t devpts -o newinstance,ptmxmode=0666 devpts "$dir/dev/pts" && MOUNTED+=("$dir/dev/pts")
	# the host's TLS roots for npm, as a copy: a bind mount of /etc/ssl/certs
	# let the chroot's ssl-cert and ca-certificates rewrite the host's files
	cp /etc/ssl/certs/ca-certificates.crt "$dir/usr/local/share/ca-host/" 2>/dev/null || true
	# and as the chroot's own bundle when it has none (chroots made while
	# that bind mount hid their /etc/ssl/certs have an empty one): Python's
	# ssl (pip, httpx) reads it
	if [ ! -s "$dir/etc/ssl/certs/ca-certificates.crt" ]; then
		mkdir -p "$dir/etc/ssl/certs"
		cp /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/" 2>/dev/null || true
	fi
	if [ "$shared" = 1 ]; then
		mount --bind "$CACHE/apt/$suite" "$dir/var/cache/apt/archives" &&
			MOUNTED+=("$dir/var/cache/apt/archives")
	else
		seed_debs "$dir" "$suite"
	fi
	cp /etc/resolv.conf /etc/hosts "$dir/etc/" 2>/dev/null || true
}
seed_debs() {	# dir suite
	find "$CACHE/apt/$2" -maxdepth 1 -name '*.deb' \
		-exec ln -f -t "$1/var/cache/apt/archives/" {} + 2>/dev/null ||
		find "$CACHE/apt/$2" -maxdepth 1 -name '*.deb' \
			-exec cp -n -t "$1/var/cache/apt/archives/" {} + 2>/dev/null || true
}
harvest_debs() {	# dir suite
	local f
	for f in "$1"/var/cache/apt/archives/*.deb; do
		[ -f "$f" ] && [ ! -e "$CACHE/apt/$2/${f##*/}" ] || continue
		ln "$f" "$CACHE/apt/$2/" 2>/dev/null || cp "$f" "$CACHE/apt/$2/" || true
	done
}
umount_all() {
	local i
	for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do
		umount -l "${MOUNTED[$i]}" 2>/dev/null || true
	done
	MOUNTED=()
}

in_chroot() {	# dir cmd...
	local dir=$1
	shift
	env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		HOME=/root LANG=C.UTF-8 TERM=dumb DEBIAN_FRONTEND=noninteractive CI="${CI:-}" \
		NODE_EXTRA_CA_CERTS=/usr/local/share/ca-host/ca-certificates.crt \
		chroot "$dir" "$@"
}

bootstrap() {	# suite dir
	local suite=$1 dir=$2
	need_host_tools || die "could not install debootstrap"
	mkdir -p "$CACHE/debootstrap/$suite"
	debootstrap --variant=minbase --cache-dir="$CACHE/debootstrap/$suite" \
		"$suite" "$dir" "$MIRROR" >"$dir.debootstrap.log" 2>&1 ||
		{ tail -n 20 "$dir.debootstrap.log" >&2; die "debootstrap $suite failed"; }
	# sid's Release file may be past its Valid-Until; keep downloaded .debs
	cat >"$dir/etc/apt/apt.conf.d/99idempotency" <<-'EOF'
		Acquire::Check-Valid-Until "false";
		APT::Keep-Downloaded-Packages "true";
		APT::Install-Recommends "false";
	EOF
	rm -f "$dir.debootstrap.log"
	echo "$suite" >"$dir/.suite"
}

# what a cached chroot has: the server, its headers, pgTAP, the TAP modules and
# a compiler; and what the driver and client suites would install anyway
# (test/drivers/run, test/clients/run), so that a run in a throwaway layer
# does not unpack a JDK and node each time; gdb for the Citus suite's crash
# between PREPARE and COMMIT PREPARED (test/citus/run); pg-bsd-indent for 15
packages_of() {	# major
	local m=$1 indent=
	# pg_bsd_indent (the indent suite): postgresql-server-dev-N ships it
	# from 16 on; Debian 12 has it as a package of its own
	[ "$m" -lt 16 ] && indent=" pg-bsd-indent"
	echo "postgresql-$m postgresql-server-dev-$m postgresql-$m-pgtap postgresql-contrib-$m" \
		"libipc-run-perl libtap-parser-sourcehandler-pgtap-perl make gcc libc6-dev ca-certificates" \
		"pgbouncer python3-psycopg python3-psycopg-pool python3-fastapi python3-uvicorn" \
		"python3-httpx python3-flask libpostgresql-jdbc-java default-jdk-headless nodejs npm" \
		"gdb$indent"
}

ensure() {	# major
	local major=$1 suite dir want
	suite=$(suite_of "$major")
	dir=$CACHE/chroot/pg$major
	want=$(packages_of "$major")
	# .ready holds the package list it was built with; a longer list is
	# installed into the existing chroot, without a new debootstrap
	if [ -f "$dir/.ready" ] && [ "$(cat "$dir/.ready")" = "$want" ]; then
		echo "$dir"
		return 0
	fi
	[ "$(id -u)" = 0 ] || die "building a chroot needs root"
	mkdir -p "$CACHE/chroot"
	exec 9>"$dir.lock"
	flock 9
	if [ -f "$dir/.ready" ] && [ "$(cat "$dir/.ready")" = "$want" ]; then
		echo "$dir"
		return 0
	fi
	if [ ! -f "$dir/.ready" ]; then
		rm -rf "$dir"
		bootstrap "$suite" "$dir" >&2
	fi
	trap umount_all EXIT
	mount_all "$dir" "$suite"
	# shellcheck disable=SC2086
	in_chroot "$dir" sh -c "apt-get update -qq && apt-get install -y -qq $want" \
		>"$dir.install.log" 2>&1 || {
		tail -n 20 "$dir.install.log" >&2
		umount_all
		die "installing PostgreSQL $major into $dir failed"
	}
	rm -f "$dir.install.log"
	harvest_debs "$dir" "$suite"
	# Debian's postinst makes a cluster and may start it; the tests make their own
	in_chroot "$dir" sh -c "pg_dropcluster --stop $major main 2>/dev/null; true" >&2
	umount_all
	trap - EXIT
	echo "$want" >"$dir/.ready"
	exec 9>&-
	echo "$dir"
}

# remove a directory once nothing is mounted below it (a bind mount of the
# host's /etc/ssl/certs is on the same file system: rm would go into it)
safe_rm() {	# dir
	if grep -q " $1/" /proc/mounts; then
		echo "test/chroot.sh: left $1: something is still mounted below it" >&2
		return 1
	fi
	rm -rf "$1"
}

# copy a checkout without .git and build products (all is built anew)
copy_src() {	# src dest
	mkdir -p "$2"
	chmod 700 "$2"
	tar -C "$1" --exclude=./.git --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
		--exclude=./results --exclude=./tmp_check --exclude=./test/output \
		--exclude=node_modules -cf - . | tar -C "$2" -xf -
	# the third-party sources the suites build from (Citus), beside it as in
	# a clone: ../shared/vendor
	if [ -d "$1/../shared/vendor" ]; then
		mkdir -p "$2/../shared"
		cp -R "$1/../shared/vendor" "$2/../shared/"
	fi
}

scratch() {	# major src cmd...
	local major=$1 src=$2 base suite rc tmp
	shift 2
	[ -d "$src" ] || die "$src is not a directory"
	base=$(ensure "$major")
	suite=$(suite_of "$major")
	SCRATCH=$(mktemp -d /tmp/idempotency-chroot.XXXXXX)
	tmp=$SCRATCH
	mkdir "$tmp/upper" "$tmp/work" "$tmp/root"
	trap 'umount_all; umount -l "$SCRATCH/root" 2>/dev/null; safe_rm "$SCRATCH"' EXIT
	mount -t overlay overlay \
		-o "lowerdir=$base,upperdir=$tmp/upper,workdir=$tmp/work" "$tmp/root" ||
		die "cannot mount an overlay over $base"
	copy_src "$src" "$tmp/root/root/src"
	mount_all "$tmp/root" "$suite" 1
	# builds the tests cache outside the checkout (test/citus/build.sh: Citus
	# into a private prefix) go to the cached chroot's own directory, past
	# the overlay: a warm machine does not build them again, and they go
	# when the chroot is made anew (a new server).  Runs in parallel share
	# it; build.sh takes a lock there.
	mkdir -p "$base/var/cache/idempotency" "$tmp/root/var/cache/idempotency"
	mount --bind "$base/var/cache/idempotency" "$tmp/root/var/cache/idempotency" &&
		MOUNTED+=("$tmp/root/var/cache/idempotency")
	set +e
	in_chroot "$tmp/root" sh -c 'cd /root/src && exec "$@"' sh "$@"
	rc=$?
	set -e
	return $rc
}

cmd=${1:-}
case "$cmd" in
scratch)
	scratch "${2:?MAJOR}" "${3:?SRC}" "${@:4}"
	;;
copy)
	copy_src "${2:?SRC}" "${3:?DEST}"
	;;
remove)
	dir=${2:?DIR}
	[ -f "$dir/.suite" ] || die "$dir is not a chroot made here"
	safe_rm "$dir"
	;;
suite)
	suite_of "${2:?MAJOR}"
	;;
mirror)
	echo "$MIRROR"
	;;
ensure)
	ensure "${2:?MAJOR}"
	;;
fresh)
	major=${2:?MAJOR}
	dir=${3:?DIR}
	[ -e "$dir" ] && die "$dir exists"
	bootstrap "$(suite_of "$major")" "$dir"
	touch "$dir/.fresh"
	echo "$dir"
	;;
run)
	dir=${2:?DIR}
	shift 2
	[ -d "$dir/etc" ] || die "$dir is not a chroot"
	suite=$(cat "$dir/.suite" 2>/dev/null || echo unknown)
	trap umount_all EXIT
	mount_all "$dir" "$suite"
	# builds the tests cache (Citus, the portable edition's server copy and
	# pg_tle, in /var/cache/idempotency) are kept for the next fresh chroot
	# of the suite, in builds/SUITE: a warm machine does not build them
	# again; each is keyed by the server's version and rebuilt when it changes
	if [ -f "$dir/.fresh" ]; then
		mkdir -p "$CACHE/builds/$suite" "$dir/var/cache/idempotency"
		mount --bind "$CACHE/builds/$suite" "$dir/var/cache/idempotency" &&
			MOUNTED+=("$dir/var/cache/idempotency")
	fi
	set +e
	in_chroot "$dir" "$@"
	rc=$?
	umount_all
	harvest_debs "$dir" "$suite"
	exit $rc
	;;
*)
	sed -n '2,44p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
	;;
esac
