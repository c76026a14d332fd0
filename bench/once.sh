#!/usr/bin/env bash
# bench/once.sh — One round trip: what idempotency.once() costs and saves,
# side by side in one run on one throwaway cluster (fsync on).  `make bench`
# (bench/run) runs it last; alone it rewrites the "One round trip" section of
# bench/RESULTS.md and bench/once.png and leaves the rest of the file alone.
#
# 1. Throughput, pgbench -M prepared, interleaved rounds at each client count
#    (a ratio is the median over rounds of the ratio within a round):
#      bare1     the business INSERT alone, autocommit (1 round trip)
#      once      the same INSERT guarded by idempotency.once() (1 round trip)
#      keyrow1   the INSERT plus a plain INSERT of an equivalent key row into a
#                copy of the key table, one writable CTE (no lock, no lookup):
#                the floor of any design that stores a key row
#      plpgsql1  the seed pattern (key ON CONFLICT DO NOTHING, SELECT ... FOR
#                UPDATE, INSERT, UPDATE key) as one PL/pgSQL call
#      guarded   today's 5 statements (BEGIN, begin(), INSERT, complete(), COMMIT)
#      replay1   once() of completed keys, against select (a plain PK SELECT)
# 2. A Redis token (redis-server: SET key NX EX, then the same autocommit
#    INSERT; appendfsync always and everysec) against bare1, both driven by
#    bench/clients.py (psycopg 3 and redis-py; pgbench cannot talk to Redis).
# 3. Latency per request at a network distance: bench/delay_proxy.py in front
#    of PostgreSQL and of Redis adds 0, 1 and 5 ms each way; 1 client,
#    median and p99 for bare1, once, guarded and Redis + INSERT.
# 4. WAL per statement of once() and of its replay (pg_stat_statements).
#
# Environment: BENCH_SECONDS (5), BENCH_ROUNDS (3), BENCH_CLIENTS ("1 4 16"),
# BENCH_DELAYS ("0 1 5"), BENCH_LATENCY_REQUESTS (200),
# ONCE_SECTION (write the section there instead of into bench/RESULTS.md),
# BENCH_NOTE (a line about the run, e.g. that the machine was shared).
set -u
cd "$(dirname "$0")/.." || exit 2
. test/cluster.sh

SECS=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CLIENTS=${BENCH_CLIENTS:-1 4 16}
DELAYS=${BENCH_DELAYS:-0 1 5}
LAT_N=${BENCH_LATENCY_REQUESTS:-200}
SCENARIOS="bare1 once keyrow1 plpgsql1 guarded select replay1"
PY=/usr/bin/python3

