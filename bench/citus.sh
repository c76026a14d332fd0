#!/usr/bin/env bash
# bench/citus.sh — once() on Citus against the bare co-located INSERT, side
# by side in one run (issue 17): a coordinator and two workers on this
# machine (test/citus/cluster.sh; Citus 13.2.2 from test/citus/build.sh),
# the key table distributed with idempotency.distribute(), public.payments
# co-located with it.  pgbench -M simple, a new key per request, as role app.
#
#   bare     INSERT INTO payments ...                    (bench/scripts/citus_bare.sql)
#   once     once(key, ..., that INSERT), autocommit     (citus_once.sql: delegated)
#   oncetx   the same once() inside BEGIN ... COMMIT      (citus_oncetx.sql: routed)
#   deleg    the INSERT alone in a PL/pgSQL function that Citus delegates
#            to the key's node as it delegates once() (citus_delegated.sql):
#            the cost of delegation itself, the ceiling for once()
#
# through the coordinator and through worker 1, at 4 and 16 clients, each
# right after its bare baseline; ratio = tps / bare tps of the same round.
# Then the statements the entry node sends to other nodes for one request
# of each (citus.log_remote_commands), the key's shard on another node.
#
# Environment: BENCH_SECONDS (8), BENCH_ROUNDS (1), BENCH_CLIENTS ("4 16").
set -u
cd "$(dirname "$0")/.." || exit 2
. test/cluster.sh
SECS=${BENCH_SECONDS:-8}
ROUNDS=${BENCH_ROUNDS:-1}
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
CREATE FUNCTION public.pay(k text, node text) RETURNS void LANGUAGE plpgsql
AS $$ BEGIN INSERT INTO public.payments (key, amount, node) VALUES (k, 1, node); END $$;
SELECT create_distributed_function('public.pay(text, text)', 'k', colocate_with := 'public.payments',
                                   force_delegation := true);
GRANT EXECUTE ON FUNCTION public.pay(text, text) TO app;
SQL

tps() {	# node script clients
	pgbench -n -M simple -h "$CITUS_DIR" -p "$(citus_port "$1")" -U app -c "$3" -j "$3" -T "$SECS" \
		-f "bench/scripts/citus_$2.sql" postgres 2>&1 |
		sed -n 's/^tps = \([0-9.]*\) .*/\1/p'
}

echo "Citus 13.2.2, PostgreSQL $(psql -AtX -p "$PORT_C" -c 'SHOW server_version'), coordinator + 2 workers on one machine ($(nproc) cores), ${SECS} s per run, $ROUNDS round(s)"
echo
echo "| entry node | clients | bare tps | delegated INSERT tps | / bare | once() tps | once() / bare | once() / delegated | once() in BEGIN..COMMIT tps | / bare |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
	for node in c w1; do
		for c in $CLIENTS; do
			b=$(tps "$node" bare "$c")
			d=$(tps "$node" delegated "$c")
			o=$(tps "$node" once "$c")
			b2=$(tps "$node" bare "$c")
			t=$(tps "$node" oncetx "$c")
			name=$([ "$node" = c ] && echo coordinator || echo "worker 1")
			awk -v n="$name" -v c="$c" -v b="$b" -v d="$d" -v o="$o" -v b2="$b2" -v t="$t" 'BEGIN {
				printf "| %s | %d | %.0f | %.0f | %.2f | %.0f | **%.2f** | %.2f | %.0f | %.2f |\n",
					n, c, b, d, d / b, o, o / b, o / d, t, t / b2 }'
		done
	done
done

# remote commands per request: a key whose shard is on worker 2, so that
# both entry nodes reach it over the network
key=$(psql -AtX -p "$PORT_C" -c "SELECT k FROM generate_series(1, 200) AS g, LATERAL (SELECT 'rt-' || g AS k) AS x
      WHERE (SELECT p.nodeport FROM pg_dist_shard_placement AS p
              WHERE p.shardid = get_shard_id_for_distribution_column('idempotency.idempotency_key', x.k)) = $PORT_W2
      LIMIT 3" | tr '\n' ' ')
set -- $key
echo
echo "Statements the entry node sends to other nodes per request (citus.log_remote_commands; the key's shard on worker 2):"
echo
echo "| entry node | bare INSERT | once() | once() in BEGIN..COMMIT |"
echo "|---|---|---|---|"
for node in c w1; do
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
	psql -qAtX -p "$PORT_C" -c "SELECT idempotency.forget(k) FROM unnest(ARRAY['$2', '$3']) AS k" -U app >/dev/null
	psql -qAtX -p "$PORT_C" -c "DELETE FROM public.payments WHERE node = 'rt'" >/dev/null
	echo "| $([ "$node" = c ] && echo coordinator || echo "worker 1") | $nb | $no | $nt |"
done
