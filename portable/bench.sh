#!/usr/bin/env bash
# portable/bench.sh — a first side-by-side sketch: pgbench tps of a guarded
# request (BEGIN; begin(); complete(); COMMIT with a new key) and of a
# replay (begin() of a finished key, autocommit), C edition against the
# portable edition, one run of SECONDS seconds per point.
#
#   C_PG_CONFIG=... PORTABLE_PG_CONFIG=... bash portable/bench.sh
#
# C_PG_CONFIG: a PostgreSQL with the C library installed (make install into
# a private prefix); PORTABLE_PG_CONFIG: one without it.  Each edition gets
# its own throwaway cluster (test/cluster.sh), one after the other.  A
# sketch, not the benchmark the editions are held to: one machine, shared,
# noisy; no warm-up beyond a 2-second run; synchronous_commit off.
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
SECONDS_PER_POINT=${SECONDS_PER_POINT:-10}
CLIENTS=${CLIENTS:-1 4}
version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$top/idempotency.control")
work=$(mktemp -d /tmp/portable-bench.XXXXXX)
chmod 755 "$work"
cat >"$work/guarded.sql" <<'SQL'
\set k random(1, 9000000000000000)
BEGIN;
SELECT outcome FROM idempotency.begin('g-' || :k, '{"amount": 10}');
SELECT idempotency.complete('g-' || :k, '{"ok": true}');
COMMIT;
SQL
cat >"$work/replay.sql" <<'SQL'
SELECT outcome FROM idempotency.begin('replayed', '{"amount": 10}');
SQL

. "$top/test/cluster.sh"
trap 'cluster_stop; rm -rf "$work"' EXIT

run_edition() {	# name pg_config install-command...
	local name=$1 cfg=$2
	shift 2
	PG_BINDIR=$("$cfg" --bindir)
	cluster_start "$@" >/dev/null || exit 1
	case $name in
	C) psql -X -q -c 'CREATE EXTENSION idempotency' || exit 1 ;;
	portable)
		perl "$here/build.pl" "$top/idempotency--$version.sql" "$here/src" >"$work/portable.sql" 2>/dev/null &&
			psql -X -q -v ON_ERROR_STOP=1 -1 -f "$work/portable.sql" >/dev/null || exit 1 ;;
	esac
	psql -X -q -c 'BEGIN' -c "SELECT outcome FROM idempotency.begin('replayed', '{\"amount\": 10}')" \
		-c "SELECT idempotency.complete('replayed', '{\"ok\": true}')" -c 'COMMIT' >/dev/null || exit 1
	"$PG_BINDIR/pgbench" -n -T 2 -f "$work/guarded.sql" >/dev/null 2>&1
	for script in guarded replay; do
		for c in $CLIENTS; do
			tps=$("$PG_BINDIR/pgbench" -n -T "$SECONDS_PER_POINT" -c "$c" -j "$c" -f "$work/$script.sql" 2>&1 |
				sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
			echo "$name $script clients=$c tps=$tps"
		done
	done
	cluster_stop
}

# synchronous_commit off: the CPU of the call, not the disk's flush
run_edition C "${C_PG_CONFIG:?C_PG_CONFIG: a pg_config with the C library}" \
	"shared_preload_libraries = 'idempotency'" "synchronous_commit = off"
run_edition portable "${PORTABLE_PG_CONFIG:?PORTABLE_PG_CONFIG: a pg_config without it}" \
	"synchronous_commit = off"