need=()
command -v redis-server >/dev/null || need+=(redis-server)
$PY -c 'import redis' 2>/dev/null || need+=(python3-redis)
$PY -c 'import psycopg' 2>/dev/null || need+=(python3-psycopg)
command -v gnuplot >/dev/null || need+=(gnuplot-nox)
if [ ${#need[@]} -gt 0 ]; then
	echo "installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 ||
		{ apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null; } || exit 2
fi

bench_start "max_connections = 100" "listen_addresses = 'localhost'" \
	"shared_preload_libraries = 'pg_stat_statements'" "pg_stat_statements.track = none"
started=$(date +%s)
psql -qX -v ON_ERROR_STOP=1 -f bench/scripts/setup.sql >/dev/null || exit 2

# Redis on a private port, append-only file in $WORK, fsync on every write
RPORT=$((PGPORT + 1))
mkdir -p "$WORK/redis" && chmod 777 "$WORK/redis"
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly yes \
	--appendfsync always --dir "$WORK/redis" --daemonize yes \
	--pidfile "$WORK/redis/redis.pid" --logfile "$WORK/redis/redis.log" || exit 2
PROXIES=()
stop_all() {
	for p in "${PROXIES[@]}"; do kill "$p" 2>/dev/null; done
	redis-cli -p "$RPORT" shutdown nosave >/dev/null 2>&1
	cluster_stop
	rm -rf "$WORK"
}
trap stop_all EXIT
for i in $(seq 1 50); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
rcli() { redis-cli -p "$RPORT" "$@" >/dev/null; }
DSN="host=localhost port=$PGPORT user=postgres dbname=postgres"

# run SCRIPT CLIENTS ROUND -> "label clients tps avg_ms p99_ms round" in results
run() {
	local s=$1 c=$2 round=$3 j out tps
	j=$((c < 2 ? c : 2))
	out=$(cd "$WORK" && rm -f pgbench_log.* &&
		pgbench -n -M prepared -c "$c" -j "$j" -T "$SECS" -l -f "$OLDPWD/bench/scripts/$s.sql" 2>&1)
	tps=$(echo "$out" | awk '/^tps/ { printf "%.1f", $3 }')
	[ -n "$tps" ] || { echo "pgbench failed for $s/$c:"; echo "$out" | tail -5; exit 1; }
	cat "$WORK"/pgbench_log.* | awk '{ print $3 }' | sort -n |
		awk -v l="$s" -v c="$c" -v tps="$tps" -v r="$round" '{ v[NR] = $1; s += $1 } END {
			printf "%s %d %s %.3f %.3f %d\n", l, c, tps, s / NR / 1000, v[int(NR * 0.99) + 1] / 1000, r }' \
		>>"$WORK/results"
	printf '  %-10s %2d clients: %9s tps\n' "$s" "$c" "$tps"
}
# pyrun LABEL SCENARIO CLIENTS ROUND -> the same line from bench/clients.py
pyrun() {
	local out
	out=$($PY bench/clients.py "$2" "$3" --seconds "$SECS" --pg "$DSN" --redis "127.0.0.1:$RPORT" --tag "r$4") ||
		{ echo "bench/clients.py failed for $1/$3"; exit 1; }
	echo "$out" | awk -v l="$1" -v r="$4" '{ printf "%s %d %s %s %s %d\n", l, $2, $4, $5, $6, r }' >>"$WORK/results"
	printf '  %-14s %2d clients: %9s tps\n' "$1" "$3" "$(echo "$out" | awk '{ print $4 }')"
}

for round in $(seq 1 "$ROUNDS"); do
	echo "round $round of $ROUNDS"
	for c in $CLIENTS; do
		for s in $SCENARIOS; do run "$s" "$c" "$round"; done
		pyrun py_bare1 bare1 "$c" "$round"
		rcli config set appendfsync always
		pyrun redis_always redis "$c" "$round"
		rcli config set appendfsync everysec
		pyrun redis_everysec redis "$c" "$round"
	done
done

# latency at a network distance: one proxy for PostgreSQL, one for Redis
echo "latency through bench/delay_proxy.py"
for d in $DELAYS; do
	pp=$((PGPORT + 10)) rp=$((PGPORT + 11))
	for spec in "$pp $PGPORT" "$rp $RPORT"; do
		set -- $spec
		$PY bench/delay_proxy.py "$1" 127.0.0.1 "$2" "$d" >"$WORK/proxy.$1" 2>&1 &
		PROXIES+=($!)
	done
	for i in $(seq 1 50); do
		[ "$(cat "$WORK/proxy.$pp" "$WORK/proxy.$rp" 2>/dev/null | grep -c ready)" = 2 ] && break
		sleep 0.1
	done
	for s in bare1 once guarded redis_always redis_everysec; do
		sc=$s
		case $s in
			redis_always) sc=redis; rcli config set appendfsync always ;;
			redis_everysec) sc=redis; rcli config set appendfsync everysec ;;
		esac
		out=$($PY bench/clients.py "$sc" 1 --count "$LAT_N" --tag "d$d" \
			--pg "host=127.0.0.1 port=$pp user=postgres dbname=postgres" --redis "127.0.0.1:$rp") ||
			{ echo "latency run failed: $s at $d ms"; exit 1; }
		echo "$out" | awk -v d="$d" -v l="$s" '{ print d, l, $5, $6 }' >>"$WORK/latency"
		printf '  %-14s %s ms each way: median %s ms, p99 %s ms\n' "$s" "$d" \
			"$(echo "$out" | awk '{ print $5 }')" "$(echo "$out" | awk '{ print $6 }')"
	done
	for p in "${PROXIES[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
	PROXIES=()
