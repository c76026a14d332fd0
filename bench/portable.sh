#!/usr/bin/env bash
# bench/portable.sh — the portable edition (portable/, SQL and PL/pgSQL only)
# against the C edition, side by side on ONE throwaway cluster started once:
# database `c` has CREATE EXTENSION idempotency (the C library, not
# preloaded), database `p` the portable script installed by psql -f
# (portable/build.pl), the same business table and 100,000 finished keys in
# each.  `make bench` (bench/run) runs it after bench/once.sh; alone it
# rewrites the "Portable edition" section of bench/RESULTS.md.
#
# 1. Throughput, pgbench -M prepared, one autocommit statement per request
#    unless said otherwise, every key new unless said otherwise:
#      bare1      the business INSERT alone                          (db c)
#      plpgsql1   the seeds' hand-written pattern as one PL/pgSQL call: key
#                 row INSERT ... ON CONFLICT DO NOTHING, SELECT ... FOR
#                 UPDATE, check, the INSERT, UPDATE of the key row     (db c)
#      c_once     once(key, NULL, 'INSERT ... RETURNING id', args as text)
#      p_once     the same in the portable edition (its one calling form,
#                 VARIADIC args text[]; the C edition takes it too)
#      c_guarded  BEGIN; begin(); the INSERT; complete(); COMMIT (5 round trips)
#      p_guarded  the same, portable
#      c_replay1  once() of a finished key (the work does not run)
#      p_replay1  the same, portable
#      c_replay   begin() of a finished key
#      p_replay   the same, portable
#      p_rfloor   not in the default list: the least any PL/pgSQL replay does
#                 (one SECURITY DEFINER function, pinned search_path, the
#                 caller from the session user, one indexed SELECT of the
#                 key row, the row returned; no check of key, request or
#                 state: portable/instructions.sh's rfloor), not a product;
#                 its ratio to c_replay bounds the replay targets
#    Interleaved: every round runs every scenario once at every client
#    count, in one order on odd rounds and the reverse on even ones, so a
#    change of load on a shared machine hits all of them alike.  A ratio is
#    the median over rounds of the ratio within a round (range: lowest and
#    highest round); tps is the median round's.
# 2. Instructions per request (PBENCH_CALLGRIND=1, the default): the same
#    requests in `postgres --single` under callgrind, each database, with
#    the statements prepared once and PBENCH_WARM warm-up requests; the
#    count of a run of the warm-up alone is subtracted, so a figure is a
#    warm request's (a backend's first call, its caches and plans, is left
#    out).  Deterministic: the machine's load does not move it.
#    PBENCH_KEEP=DIR keeps the callgrind files (callgrind_annotate them).
#
# 3. The relay (PBENCH_RELAY=1, the default): claim + ack of a batch in one
#    statement (SELECT idempotency.ack(c.claim, array_agg(c.id)) FROM
#    idempotency.claim(topic, batch) c GROUP BY c.claim), C edition (db c)
#    and portable (db p), against pgmq 1.5.1 (an extension of SQL and
#    PL/pgSQL only, db q) read + delete of the same batch, batch 1, 10 and
#    100: messages delivered per second, each run from a queue freshly
#    filled (by publish() and pgmq.send_batch(), unkeyed messages with a
#    100-byte pad) and vacuumed, the three interleaved as above.  Without a
#    portable claim() (a build whose portable/src has no outbox yet) the
#    portable column says so and the rest runs.
#
# Environment: BENCH_SECONDS (5), BENCH_ROUNDS (3), BENCH_CLIENTS ("1 4 16"),
# PBENCH_SYNCHRONOUS_COMMIT (on), PBENCH_CALLGRIND (1), PBENCH_N (500
# requests per count), PBENCH_WARM (20), PBENCH_SCENARIOS (all),
# PBENCH_RELAY (1), PBENCH_RELAY_BATCHES ("1 10 100"), PBENCH_RELAY_CLIENTS
# ("1"), PBENCH_RELAY_ROUNDS (BENCH_ROUNDS), PBENCH_RELAY_MAX (400000
# messages per fill at most; a run that empties its queue is flagged),
# PBENCH_PORTABLE_SRC (the portable sources, portable/src),
# PBENCH_PGMQ_TAR (../shared/vendor/pgmq-1.5.1.tar.gz),
# PBENCH_KINDS (the callgrind kinds, all), PORTABLE_SECTION (write the section there instead of into
# bench/RESULTS.md), BENCH_NOTE (a line about the run, e.g. the load).
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
. test/cluster.sh

