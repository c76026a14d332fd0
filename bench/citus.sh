#!/usr/bin/env bash
# bench/citus.sh — once() on Citus against the bare co-located INSERT, side
# by side in one run (issues 17, 27): a coordinator and two workers on this
# machine (test/citus/cluster.sh; Citus from test/citus/build.sh: 13.2.2 on
# PostgreSQL 15 and 17, 14.0.1 on 18), the key table distributed with
# idempotency.distribute(), public.payments co-located with it.  pgbench
# -M simple, a new key per request, as role app.
#
#   bare     INSERT INTO payments ...                    (bench/scripts/citus_bare.sql)
#   deleg    the INSERT alone in a PL/pgSQL function that Citus delegates
#            to the key's node as it delegates once() (citus_delegated.sql):
#            the cost of delegation itself, the ceiling for once()
#   once     once(key, ..., that INSERT), autocommit     (citus_once.sql: delegated)
#   tx       BEGIN; a plain key-row insert (public.plain_key, co-located,
#            shaped like the key table); the INSERT; COMMIT (citus_tx.sql):
#            the guarded transactions below without the guard
#   oncetx   the same once() inside BEGIN ... COMMIT      (citus_oncetx.sql: routed)
#   begintx  BEGIN; begin(key); the INSERT; complete(key, ...); COMMIT
#            (citus_begintx.sql)
#
# through the coordinator and through worker 1, at 4 and 16 clients, the
# rounds interleaved (round 1 of every case, then round 2 ...).  Prints each
# round's tps, then per entry node and clients the median of each ratio over
# the rounds with its spread (min-max): deleg/bare, once/bare, once/deleg
# (what the guard adds to a delegated call), oncetx/tx and begintx/tx (what
# the guard adds to a transaction); and the same ratios from the CPU each
# request cost the cluster and pgbench (/proc: each postmaster with its live
# and exited children), which a machine busy with other work does not skew
# as it skews tps.  Then the statements the entry node
# sends to other nodes for one request of each (citus.log_remote_commands),
# the key's shard on another node.
#
# PostgreSQL 15: the host's (build.sh copies it into a private prefix with
# Citus; the host's own server is untouched).  17 and 18 in their chroot:
#   test/chroot.sh scratch 17 . env PGMAJOR=17 bash bench/citus.sh
#
# Environment: PGMAJOR (15), BENCH_SECONDS (8), BENCH_ROUNDS (3),
# BENCH_CLIENTS ("4 16"), BENCH_NODES ("c w1"), BENCH_CASES (all six).
set -u
cd "$(dirname "$0")/.." || exit 2
. test/cluster.sh
SECS=${BENCH_SECONDS:-8}
ROUNDS=${BENCH_ROUNDS:-3}
NODES=${BENCH_NODES:-c w1}
CASES=${BENCH_CASES:-bare delegated once tx oncetx begintx}
CLIENTS=${BENCH_CLIENTS:-4 16}

CITUS_BIN=$(bash test/citus/build.sh) || { echo "Citus did not build (or no tarball)" >&2; exit 2; }
WORK=$(mktemp -d /tmp/idempotency-citus-bench.XXXXXX)
chmod 755 "$WORK"
. test/citus/cluster.sh
trap 'citus_stop; rm -rf "$WORK"' EXIT
PGMAJOR=${PGMAJOR:-15}
prefix=${CITUS_BIN%/lib/postgresql/$PGMAJOR/bin}
cp -a "$prefix/lib" "$prefix/share" "$prefix/include" "$WORK/" || exit 2
CITUS_BIN=$WORK/lib/postgresql/$PGMAJOR/bin
make -s PG_CONFIG="$CITUS_BIN/pg_config" >/dev/null 2>&1 &&
	make -s PG_CONFIG="$CITUS_BIN/pg_config" install >/dev/null 2>&1 || { echo "build failed" >&2; exit 2; }
export PATH=$CITUS_BIN:$PATH
citus_start "max_connections = 300" || exit 2

psql -qX -v ON_ERROR_STOP=1 -p "$PORT_C" >/dev/null <<'SQL' || exit 2
SELECT idempotency.distribute();
CREATE TABLE public.payments (key text COLLATE "C" NOT NULL, amount int NOT NULL, node text);
SELECT create_distributed_table('public.payments', 'key', colocate_with => 'idempotency.idempotency_key');
CREATE ROLE app LOGIN;
GRANT SELECT, INSERT ON public.payments TO app;
CREATE TABLE public.plain_key (owner oid NOT NULL, scope text COLLATE "C" NOT NULL DEFAULT '',
    key text COLLATE "C" NOT NULL, status text NOT NULL, request_hash bytea, response jsonb,
    retryable bool, attempts int4 NOT NULL DEFAULT 1, created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(), expires_at timestamptz NOT NULL,
    locked_until timestamptz, PRIMARY KEY (key, scope, owner));