done

# WAL per statement (pg_stat_statements counts what each statement wrote)
echo "WAL per statement"
psql -qX -v ON_ERROR_STOP=1 >/dev/null <<SQL || exit 2
ALTER SYSTEM SET pg_stat_statements.track = 'top';
SELECT pg_reload_conf();
CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
SQL
sleep 1
for s in replay1 select once; do
	psql -qXAt -c "SELECT pg_stat_statements_reset()" >/dev/null
	(cd "$WORK" && pgbench -n -M prepared -c 4 -j 2 -T "$SECS" -f "$OLDPWD/bench/scripts/$s.sql" >/dev/null 2>&1)
	psql -qXAt -F ' ' -c "SELECT calls, wal_bytes, wal_records, round(wal_bytes / calls, 2)
	    FROM pg_stat_statements
	   WHERE query LIKE '%idempotency.once(%' OR query LIKE '%FROM idempotency.idempotency_key%WHERE owner%'" >"$WORK/wal.$s"
done
psql -qX -c "ALTER SYSTEM RESET pg_stat_statements.track" -c "SELECT pg_reload_conf()" >/dev/null

# ---- aggregate ------------------------------------------------------------
sort -k1,1 -k2,2n -k3,3n "$WORK/results" |
	awk '{ k = $1 " " $2; n[k]++; row[k, n[k]] = $0 }
	     END { for (k in n) print row[k, int((n[k] + 1) / 2)] }' |
	sort -k1,1 -k2,2n >"$WORK/median"
get() { awk -v l="$1" -v c="$2" -v f="$3" '$1 == l && $2 == c { print $f }' "$WORK/median"; }
pair() {	# scenario baseline clients -> "median min max" of per-round ratios
	awk -v s="$1" -v b="$2" -v c="$3" '
		$2 == c && $1 == s { a[$6] = $3 }
		$2 == c && $1 == b { z[$6] = $3 }
		END {
			n = 0
			for (r in a) if (z[r] > 0) r_[++n] = a[r] / z[r]
			if (n == 0) { print "- - -"; exit }
			for (i = 2; i <= n; i++) { v = r_[i]; for (j = i - 1; j >= 1 && r_[j] > v; j--) r_[j + 1] = r_[j]; r_[j + 1] = v }
			m = (n % 2) ? r_[(n + 1) / 2] : (r_[n / 2] + r_[n / 2 + 1]) / 2
			printf "%.2f %.2f %.2f\n", m, r_[1], r_[n]
		}' "$WORK/results"
}
med() { pair "$@" | cut -d' ' -f1; }
range() { pair "$@" | awk '{ print $2 "–" $3 }'; }
plural() { [ "$1" = 1 ] && echo "1 client" || echo "$1 clients"; }
met() { awk -v r="$1" -v t="$2" 'BEGIN { print (r == "-") ? "?" : (r + 0 >= t + 0) ? "met" : "**not met**" }'; }
lat() { awk -v d="$1" -v l="$2" -v f="$3" '$1 == d && $2 == l { print $f }' "$WORK/latency"; }
last_delay=$(echo "$DELAYS" | awk '{ print $NF }')
read -r once_calls once_wal once_rec once_per <"$WORK/wal.once"
read -r replay_calls replay_wal replay_rec replay_per <"$WORK/wal.replay1"
read -r select_calls select_wal select_rec select_per <"$WORK/wal.select"
elapsed=$(($(date +%s) - started))