SECS=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CLIENTS=${BENCH_CLIENTS:-1 4 16}
SYNC=${PBENCH_SYNCHRONOUS_COMMIT:-on}
CALLGRIND=${PBENCH_CALLGRIND:-1}
N=${PBENCH_N:-500}
WARM=${PBENCH_WARM:-20}
SCENARIOS=${PBENCH_SCENARIOS:-bare1 plpgsql1 c_once p_once c_guarded p_guarded c_replay1 p_replay1 c_replay p_replay}
RELAY=${PBENCH_RELAY:-1}
RELAY_BATCHES=${PBENCH_RELAY_BATCHES:-1 10 100}
RELAY_CLIENTS=${PBENCH_RELAY_CLIENTS:-1}
RELAY_ROUNDS=${PBENCH_RELAY_ROUNDS:-$ROUNDS}
RELAY_MAX=${PBENCH_RELAY_MAX:-400000}
PSRC=${PBENCH_PORTABLE_SRC:-portable/src}
PGMQ_TAR=${PBENCH_PGMQ_TAR:-$ROOT/../shared/vendor/pgmq-1.5.1.tar.gz}
[ -f "$PGMQ_TAR" ] || PGMQ_TAR=/work/shared/vendor/pgmq-1.5.1.tar.gz
version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" idempotency.control)

