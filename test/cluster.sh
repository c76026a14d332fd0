# test/cluster.sh — a throwaway PostgreSQL cluster for tests, the demo and the
# benchmarks.  Source it, then:
#
#   cluster_start [postgresql.conf lines...]   initdb in a fresh temp dir, start
#                                              on a private unix socket, export
#                                              PGHOST/PGPORT/PGUSER/PGDATABASE
#   cluster_stop                               stop it and remove the directory
#
# The caller installs `trap cluster_stop EXIT` so the cluster goes away even
# when a test fails.  initdb refuses root, so as root the server runs as the
# `postgres` system user; clients may run as anyone (trust auth, own socket).
# as_pg runs a command as that user from /, whatever the caller's directory:
# the checkout may be one only root can enter, and PostgreSQL's programs fail
# ("could not change directory to ...") in a directory they cannot enter.
# Its arguments must be absolute paths.

# (empty until pg_config exists: ensure_packages and cluster_start set it)
PG_BINDIR=${PG_BINDIR:-$(${PG_CONFIG:-pg_config} --bindir 2>/dev/null)}
CLUSTER_DIR=""

as_pg() {
	if [ "$(id -u)" = 0 ]; then
		(cd / && runuser -u postgres -- "$@")
	else
		"$@"
	fi
}

# tcp_port: a TCP port for a test's own listener: below the kernel's
# ephemeral range (so no outgoing connection of another process can hold
# it) and with nothing listening on it on 127.0.0.1 now
tcp_port() {
	local lo=32768 p _
	read -r lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null
	[ "$lo" -gt 12000 ] 2>/dev/null || lo=32768
	for _ in $(seq 50); do
		p=$((10000 + RANDOM % (lo - 10000 - 4)))
		(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
	done
	echo "$p"
}

cluster_start() {
	[ -n "$PG_BINDIR" ] || PG_BINDIR=$(${PG_CONFIG:-pg_config} --bindir)
	CLUSTER_DIR=$(mktemp -d /tmp/idempotency-pg.XXXXXX)
	chmod 755 "$CLUSTER_DIR"
	[ "$(id -u)" = 0 ] && chown postgres: "$CLUSTER_DIR"
	as_pg "$PG_BINDIR/initdb" -D "$CLUSTER_DIR/data" -U postgres -A trust \
		--no-sync -E UTF8 --locale=C.UTF-8 >"$CLUSTER_DIR/initdb.log" 2>&1 || {
		cat "$CLUSTER_DIR/initdb.log" >&2
		return 1
	}
	PGPORT=${CLUSTER_PORT:-$(tcp_port)}
	{
		echo "port = $PGPORT"
		echo "listen_addresses = ''"
		echo "unix_socket_directories = '$CLUSTER_DIR'"
		echo "max_connections = 60"
		echo "max_prepared_transactions = 10"
		echo "log_line_prefix = '%m [%p] %q%a '"
		for line in "$@"; do echo "$line"; done
	} >>"$CLUSTER_DIR/data/postgresql.conf"
	as_pg "$PG_BINDIR/pg_ctl" -D "$CLUSTER_DIR/data" -l "$CLUSTER_DIR/server.log" \
		-w -t 60 start >/dev/null || {
		cat "$CLUSTER_DIR/server.log" >&2
		return 1
	}
	export PGHOST=$CLUSTER_DIR PGPORT PGUSER=postgres PGDATABASE=postgres
}

cluster_stop() {
	[ -n "$CLUSTER_DIR" ] || return 0
	if [ -f "$CLUSTER_DIR/data/postmaster.pid" ]; then
		as_pg "$PG_BINDIR/pg_ctl" -D "$CLUSTER_DIR/data" -m immediate -w stop >/dev/null 2>&1
	fi
	rm -rf "$CLUSTER_DIR"
	CLUSTER_DIR=""
}

# pg_major: the PostgreSQL major to install and test: $PG_MAJOR if set, else
# the one pg_config reports, else the one this Debian release ships
# (bookworm 15, trixie 17, forky/sid 18), else 15.
pg_major() {
	local v
	if [ -n "${PG_MAJOR:-}" ]; then
		echo "$PG_MAJOR"
		return
	fi
	v=$(${PG_CONFIG:-pg_config} --version 2>/dev/null | sed -nE 's/^PostgreSQL ([0-9]+).*/\1/p')
	if [ -z "$v" ] && [ -r /etc/os-release ]; then
		case "$(. /etc/os-release && echo "${VERSION_CODENAME:-}")" in
		bookworm) v=15 ;;
		trixie) v=17 ;;
		forky | sid) v=18 ;;
		esac
	fi
	echo "${v:-15}"
}

# indent_package MAJOR: the package with pg_bsd_indent (the indent suite):
# Debian 12's pg-bsd-indent for 15; from 16 on, postgresql-server-dev-N
# ships it in the server's bindir
indent_package() {
	[ "$1" -lt 16 ] 2>/dev/null && echo pg-bsd-indent
	true
}

# ensure_packages: install the Debian packages the suites need when missing.
ensure_packages() {
	local pkgs=() p m
	m=$(pg_major)
	for p in postgresql-$m postgresql-server-dev-$m postgresql-$m-pgtap libipc-run-perl \
		libtap-parser-sourcehandler-pgtap-perl make gcc $(indent_package "$m"); do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || pkgs+=("$p")
	done
	[ ${#pkgs[@]} -eq 0 ] && return 0
	if [ "$(id -u)" != 0 ]; then
		echo "missing Debian packages: ${pkgs[*]} (run as root to install them)" >&2
		return 1
	fi
	echo "installing ${pkgs[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >/dev/null && apt-get install -y -qq "${pkgs[@]}" >/dev/null || return 1
	[ -n "$PG_BINDIR" ] || PG_BINDIR=$(${PG_CONFIG:-pg_config} --bindir)
}

# bench_start [postgresql.conf lines...]: for the benchmarks: install what is
# missing, build and install the extension, make a work directory $WORK and
# start a cluster; the cluster and $WORK go away when the script exits.
bench_start() {
	ensure_packages || exit 2
	make -s >/dev/null && make -s install >/dev/null || { echo "build failed" >&2; exit 2; }
	WORK=$(mktemp -d /tmp/idempotency-bench.XXXXXX)
	chmod 777 "$WORK"
	trap 'cluster_stop; rm -rf "$WORK"' EXIT
	cluster_start "$@" >/dev/null || exit 2
}