# ---- the section -------------------------------------------------------------
SECTION=${ONCE_SECTION:-$WORK/section.md}
{
	echo "<!-- once.sh: begin -->"
	echo "## One round trip (\`bench/once.sh\`)"
	echo
	echo "Written by \`bench/once.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC') in ${elapsed} s: $(nproc) cores, $(psql -qXAt -c 'SELECT version()' | cut -d, -f1),"
	echo "fsync $(psql -qXAt -c 'SHOW fsync'), synchronous_commit $(psql -qXAt -c 'SHOW synchronous_commit'), $(redis-server --version | awk '{ print $1, $2, $3 }'), TCP on localhost."
	echo "pgbench -M prepared, ${SECS} s per run, ${ROUNDS} interleaved rounds, clients: ${CLIENTS}; a ratio is the median over rounds"
	echo "of the ratio within a round (range: lowest and highest round). bench/clients.py (psycopg 3, redis-py,"
	echo "one process per client) drives the Redis runs and their bare1 baseline, and the latency runs (${LAT_N} requests each, 1 client)."
	[ -n "${BENCH_NOTE:-}" ] && echo "$BENCH_NOTE"
	echo
	echo "### Targets"
	echo
	echo "| target | measured | rounds | |"
	echo "|---|---|---|---|"
	for c in $CLIENTS; do
		r=$(med once keyrow1 "$c")
		echo "| once ≥ 0.90 × keyrow1, $(plural "$c") | $r | $(range once keyrow1 "$c") | $(met "$r" 0.90) |"
	done
	for c in $CLIENTS; do
		r=$(med once plpgsql1 "$c")
		echo "| once ≥ 1.3 × plpgsql1, $(plural "$c") | $r | $(range once plpgsql1 "$c") | $(met "$r" 1.3) |"
	done
	for c in $CLIENTS; do
		r=$(med replay1 select "$c")
		echo "| replay1 ≥ 0.90 × plain SELECT, $(plural "$c") | $r | $(range replay1 select "$c") | $(met "$r" 0.90) |"
	done
	echo "| replay1 writes 0 WAL | ${replay_wal:-?} bytes in ${replay_rec:-?} records over ${replay_calls:-?} calls (plain SELECT: ${select_wal:-?} bytes over ${select_calls:-?}) | | $(awk -v w="${replay_wal:-1}" 'BEGIN { print (w + 0 == 0) ? "met" : "**not met**" }') |"
	r=$(awk -v a="$(lat "$last_delay" once 3)" -v b="$(lat "$last_delay" bare1 3)" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
	echo "| once median latency ≤ 1.1 × bare1 at $last_delay ms each way | $r ($(lat "$last_delay" once 3) vs $(lat "$last_delay" bare1 3) ms) | | $(awk -v r="$r" 'BEGIN { print (r == "-") ? "?" : (r + 0 <= 1.1) ? "met" : "**not met**" }') |"
	echo
	echo "### Throughput (tps, median round; × is the median per-round ratio)"
	echo
	echo "| scenario | round trips | $(for c in $CLIENTS; do printf '%s | ' "$(plural "$c")"; done)× bare1 | × keyrow1 |"
	echo "|---|---|$(for c in $CLIENTS; do printf -- '---|'; done)---|---|"
	for s in bare1 once keyrow1 plpgsql1 guarded; do
		case $s in guarded) rt=5 ;; *) rt=1 ;; esac
		echo "| $s | $rt | $(for c in $CLIENTS; do printf '%s | ' "$(get "$s" "$c" 3)"; done)$(for c in $CLIENTS; do printf '%s ' "$(med "$s" bare1 "$c")"; done)| $(for c in $CLIENTS; do printf '%s ' "$(med "$s" keyrow1 "$c")"; done)|"
	done
	echo "| select | 1 | $(for c in $CLIENTS; do printf '%s | ' "$(get select "$c" 3)"; done) | |"
	echo "| replay1 | 1 | $(for c in $CLIENTS; do printf '%s | ' "$(get replay1 "$c" 3)"; done)× select: $(for c in $CLIENTS; do printf '%s ' "$(med replay1 select "$c")"; done)| |"
	echo
	echo "### A Redis token (SET NX EX, then the INSERT: 2 round trips, not atomic with the write)"
	echo
	echo "| scenario (bench/clients.py) | $(for c in $CLIENTS; do printf '%s | ' "$(plural "$c")"; done)× bare1 (same driver) |"
	echo "|---|$(for c in $CLIENTS; do printf -- '---|'; done)---|"
	for s in py_bare1 redis_always redis_everysec; do
		echo "| $s | $(for c in $CLIENTS; do printf '%s | ' "$(get "$s" "$c" 3)"; done)$(for c in $CLIENTS; do printf '%s ' "$(med "$s" py_bare1 "$c")"; done)|"
	done
	echo
	echo "With pgbench, \`once\` ÷ \`bare1\` is in the first table; the Redis runs share one Python driver with"
	echo "their own \`py_bare1\`, so compare them to that row. Redis + INSERT is not atomic: a crash or an error"
	echo "between the token and the INSERT loses the request (the token says done) or, if the token is set"
	echo "after, lets a duplicate through; \`once\` stores key and row in one transaction."
	echo
	echo "### Latency per request with network delay (ms, 1 client, ${LAT_N} requests, median / p99)"
	echo
	echo "| scenario | round trips | $(for d in $DELAYS; do printf '%s ms each way | ' "$d"; done)"
	echo "|---|---|$(for d in $DELAYS; do printf -- '---|'; done)"
	for s in bare1 once guarded redis_always redis_everysec; do
		case $s in guarded) rt=5 ;; redis*) rt=2 ;; *) rt=1 ;; esac
		echo "| $s | $rt | $(for d in $DELAYS; do printf '%s / %s | ' "$(lat "$d" "$s" 3)" "$(lat "$d" "$s" 4)"; done)"
	done
	echo
	echo "![latency](once.png)"
	echo
	echo "### WAL per statement (pg_stat_statements, 4 clients, ${SECS} s)"
	echo
	echo "| statement | calls | WAL bytes | WAL records | WAL bytes / call |"
	echo "|---|---|---|---|---|"
	echo "| once(), new keys | ${once_calls:-?} | ${once_wal:-?} | ${once_rec:-?} | ${once_per:-?} |"
	echo "| once(), replays (replay1) | ${replay_calls:-?} | ${replay_wal:-?} | ${replay_rec:-?} | ${replay_per:-?} |"
	echo "| plain PK SELECT (select) | ${select_calls:-?} | ${select_wal:-?} | ${select_rec:-?} | ${select_per:-?} |"
	echo "<!-- once.sh: end -->"
} >"$SECTION"