SELECT create_distributed_table('public.plain_key', 'key', colocate_with => 'idempotency.idempotency_key');
GRANT SELECT, INSERT ON public.plain_key TO app;
CREATE FUNCTION public.pay(k text, node text) RETURNS void LANGUAGE plpgsql
AS $$ BEGIN INSERT INTO public.payments (key, amount, node) VALUES (k, 1, node); END $$;
SELECT create_distributed_function('public.pay(text, text)', 'k', colocate_with := 'public.payments',
                                   force_delegation := true);
GRANT EXECUTE ON FUNCTION public.pay(text, text) TO app;
SQL

# CPU seconds (in clock ticks) the cluster has used: each postmaster, its
# live children and its exited ones (cutime/cstime)
cluster_ticks() {
	local n pm c v t=0
	for n in c w1 w2; do
		pm=$(head -n 1 "$CITUS_DIR/$n/postmaster.pid" 2>/dev/null) || continue
		# the children first: one that exits in between is counted twice
		# rather than not at all (both rare: the clients' backends are gone)
		for c in $(cat "/proc/$pm/task/$pm/children" 2>/dev/null); do
			v=$(sed 's/^.*) //' "/proc/$c/stat" 2>/dev/null | awk '{ print $12 + $13 }')
			t=$((t + ${v:-0}))
		done
		v=$(sed 's/^.*) //' "/proc/$pm/stat" | awk '{ print $12 + $13 + $14 + $15 }')
		t=$((t + ${v:-0}))
	done
	echo "$t"
}
HZ=$(getconf CLK_TCK)

# node script clients: prints "tps/cpu", cpu the CPU microseconds per
# request of the cluster and pgbench together (a throughput measure that a
# busy machine does not skew: time spent waiting for a core is not counted)
tps() {
	local out t0 t1 n pb TIMEFORMAT='%3U %3S'
	t0=$(cluster_ticks)
	{ time pgbench -n -M simple -h "$CITUS_DIR" -p "$(citus_port "$1")" -U app -c "$3" -j "$3" -T "$SECS" \
		-f "bench/scripts/citus_$2.sql" postgres >"$WORK/pgbench.out" 2>&1; } 2>"$WORK/time.out"
	sleep 0.3	# the pgbench backends exit and are reaped
	t1=$(cluster_ticks)
	n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$WORK/pgbench.out")
	pb=$(tail -n 1 "$WORK/time.out")
	awk -v t="$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$WORK/pgbench.out")" -v n="${n:-0}" \
		-v ticks=$((t1 - t0)) -v hz="$HZ" -v pb="$pb" 'BEGIN {
		split(pb, u, " ")
		cpu = n > 0 ? (ticks / hz + u[1] + u[2]) * 1e6 / n : 0
		printf "%s/%.0f\n", t, cpu }'
}

