#!/usr/bin/env bash
# portable/relay_instructions.sh — instructions per relay call, the portable
# edition's claim() + ack() of a batch against pgmq 1.5.1's read() +
# delete(), counted by callgrind in a single-user backend (as
# portable/instructions.sh counts the key guard): deterministic, so the two
# can be compared on a machine too loaded for tps.
#
#   PORTABLE_PG_CONFIG=... bash portable/relay_instructions.sh [calls=200]
#
# PORTABLE_PG_CONFIG: a PostgreSQL without the C library (portable/server.sh);
# pgmq's SQL files are installed into it from PGMQ_TAR
# (../shared/vendor/pgmq-1.5.1.tar.gz) when missing.  PORTABLE_SRC: the
# portable bodies to build from (portable/src).  RELAY_BATCHES ("1 10 100").
# One database, both queues filled with 60,000 unkeyed messages of the
# bench's shape; each call is bench/portable.sh's relay statement:
#   ours  SELECT count(*) FROM (SELECT idempotency.ack(c.claim, array_agg(c.id))
#           FROM idempotency.claim('relay', B) c GROUP BY c.claim) a
#   pgmq  SELECT pgmq.delete('relay', ARRAY(SELECT msg_id FROM pgmq.read('relay', 30, B)))
# (calls / 4 at batch 100).  Prints instructions per call and pgmq ÷ ours.
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
N=${1:-200}
BATCHES=${RELAY_BATCHES:-1 10 100}
SRC=${PORTABLE_SRC:-$here/src}
PGMQ_TAR=${PGMQ_TAR:-$top/../shared/vendor/pgmq-1.5.1.tar.gz}
[ -f "$PGMQ_TAR" ] || PGMQ_TAR=/work/shared/vendor/pgmq-1.5.1.tar.gz
version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$top/idempotency.control")
PG_CONFIG=${PORTABLE_PG_CONFIG:?a pg_config without the C library}
export PG_CONFIG
PG_BINDIR=$("$PG_CONFIG" --bindir)
. "$top/test/cluster.sh"
WORK=$(mktemp -d /tmp/portable-relay.XXXXXX)
chmod 777 "$WORK"
trap 'cluster_stop; rm -rf "$WORK"' EXIT
if [ ! -f "$("$PG_CONFIG" --sharedir)/extension/pgmq--1.5.1.sql" ]; then
	tar xzf "$PGMQ_TAR" -C "$WORK" && make -s -C "$WORK"/pgmq-1.5.1 >/dev/null 2>&1 &&
		make -s -C "$WORK"/pgmq-1.5.1 install >/dev/null 2>&1 ||
		{ echo "pgmq 1.5.1 did not install from $PGMQ_TAR" >&2; exit 2; }
fi
cluster_start >/dev/null || exit 2
perl "$here/build.pl" "$top/idempotency--$version.sql" "$SRC" >"$WORK/portable.sql" 2>/dev/null &&
	psql -qX -v ON_ERROR_STOP=1 -1 -f "$WORK/portable.sql" >/dev/null || exit 2
psql -qX -v ON_ERROR_STOP=1 >/dev/null <<'SQL' || exit 2
CREATE EXTENSION pgmq;
SELECT pgmq.create('relay');
SELECT idempotency.create_topic('relay');
SELECT count(idempotency.publish('relay', jsonb_build_object('n', i, 'pad', repeat('x', 100)))) FROM generate_series(1, 60000) i;
SELECT count(*) FROM pgmq.send_batch('relay', ARRAY(SELECT jsonb_build_object('n', i, 'pad', repeat('x', 100)) FROM generate_series(1, 60000) i));
VACUUM ANALYZE;
SQL
as_pg "$PG_BINDIR/pg_ctl" -D "$CLUSTER_DIR/data" -w stop >/dev/null
count() {	# name file -> instructions of the whole session
	chmod 644 "$2"
	as_pg valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.$1" \
		"$PG_BINDIR/postgres" --single -D "$CLUSTER_DIR/data" postgres <"$2" >"$WORK/out.$1" 2>&1
	if grep -q ERROR "$WORK/out.$1"; then
		grep -m1 ERROR "$WORK/out.$1" >&2
		exit 1
	fi
	awk '/^summary:|^totals:/ { print $2; exit }' "$WORK/cg.$1"
}
: >"$WORK/empty.sql"
empty=$(count empty "$WORK/empty.sql")
for b in $BATCHES; do
	n=$N
	[ "$b" -ge 100 ] && n=$((N / 4))
	: >"$WORK/ours.$b.sql"
	: >"$WORK/pgmq.$b.sql"
	for _ in $(seq 1 "$n"); do
		echo "SELECT count(*) FROM (SELECT idempotency.ack(c.claim, array_agg(c.id)) FROM idempotency.claim('relay', $b) c GROUP BY c.claim) a;" >>"$WORK/ours.$b.sql"
		echo "SELECT pgmq.delete('relay', ARRAY(SELECT msg_id FROM pgmq.read('relay', 30, $b)));" >>"$WORK/pgmq.$b.sql"
	done
	o=$(( ($(count "ours.$b" "$WORK/ours.$b.sql") - empty) / n ))
	q=$(( ($(count "pgmq.$b" "$WORK/pgmq.$b.sql") - empty) / n ))
	printf 'batch %3d: portable %9d, pgmq %9d instructions per call; pgmq / portable %s\n' \
		"$b" "$o" "$q" "$(awk -v q="$q" -v o="$o" 'BEGIN { printf "%.2f", q / o }')"
done
