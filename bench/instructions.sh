#!/usr/bin/env bash
# bench/instructions.sh — instructions per request, counted by callgrind in a
# single-user backend: deterministic, so hot-path changes can be judged on a
# noisy machine where tps moves by ±10%.
#
#   bash bench/instructions.sh [requests=2000]
#   BENCH_PRELOAD=1 bash bench/instructions.sh ...   the same with the library
#                                 in shared_preload_libraries (idempotency.stats
#                                 counting in shared memory)
#
# Runs N requests of each kind (bare insert, guarded new key, floor: bare plus
# two SELECT 1, replay, plain SELECT) in `postgres --single` under valgrind
# --tool=callgrind, and prints the instructions per request of each, and
# guarded minus bare, guarded minus floor (the guard's own work, beyond the
# cost of any two statements), replay minus SELECT: what the guard itself
# costs the server, without the network.
# One round trip (autocommit, one statement each): bare1 (the insert alone),
# once (idempotency.once() around it), keyrow1 (the insert plus a plain insert
# of a key row in one writable CTE), plpgsql1 (the seed pattern as one PL/pgSQL
# call) and replay1 (once() of a completed key, against select).
set -u
cd "$(dirname "$0")/.." || exit 2
. test/cluster.sh
N=${1:-2000}
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
if [ -n "${BENCH_PRELOAD:-}" ]; then
	bench_start "shared_preload_libraries = 'idempotency'" "idempotency.purge_interval = 0"
else
	bench_start
fi
psql -qX -v ON_ERROR_STOP=1 -f bench/scripts/setup.sql >/dev/null || exit 2
# BENCH_EXTRA_SQL: run after the setup, to measure a variant
[ -n "${BENCH_EXTRA_SQL:-}" ] && { psql -qX -v ON_ERROR_STOP=1 -c "$BENCH_EXTRA_SQL" >/dev/null || exit 2; }
DATA=$CLUSTER_DIR/data
as_pg "$PG_BINDIR/pg_ctl" -D "$DATA" -w stop >/dev/null

# the statements are prepared once, as pgbench -M prepared does
PREPARES="PREPARE ins(text) AS INSERT INTO payment (key, amount) VALUES (\$1, 10);
PREPARE beg(text) AS SELECT outcome FROM idempotency.begin(\$1);
PREPARE fin(text) AS SELECT idempotency.complete(\$1, '{\"ok\": true}');
PREPARE sel(text) AS SELECT status, response FROM idempotency.idempotency_key WHERE owner = 'postgres'::regrole AND scope = '' AND key = \$1;
PREPARE rep(text) AS SELECT outcome, response FROM idempotency.begin(\$1);
PREPARE one AS SELECT 1;
PREPARE onc(text) AS SELECT outcome, response FROM idempotency.once(\$1, NULL, 'INSERT INTO payment (key, amount) VALUES (\$1, \$2) RETURNING id', \$1, 10);
PREPARE ins1(text) AS INSERT INTO payment (key, amount) VALUES (\$1, 10) RETURNING id;
PREPARE kr1(text) AS WITH p AS (INSERT INTO payment (key, amount) VALUES (\$1, 10) RETURNING id) INSERT INTO keyrow (owner, scope, key, status, response, expires_at) SELECT current_user::regrole, '', \$1, 'completed', jsonb_build_object('id', p.id), now() + interval '1 day' FROM p;
PREPARE pl1(text) AS SELECT pl_once(\$1, NULL, 10);"

gen() {	# kind -> the prepares, then N requests (one transaction each)
	echo "$PREPARES"
	[ "$1" = empty ] && return
	for i in $(seq 1 "$N"); do
		case $1 in
			bare) echo "BEGIN; EXECUTE ins('b$i'); COMMIT;" ;;
			guarded) echo "BEGIN; EXECUTE beg('g$i'); EXECUTE ins('g$i'); EXECUTE fin('g$i'); COMMIT;" ;;
			floor) echo "BEGIN; EXECUTE one; EXECUTE ins('f$i'); EXECUTE one; COMMIT;" ;;
			select) echo "EXECUTE sel('replay-$((i % 100000 + 1))');" ;;
			replay) echo "EXECUTE rep('replay-$((i % 100000 + 1))');" ;;
			bare1) echo "EXECUTE ins1('b1-$i');" ;;
			once) echo "EXECUTE onc('o-$i');" ;;
			keyrow1) echo "EXECUTE kr1('r1-$i');" ;;
			plpgsql1) echo "EXECUTE pl1('l1-$i');" ;;
			replay1) echo "EXECUTE onc('replay-$((i % 100000 + 1))');" ;;
		esac
	done
}
count() {	# kind -> instructions of the whole session
	local f="$WORK/$1.sql" out="$WORK/cg.$1"
	gen "$1" >"$f"
	chmod 644 "$f"
	as_pg valgrind --tool=callgrind --callgrind-out-file="$out" \
		"$PG_BINDIR/postgres" --single -D "$DATA" postgres <"$f" >/dev/null 2>&1
	[ -n "${KEEP:-}" ] && cp "$out" "$KEEP.$1"
	awk '/^summary:|^totals:/ { print $2; exit }' "$out"
}
empty=$(count empty)
KINDS="bare guarded floor select replay bare1 once keyrow1 plpgsql1 replay1"
for k in $KINDS; do
	eval "ins_$k=\$(( ( \$(count $k) - empty ) / N ))"
done
printf '%-10s %14s\n' request "instructions"
for k in $KINDS; do eval "printf '%-10s %14d\n' $k \$ins_$k"; done
echo "guarded - bare:   $((ins_guarded - ins_bare)) instructions per request"
echo "guarded - floor:  $((ins_guarded - ins_floor)) instructions per request (beyond two statements that do nothing)"
echo "replay - select:  $((ins_replay - ins_select)) instructions per request"
echo "once - bare1:     $((ins_once - ins_bare1)) instructions per request (one statement each)"
echo "once - keyrow1:   $((ins_once - ins_keyrow1)) instructions per request (beyond storing a key row)"
echo "plpgsql1 - once:  $((ins_plpgsql1 - ins_once)) instructions per request"
echo "replay1 - select: $((ins_replay1 - ins_select)) instructions per request"
echo "($N requests each, postgres --single under callgrind, $(psql --version | awk '{ print $3 }')${BENCH_PRELOAD:+, library preloaded})"