[ "$CALLGRIND" = 1 ] && ! command -v valgrind >/dev/null &&
	{ apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
# pgmq into this server's prefix (SQL files only; never committed)
if [ "$RELAY" = 1 ] && [ ! -f "$(pg_config --sharedir)/extension/pgmq--1.5.1.sql" ]; then
	T=$(mktemp -d)
	tar xzf "$PGMQ_TAR" -C "$T" && make -s -C "$T"/pgmq-1.5.1 >/dev/null 2>&1 &&
		make -s -C "$T"/pgmq-1.5.1 install >/dev/null 2>&1 ||
		{ echo "pgmq 1.5.1 did not build from $PGMQ_TAR" >&2; exit 2; }
	rm -rf "$T"
fi
bench_start "max_connections = 100" "synchronous_commit = $SYNC"
started=$(date +%s)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- the two databases ---------------------------------------------------------
perl portable/build.pl "idempotency--$version.sql" "$PSRC" >"$WORK/portable.sql" 2>"$WORK/build.log" ||
	{ cat "$WORK/build.log"; exit 2; }
for db in c p; do
	psql -qX -v ON_ERROR_STOP=1 -c "CREATE DATABASE $db" >/dev/null || exit 2
done
psql -qX -v ON_ERROR_STOP=1 -d c -c 'CREATE EXTENSION idempotency' >/dev/null || exit 2
psql -qX -v ON_ERROR_STOP=1 -1 -d p -f "$WORK/portable.sql" >/dev/null || exit 2
for db in c p; do
	psql -qX -v ON_ERROR_STOP=1 -d "$db" -f bench/scripts/handwritten.sql -f bench/scripts/rfloor.sql >/dev/null || exit 2
	psql -qX -v ON_ERROR_STOP=1 -d "$db" >/dev/null <<'SQL' || exit 2
CREATE TABLE payment (id bigserial PRIMARY KEY, key text NOT NULL, amount int NOT NULL,
                      created_at timestamptz NOT NULL DEFAULT now());
-- finished keys to replay (the columns both editions' key table has)
INSERT INTO idempotency.idempotency_key (owner, scope, key, status, response, attempts,
                                         created_at, updated_at, expires_at)
SELECT 'postgres', '', 'replay-' || i, 'completed', '{"id": 1}', 1,
       now(), now(), now() + interval '7 days'
  FROM generate_series(1, 100000) i;
-- finished keys of the hand-written pattern (bench/scripts/handwritten.sql)
INSERT INTO pl_key (key, status, response)
SELECT 'replay-' || i, 'completed', '{"id": 1}' FROM generate_series(1, 100000) i;
VACUUM ANALYZE;
SQL
done

# ---- the scenarios ---------------------------------------------------------------
W=$WORK/scripts
mkdir -p "$W" && chmod 755 "$W"
ONCE_SQL="'INSERT INTO payment (key, amount) VALUES (\$1, \$2) RETURNING id'"
cat >"$W/bare1.sql" <<'S'
\set k random(1, 1000000000)
INSERT INTO payment (key, amount) VALUES ('b1-' || :client_id || '-' || :k, 10) RETURNING id;
S
cat >"$W/plpgsql1.sql" <<'S'
\set k random(1, 1000000000)
SELECT pl_once('l1-' || :client_id || '-' || :k, NULL, 10);
S
for e in c p; do
	cat >"$W/${e}_once.sql" <<S
\\set k random(1, 1000000000)
SELECT outcome, response FROM idempotency.once('o-' || :client_id || '-' || :k, NULL,
  $ONCE_SQL, 'o-' || :client_id || '-' || :k, '10'::text);
S
	cat >"$W/${e}_guarded.sql" <<'S'
\set k random(1, 1000000000)
BEGIN;
SELECT outcome FROM idempotency.begin('g-' || :client_id || '-' || :k);
INSERT INTO payment (key, amount) VALUES ('g-' || :client_id || '-' || :k, 10);
SELECT idempotency.complete('g-' || :client_id || '-' || :k, '{"ok": true}');
END;
S
	cat >"$W/${e}_replay1.sql" <<S
\\set k random(1, 100000)
SELECT outcome, response FROM idempotency.once('replay-' || :k, NULL,
  $ONCE_SQL, 'replay-' || :k, '10'::text);
S
	cat >"$W/${e}_replay.sql" <<'S'
\set k random(1, 100000)
SELECT outcome, response FROM idempotency.begin('replay-' || :k);
S
done
cat >"$W/p_rfloor.sql" <<'S'
\set k random(1, 100000)
SELECT outcome, response FROM rfloor_begin('replay-' || :k);
S
chmod 644 "$W"/*.sql
db_of() { case $1 in p_*) echo p ;; *) echo c ;; esac; }

# run SCENARIO CLIENTS ROUND -> "label clients tps round" in results
run() {
	local s=$1 c=$2 round=$3 j out tps
	j=$((c < 2 ? c : 2))
	out=$(cd "$WORK" && pgbench -n -M prepared -c "$c" -j "$j" -T "$SECS" -f "$W/$s.sql" "$(db_of "$s")" 2>&1)
	tps=$(echo "$out" | awk '/^tps/ { printf "%.1f", $3 }')
	[ -n "$tps" ] || { echo "pgbench failed for $s/$c:"; echo "$out" | tail -5; exit 1; }
	echo "$s $c $tps $round" >>"$WORK/results"
	printf '  %-10s %2d clients: %9s tps\n' "$s" "$c" "$tps"
}
# warm-up: each scenario once, briefly (plans, caches, the replay keys' pages)
[ "$ROUNDS" -gt 0 ] && for s in $SCENARIOS; do
	(cd "$WORK" && pgbench -n -M prepared -c 2 -j 2 -T 1 -f "$W/$s.sql" "$(db_of "$s")" >/dev/null 2>&1)
done
: >"$WORK/results"
reversed=$(echo $SCENARIOS | tr ' ' '\n' | tac | tr '\n' ' ')
for round in $(seq 1 "$ROUNDS"); do
	echo "round $round of $ROUNDS"
	order=$SCENARIOS
	[ $((round % 2)) = 0 ] && order=$reversed
	for c in $CLIENTS; do
		for s in $order; do run "$s" "$c" "$round"; done
	done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
rounds_secs=$(($(date +%s) - started))

# ---- instructions per request ------------------------------------------------------
# kinds: db, then the statement of one request (%s: a unique suffix)
declare -A KIND_DB KIND_REQ
kind() { KIND_DB[$1]=$2; KIND_REQ[$1]=$3; }
kind bare1 c "EXECUTE bare1('%s');"
kind plpgsql1 c "EXECUTE pl1('%s');"
kind select c "EXECUTE sel(%s);"
kind c_once c "EXECUTE once1('%s');"
kind p_once p "EXECUTE once1('%s');"
kind c_guarded c "BEGIN; EXECUTE beg('%s'); EXECUTE ins('%s'); EXECUTE fin('%s'); COMMIT;"
kind p_guarded p "BEGIN; EXECUTE beg('%s'); EXECUTE ins('%s'); EXECUTE fin('%s'); COMMIT;"
kind c_replay1 c "EXECUTE rep1(%s);"
kind p_replay1 p "EXECUTE rep1(%s);"
kind c_replay c "EXECUTE rep(%s);"
kind p_replay p "EXECUTE rep(%s);"
kind p_rfloor p "EXECUTE rfl(%s);"
KINDS=${PBENCH_KINDS:-bare1 plpgsql1 select c_once p_once c_guarded p_guarded c_replay1 p_replay1 c_replay p_replay}
PREPARES="PREPARE bare1(text) AS INSERT INTO payment (key, amount) VALUES (\$1, 10) RETURNING id;
PREPARE pl1(text) AS SELECT pl_once(\$1, NULL, 10);
PREPARE sel(int) AS SELECT status, response FROM idempotency.idempotency_key WHERE owner = 'postgres'::regrole AND scope = '' AND key = 'replay-' || \$1;
PREPARE once1(text) AS SELECT outcome, response FROM idempotency.once(\$1, NULL, $ONCE_SQL, \$1, '10'::text);
PREPARE beg(text) AS SELECT outcome FROM idempotency.begin(\$1);
PREPARE ins(text) AS INSERT INTO payment (key, amount) VALUES (\$1, 10);
PREPARE fin(text) AS SELECT idempotency.complete(\$1, '{\"ok\": true}');
PREPARE rep1(int) AS SELECT outcome, response FROM idempotency.once('replay-' || \$1, NULL, $ONCE_SQL, 'replay-' || \$1, '10'::text);
PREPARE rep(int) AS SELECT outcome, response FROM idempotency.begin('replay-' || \$1);
PREPARE rfl(int) AS SELECT outcome, response FROM rfloor_begin('replay-' || \$1);"
DATA=$CLUSTER_DIR/data
gen() {	# kind tag count -> the session's input: the statements, WARM + count requests
	local k=$1 tag=$2 n=$3 i a
	echo "$PREPARES"
	for i in $(seq 1 $((WARM + n))); do
		case $k in
			# the same WARM finished keys over and over: their pages in
			# shared buffers after the warm-up, as in a warm server
			*replay* | *rfloor | select) a=$(( i % WARM + 1 )) ;;
			*) a="$k-$tag-$i" ;;
		esac
		echo "${KIND_REQ[$k]//%s/$a}"
	done
}
count() {	# kind tag count -> instructions of the whole session
	local f="$WORK/cg-$1-$2.sql" out="$WORK/cg.$1.$2"
	gen "$1" "$2" "$3" >"$f"
	chmod 644 "$f"
	as_pg valgrind --tool=callgrind --callgrind-out-file="$out" \
		"$PG_BINDIR/postgres" --single -D "$DATA" "${KIND_DB[$1]}" <"$f" >"$WORK/cg-$1-$2.log" 2>&1
	grep -q ERROR "$WORK/cg-$1-$2.log" && { echo "errors in the callgrind run of $1:" >&2; grep ERROR "$WORK/cg-$1-$2.log" | head -3 >&2; }
	[ -n "${PBENCH_KEEP:-}" ] && cp "$out" "$PBENCH_KEEP/"
	awk '/^summary:|^totals:/ { print $2; exit }' "$out"
}
if [ "$CALLGRIND" = 1 ]; then
	echo "instructions per request (callgrind, $N requests each)"
	psql -qX -c CHECKPOINT >/dev/null
	as_pg "$PG_BINDIR/pg_ctl" -D "$DATA" -w stop >/dev/null
	: >"$WORK/instr"
	for k in $KINDS; do
		w=$(count "$k" w 0)
		m=$(count "$k" m "$N")
		echo "$k $(( (m - w) / N ))" >>"$WORK/instr"
		printf '  %-10s %9d instructions\n' "$k" "$(( (m - w) / N ))"
	done
	as_pg "$PG_BINDIR/pg_ctl" -D "$DATA" -l "$CLUSTER_DIR/server.log" -w start >/dev/null
fi

# ---- the relay ------------------------------------------------------------------
: >"$WORK/relay"
: >"$WORK/relay.dry"
p_relay=0
if [ "$RELAY" = 1 ]; then
	[ "$(psql -qXAt -d p -c "SELECT to_regprocedure('idempotency.claim(text, int4, interval)') IS NOT NULL")" = t ] && p_relay=1
	psql -qX -v ON_ERROR_STOP=1 -c "CREATE DATABASE q" >/dev/null &&
		psql -qX -v ON_ERROR_STOP=1 -d q -c "CREATE EXTENSION pgmq" -c "SELECT pgmq.create('relay')" >/dev/null || exit 2
	psql -qX -v ON_ERROR_STOP=1 -d c -c "SELECT idempotency.create_topic('relay')" >/dev/null || exit 2
	[ $p_relay = 1 ] && { psql -qX -v ON_ERROR_STOP=1 -d p -c "SELECT idempotency.create_topic('relay')" >/dev/null || exit 2; }
	echo 'SELECT count(*) FROM (SELECT idempotency.ack(c.claim, array_agg(c.id)) FROM idempotency.claim('"'relay'"', :batch) c GROUP BY c.claim) a;' >"$W/relay_ours.sql"
	echo "SELECT pgmq.delete('relay', ARRAY(SELECT msg_id FROM pgmq.read('relay', 30, :batch)));" >"$W/relay_pgmq.sql"
	chmod 644 "$W"/relay_*.sql
	systems="relay_c relay_pgmq"
	[ $p_relay = 1 ] && systems="relay_c relay_p relay_pgmq"
	rsystems=$(echo $systems | tr ' ' '\n' | tac | tr '\n' ' ')
	pending() {	# system -> messages waiting
		case $1 in
			relay_pgmq) psql -qXAt -d q -c "SELECT count(*) FROM pgmq.q_relay" ;;
			relay_c) psql -qXAt -d c -c "SELECT count(*) FROM idempotency.outbox_message WHERE state = 'pending'" ;;
			relay_p) psql -qXAt -d p -c "SELECT count(*) FROM idempotency.outbox_message WHERE state = 'pending'" ;;
		esac
	}
	fill() {	# system count
		case $1 in
			relay_pgmq) psql -qX -d q -c "SELECT pgmq.purge_queue('relay')" -c "VACUUM pgmq.q_relay" \
				-c "SELECT count(*) FROM pgmq.send_batch('relay', ARRAY(SELECT jsonb_build_object('n', i, 'pad', repeat('x', 100)) FROM generate_series(1, $2) i))" \
				-c "VACUUM ANALYZE pgmq.q_relay" >/dev/null ;;
			*) psql -qX -d "${1#relay_}" -c "DELETE FROM idempotency.outbox_message" -c "VACUUM idempotency.outbox_message" \
				-c "SELECT count(idempotency.publish('relay', jsonb_build_object('n', i, 'pad', repeat('x', 100)))) FROM generate_series(1, $2) i" \
				-c "VACUUM ANALYZE idempotency.outbox_message" >/dev/null ;;
		esac
	}
	echo "relay: claim + ack against pgmq read + delete"
	for round in $(seq 1 "$RELAY_ROUNDS"); do
		order=$systems
		[ $((round % 2)) = 0 ] && order=$rsystems
		for b in $RELAY_BATCHES; do
			for c in $RELAY_CLIENTS; do
				for sys in $order; do
					need=$((b * 8000 * SECS))
					[ "$need" -gt "$RELAY_MAX" ] && need=$RELAY_MAX
					fill "$sys" "$need"
					db=q
					case $sys in relay_c) db=c ;; relay_p) db=p ;; esac
					f=$W/relay_ours.sql
					[ "$sys" = relay_pgmq ] && f=$W/relay_pgmq.sql
					before=$(pending "$sys")
					(cd "$WORK" && pgbench -n -M prepared -c "$c" -j "$c" -T "$SECS" -D batch="$b" -f "$f" "$db" >"$WORK/relay.out" 2>&1) ||
						{ echo "pgbench failed for $sys batch $b:"; tail -5 "$WORK/relay.out"; exit 1; }
					after=$(pending "$sys")
					[ "$after" -eq 0 ] && echo "$sys batch $b, $c relays (round $round)" >>"$WORK/relay.dry"
					rate=$(( (before - after) / SECS ))
					echo "$sys.$b $c $rate $round" >>"$WORK/relay"
					printf '  %-10s batch %3d, %d relays: %8d messages/s\n' "$sys" "$b" "$c" "$rate"
				done
			done
		done
	done
fi

# ---- aggregate -----------------------------------------------------------------
sort -k1,1 -k2,2n -k3,3n "$WORK/results" |
	awk '{ k = $1 " " $2; n[k]++; row[k, n[k]] = $0 }
	     END { for (k in n) print row[k, int((n[k] + 1) / 2)] }' |
	sort -k1,1 -k2,2n >"$WORK/median"
get() { awk -v l="$1" -v c="$2" '$1 == l && $2 == c { print $3 }' "$WORK/median"; }
pair() {	# scenario baseline clients -> "median min max" of the per-round ratios
	awk -v s="$1" -v b="$2" -v c="$3" '
		$2 == c && $1 == s { a[$4] = $3 }
		$2 == c && $1 == b { z[$4] = $3 }
		END {
			n = 0
			for (r in a) if (z[r] > 0) r_[++n] = a[r] / z[r]
			if (n == 0) { print "- - -"; exit }
			for (i = 2; i <= n; i++) { v = r_[i]; for (j = i - 1; j >= 1 && r_[j] > v; j--) r_[j + 1] = r_[j]; r_[j + 1] = v }
			m = (n % 2) ? r_[(n + 1) / 2] : (r_[n / 2] + r_[n / 2 + 1]) / 2
			printf "%.2f %.2f %.2f\n", m, r_[1], r_[n]
		}' "${PAIR_FILE:-$WORK/results}"
}
med() { pair "$@" | cut -d' ' -f1; }
rmed() { PAIR_FILE=$WORK/relay pair "$@" | cut -d' ' -f1; }
rrange() { PAIR_FILE=$WORK/relay pair "$@" | awk '{ print $2 "–" $3 }'; }
rget() {	# system.batch clients -> median rate over rounds
	awk -v l="$1" -v c="$2" '$1 == l && $2 == c { print $3 }' "$WORK/relay" | sort -n |
		awk '{ a[NR] = $1 } END { if (NR) print (NR % 2) ? a[(NR + 1) / 2] : int((a[NR / 2] + a[NR / 2 + 1]) / 2) }'
}
range() { pair "$@" | awk '{ print $2 "–" $3 }'; }
plural() { [ "$1" = 1 ] && echo "1 client" || echo "$1 clients"; }
met() {	# ratio target [gt]
	awk -v r="$1" -v t="$2" -v gt="${3:-}" 'BEGIN {
		if (r == "-" || r == "") print "?"
		else if (gt != "" ? r + 0 > t + 0 : r + 0 >= t + 0) print "met"
		else print "**not met**" }'
}
instr() { awk -v k="$1" '$1 == k { print $2 }' "$WORK/instr" 2>/dev/null; }
iratio() { awk -v a="$(instr "$1")" -v b="$(instr "$2")" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "-" }'; }
fmt() { [ -n "$1" ] && printf "%'d" "$1" 2>/dev/null || echo "-"; }
elapsed=$(($(date +%s) - started))
has() { case " $SCENARIOS " in *" $1 "*) return 0 ;; esac; return 1; }

SECTION=${PORTABLE_SECTION:-$WORK/section.md}
{
	echo "<!-- portable.sh: begin -->"
	echo "## The portable edition against the C edition (\`bench/portable.sh\`)"
	echo
	echo "Written by \`bench/portable.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC') in ${elapsed} s (rounds ${rounds_secs} s): $(nproc) cores,"
	echo "$(psql -qXAt -c 'SELECT version()' | cut -d, -f1), one cluster for both editions (database \`c\`: \`CREATE EXTENSION"
	echo "idempotency\`, the library not preloaded; database \`p\`: the portable script by \`psql -f\`), fsync $(psql -qXAt -c 'SHOW fsync'),"
	echo "synchronous_commit $SYNC, unix socket. pgbench -M prepared, ${SECS} s per run, ${ROUNDS} interleaved rounds (the order"
	echo "reversed every other round), clients: ${CLIENTS}; a ratio is the median over rounds of the ratio within a"
	echo "round (range: lowest and highest round); tps is the median round's. Load average (1, 5, 15 min) at"
	echo "the start ${load_start}, after the rounds ${load_end}."
	[ -n "${BENCH_NOTE:-}" ] && echo "$BENCH_NOTE"
	echo
	echo "### Targets"
	echo
	echo "| target | clients | measured | rounds | |"
	echo "|---|---|---|---|---|"
	if has p_once && has c_once; then
		for c in $CLIENTS; do
			r=$(med p_once c_once "$c")
			echo "| portable once() ≥ 0.75 × C once() | $c | $r | $(range p_once c_once "$c") | $(met "$r" 0.75) |"
		done
	fi
	if has p_once && has plpgsql1; then
		for c in $CLIENTS; do
			r=$(med p_once plpgsql1 "$c")
			echo "| portable once() ahead of the hand-written PL/pgSQL (> 1.00 ×) | $c | $r | $(range p_once plpgsql1 "$c") | $(met "$r" 1.0 gt) |"
		done
	fi
	for rp in replay1 replay; do
		has "p_$rp" && has "c_$rp" || continue
		for c in $CLIENTS; do
			r=$(med "p_$rp" "c_$rp" "$c")
			case $rp in replay1) what="replay by once()" ;; *) what="replay by begin()" ;; esac
			echo "| portable $what ≥ 0.8 × C | $c | $r | $(range "p_$rp" "c_$rp" "$c") | $(met "$r" 0.8) |"
		done
	done
	if has p_rfloor && has c_replay; then
		for c in $CLIENTS; do
			echo "| (no target: the floor of any PL/pgSQL replay, p_rfloor ÷ C replay by begin()) | $c | $(med p_rfloor c_replay "$c") | $(range p_rfloor c_replay "$c") | |"
		done
	fi
	if [ "$RELAY" = 1 ]; then
		for b in $RELAY_BATCHES; do
			for c in $RELAY_CLIENTS; do
				if [ $p_relay = 1 ]; then
					r=$(rmed "relay_p.$b" "relay_pgmq.$b" "$c")
					echo "| portable relay ≥ 1.0 × pgmq, batch $b | $c | $r | $(rrange "relay_p.$b" "relay_pgmq.$b" "$c") | $(met "$r" 1.0) |"
				else
					echo "| portable relay ≥ 1.0 × pgmq, batch $b | $c | no portable claim() in this build | | ? |"
				fi
			done
		done
	fi
	echo
	echo "### Throughput (tps of the median round, and the median per-round ratio)"
	echo
	echo "| scenario | round trips | $(for c in $CLIENTS; do printf '%s | ' "$(plural "$c")"; done)÷ C edition | ÷ bare1 |"
	echo "|---|---|$(for c in $CLIENTS; do printf -- '---|'; done)---|---|"
	for s in $SCENARIOS; do
		case $s in *guarded) rt=5 ;; *) rt=1 ;; esac
		case $s in p_*) b=c_${s#p_} ;; c_*) b=$s ;; *) b="" ;; esac
		printf '| %s | %s | ' "$s" "$rt"
		for c in $CLIENTS; do printf '%s | ' "$(get "$s" "$c")"; done
		if [ -n "$b" ] && has "$b"; then
			for c in $CLIENTS; do printf '%s (%s) ' "$(med "$s" "$b" "$c")" "$(range "$s" "$b" "$c")"; done
		fi
		printf '| '
		has bare1 && for c in $CLIENTS; do printf '%s ' "$(med "$s" bare1 "$c")"; done
		echo '|'
	done
	if has plpgsql1; then
		echo "| *÷ plpgsql1*: c_once, p_once | | $(for c in $CLIENTS; do printf '%s, %s | ' "$(med c_once plpgsql1 "$c")" "$(med p_once plpgsql1 "$c")"; done) | |"
	fi
	echo
	echo "\"÷ C edition\" is each scenario against its C counterpart in the same round, per client count"
	echo "(range in brackets); \"÷ bare1\" against the bare INSERT, per client count."
	if [ "$RELAY" = 1 ]; then
		echo
		echo "### The relay: messages delivered per second (median of ${RELAY_ROUNDS} rounds)"
		echo
		echo "| batch | relays | C edition | portable | pgmq 1.5.1 | C ÷ pgmq | portable ÷ pgmq | portable ÷ C |"
		echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
		for b in $RELAY_BATCHES; do
			for c in $RELAY_CLIENTS; do
				if [ $p_relay = 1 ]; then
					echo "| $b | $c | $(rget "relay_c.$b" "$c") | $(rget "relay_p.$b" "$c") | $(rget "relay_pgmq.$b" "$c") | $(rmed "relay_c.$b" "relay_pgmq.$b" "$c") | $(rmed "relay_p.$b" "relay_pgmq.$b" "$c") | $(rmed "relay_p.$b" "relay_c.$b" "$c") |"
				else
					echo "| $b | $c | $(rget "relay_c.$b" "$c") | not in this build | $(rget "relay_pgmq.$b" "$c") | $(rmed "relay_c.$b" "relay_pgmq.$b" "$c") | | |"
				fi
			done
		done
		echo
		echo "One statement per batch (claim and ack, or read and delete, one transaction), pgbench -M prepared,"
		echo "${SECS} s per run, each from a queue filled with batch × 8000 × ${SECS} messages (at most ${RELAY_MAX}) and"
		echo "vacuumed; pgmq in its own database of the same cluster. Ratios: median of the per-round ratios."
		[ -s "$WORK/relay.dry" ] && echo "Ran dry (the queue emptied before the ${SECS} s were up, so the rate is a lower bound): $(paste -sd ';' "$WORK/relay.dry" | sed 's/;/; /g')."
	fi
	if [ "$CALLGRIND" = 1 ]; then
		echo
		echo "### Instructions per request (callgrind, \`postgres --single\`, ${N} warm requests each)"
		echo
		echo "| request | C edition | portable | portable ÷ C |"
		echo "|---|---:|---:|---:|"
		for k in once guarded replay1 replay; do
			case $k in
				once) what="once(), a new key (the INSERT and the key)" ;;
				guarded) what="BEGIN; begin(); INSERT; complete(); COMMIT" ;;
				replay1) what="once() of a finished key" ;;
				replay) what="begin() of a finished key" ;;
			esac
			echo "| $what | $(fmt "$(instr "c_$k")") | $(fmt "$(instr "p_$k")") | $(iratio "p_$k" "c_$k") |"
		done
		echo "| the bare INSERT (autocommit) | $(fmt "$(instr bare1)") | | |"
		echo "| the hand-written PL/pgSQL (plpgsql1) | $(fmt "$(instr plpgsql1)") | | p_once ÷ plpgsql1: $(iratio p_once plpgsql1) |"
		echo "| a primary-key SELECT of a finished key's row | $(fmt "$(instr select)") | | |"
		[ -n "$(instr p_rfloor)" ] && echo "| the floor of a PL/pgSQL replay (p_rfloor, no product) | | $(fmt "$(instr p_rfloor)") | $(iratio p_rfloor c_replay) (÷ C replay) |"
		echo
		echo "Each count: the session's instructions less those of the same session with only the"
		echo "${WARM} warm-up requests, divided by ${N}: a warm request, plans and caches made."
	fi
	echo "<!-- portable.sh: end -->"
} >"$SECTION"

if [ -z "${PORTABLE_SECTION:-}" ]; then
	R=bench/RESULTS.md
	if grep -q '<!-- portable.sh: begin -->' "$R"; then
		awk -v f="$SECTION" '/<!-- portable.sh: begin -->/ { while ((getline l < f) > 0) print l; skip = 1; next }
			/<!-- portable.sh: end -->/ { skip = 0; next } !skip' "$R" >"$WORK/R.md" && cp "$WORK/R.md" "$R"
	else
		{ echo; cat "$SECTION"; } >>"$R"
	fi
	echo
	cat "$SECTION"
fi