# the plot: median latency against the delay
for s in bare1 once guarded redis_always redis_everysec; do
	for d in $DELAYS; do echo "$d $(lat "$d" "$s" 3)"; done >"$WORK/plot.$s"
done
gnuplot <<GP
set terminal pngcairo size 900,500 font "sans,11"
set output "bench/once.png"
set title "Median latency per request against network delay (1 client)"
set xlabel "added delay each way (ms)"
set ylabel "median ms per request"
set key top left
set grid
plot '$WORK/plot.bare1' using 1:2 with linespoints lw 2 title "bare1 (1 round trip)", \
     '$WORK/plot.once' using 1:2 with linespoints lw 2 title "once (1)", \
     '$WORK/plot.guarded' using 1:2 with linespoints lw 2 title "guarded (5)", \
     '$WORK/plot.redis_always' using 1:2 with linespoints lw 2 title "Redis always + INSERT (2)", \
     '$WORK/plot.redis_everysec' using 1:2 with linespoints lw 2 title "Redis everysec + INSERT (2)"
GP

# alone: replace the section in bench/RESULTS.md (or append it)
if [ -z "${ONCE_SECTION:-}" ]; then
	R=bench/RESULTS.md
	if grep -q '<!-- once.sh: begin -->' "$R"; then
		awk -v f="$SECTION" '/<!-- once.sh: begin -->/ { while ((getline l < f) > 0) print l; skip = 1; next }
			/<!-- once.sh: end -->/ { skip = 0; next } !skip' "$R" >"$WORK/R.md" && cp "$WORK/R.md" "$R"
	else
		{ echo; cat "$SECTION"; } >>"$R"
	fi
	echo
	cat "$SECTION"
fi