citus_v=$(psql -AtX -p "$PORT_C" -c "SELECT (regexp_match(citus_version(), 'Citus ([0-9.]+)'))[1]")
echo "Citus $citus_v, PostgreSQL $(psql -AtX -p "$PORT_C" -c 'SHOW server_version'), coordinator + 2 workers on one machine ($(nproc) cores), ${SECS} s per run, $ROUNDS round(s), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
RAW=$WORK/raw
: >"$RAW"
nodename() { if [ "$1" = c ]; then echo coordinator; else echo "worker ${1#w}"; fi; }
echo "Each run: tps (cluster + pgbench CPU microseconds per request)"
echo
echo "| round | entry node | clients | $(echo $CASES | sed 's/ / | /g') |"
echo "|---|---|---|$(for x in $CASES; do printf -- '---|'; done)"
for round in $(seq "$ROUNDS"); do
	for node in $NODES; do
		for c in $CLIENTS; do
			line="$round $node $c"
			for case in $CASES; do
				line="$line $case=$(tps "$node" "$case" "$c")"
			done
			echo "$line" >>"$RAW"
			echo "| $round | $(nodename "$node") | $c |$(for f in ${line#* * * }; do f=${f#*=}; printf ' %.0f (%s us) |' "${f%/*}" "${f#*/}"; done)"
		done
	done
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
for measure in tps cpu; do
	if [ "$measure" = tps ]; then
		echo "Median of each ratio of tps over the rounds, (min-max) its spread:"
	else
		echo "The same ratios from the CPU per request (CPU of the base / CPU of the case: the ratio of"
		echo "throughputs when the cores do nothing else), median (min-max):"
	fi
	echo
	echo "| entry node | clients | delegated / bare | once() / bare | **once() / delegated** | tx / bare | **once() in tx / tx** | **begin()..complete() / tx** |"
	echo "|---|---|---|---|---|---|---|---|"
	for node in $NODES; do
		for c in $CLIENTS; do
			awk -v node="$node" -v c="$c" -v name="$(nodename "$node")" -v measure="$measure" '
			function med(a, n,   i, j, t) {
				for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
				return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
			}
			function cell(num, den,   n, i, a, lo, hi) {
				n = 0
				for (i = 1; i <= rows; i++) if ((num, i) in v && (den, i) in v && v[den, i] > 0 && v[num, i] > 0)
					a[++n] = measure == "tps" ? v[num, i] / v[den, i] : v[den, i] / v[num, i]
				if (n == 0) return "-"
				lo = hi = a[1]
				for (i = 2; i <= n; i++) { if (a[i] < lo) lo = a[i]; if (a[i] > hi) hi = a[i] }
				return sprintf("%.2f (%.2f-%.2f)", med(a, n), lo, hi)
			}
			$2 == node && $3 == c {
				rows++
				for (f = 4; f <= NF; f++) {
					split($f, kv, "="); split(kv[2], tc, "/")
					if (kv[2] != "") v[kv[1], rows] = measure == "tps" ? tc[1] : tc[2]
				}
			}
			END {
				printf "| %s | %d | %s | %s | %s | %s | %s | %s |\n", name, c,
					cell("delegated", "bare"), cell("once", "bare"), cell("once", "delegated"),
					cell("tx", "bare"), cell("oncetx", "tx"), cell("begintx", "tx")
			}' "$RAW"
		done
	done
	echo
done

# remote commands per request: a key whose shard is on worker 2, so that
# both entry nodes reach it over the network
key=$(psql -AtX -p "$PORT_C" -c "SELECT k FROM generate_series(1, 200) AS g, LATERAL (SELECT 'rt-' || g AS k) AS x
      WHERE (SELECT p.nodeport FROM pg_dist_shard_placement AS p
              WHERE p.shardid = get_shard_id_for_distribution_column('idempotency.idempotency_key', x.k)) = $PORT_W2
      LIMIT 4" | tr '\n' ' ')
set -- $key
echo
echo "Statements the entry node sends to other nodes per request (citus.log_remote_commands; the key's shard on worker 2):"
echo
echo "| entry node | bare INSERT | once() | once() in BEGIN..COMMIT | the same transaction without the guard (tx) |"
echo "|---|---|---|---|---|"
for node in $NODES; do
	count() {
		psql -qAtX -U app -p "$(citus_port "$node")" 2>&1 <<SQL | grep -c '^NOTICE:  issuing'
SET citus.log_remote_commands = on;
SET client_min_messages = notice;
$1
SQL
	}
	k1=$1-$node k2=$2-$node k3=$3-$node
	nb=$(count "INSERT INTO public.payments VALUES ('$1', 1, 'rt');")
	no=$(count "SELECT outcome FROM idempotency.once('$2', NULL, 'INSERT INTO public.payments VALUES (\$1, 1, \$2)', '$2', 'rt');")
	nt=$(count "BEGIN; SELECT outcome FROM idempotency.once('$3', NULL, 'INSERT INTO public.payments VALUES (\$1, 1, \$2)', '$3', 'rt'); COMMIT;")
	nx=$(count "BEGIN; INSERT INTO public.plain_key (owner, key, status, expires_at) VALUES (10, '$4', 'completed', now()); INSERT INTO public.payments VALUES ('$4', 1, 'rt'); COMMIT;")
	psql -qAtX -p "$PORT_C" -c "SELECT idempotency.forget(k) FROM unnest(ARRAY['$2', '$3']) AS k" -U app >/dev/null
	psql -qAtX -p "$PORT_C" -c "DELETE FROM public.payments WHERE node = 'rt'" -c "DELETE FROM public.plain_key WHERE key = '$4'" >/dev/null
	echo "| $(nodename "$node") | $nb | $no | $nt | $nx |"
done
