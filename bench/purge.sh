#!/usr/bin/env bash
# bench/purge.sh — purge throughput at a given batch (default: purge()'s and
# the worker's default, 10000) in three runs on one throwaway cluster (fsync
# on), each while guarded requests (BEGIN; begin(); INSERT; complete();
# COMMIT on a new key) run from CLIENTS pgbench clients:
#
#   1. N expired keys in the plain key table (beside 100000 live ones),
#   2. N expired keys in the key table hash-partitioned by the README's recipe
#      (sql/partitioned.sql; 4 partitions),
#   3. M delivered, expired outbox messages of one topic.
#
#   bash bench/purge.sh [expired_keys=1000000] [clients=4] [batch=10000] [messages=N]
#
# Prints rows/s of each purge (SELECT idempotency.purge(batch) until it
# returns less), and avg/p50/p99 latency of the guarded request alone and
# while each purge runs (pgbench -M prepared, per-request log filtered to the
# purge window).
set -u
cd "$(dirname "$0")/.." || exit 2
. test/cluster.sh
N=${1:-1000000} CLIENTS=${2:-4} BATCH=${3:-10000} M=${4:-${1:-1000000}}
bench_start "shared_buffers = '1GB'" "max_wal_size = '4GB'"

psql -qX -c "CREATE EXTENSION idempotency" -c "CREATE TABLE payment (key text, amount int)"
echo "loading $N expired keys and 100000 live ones ..."
psql -qX <<SQL
INSERT INTO idempotency.idempotency_key (owner, scope, key, status, response, attempts, created_at, updated_at, expires_at)
SELECT 'postgres', '', 'expired-' || i, 'completed', '{"ok": true}', 1,
       now() - interval '2 days', now() - interval '2 days', now() - interval '1 day' + i * interval '1 ms'
  FROM generate_series(1, $N) i;
INSERT INTO idempotency.idempotency_key (owner, scope, key, status, response, attempts, created_at, updated_at, expires_at)
SELECT 'postgres', '', 'live-' || i, 'completed', '{"ok": true}', 1, now(), now(), now() + interval '1 day'
  FROM generate_series(1, 100000) i;
VACUUM ANALYZE;
CHECKPOINT;
SQL

cat >"$WORK/guarded.sql" <<'EOF2'
\set k random(1, 1000000000)
BEGIN;
SELECT outcome FROM idempotency.begin('req-' || :client_id || '-' || :k);
INSERT INTO payment VALUES ('req-' || :client_id || '-' || :k, 1);
SELECT idempotency.complete('req-' || :client_id || '-' || :k, '{"paid": true}');
END;
EOF2

stats() {	# pgbench log files, from_epoch_us, to_epoch_us -> "n avg p50 p99" in ms
	cat "$1".* | awk -v a="$2" -v b="$3" '{ t = $5 * 1000000 + $6; if (t >= a && t <= b) print $3 }' |
		sort -n | awk '{ v[NR] = $1; s += $1 } END {
			if (NR == 0) { print "0 - - -"; exit }
			printf "%d %.2f %.2f %.2f\n", NR, s / NR / 1000, v[int(NR * 0.5) + 1] / 1000, v[int(NR * 0.99) + 1] / 1000 }'
}
now_us() { date +%s%6N; }

echo "guarded requests alone (20 s) ..."
t0=$(now_us)
(cd "$WORK" && pgbench -n -M prepared -c "$CLIENTS" -j 2 -T 20 -l --log-prefix=alone -f guarded.sql >/dev/null 2>&1)
t1=$(now_us)
alone=$(stats "$WORK/alone" "$t0" "$t1")

# purge_run LABEL ROWS: purge($BATCH) until a batch comes back short while
# the guarded requests run; prints the rate and the latency during it
purge_run() {
	local label=$1 rows=$2 bench p0 p1 n purged=0 during secs rate
	echo "guarded requests while purge($BATCH) deletes $rows $label ..."
	(cd "$WORK" && pgbench -n -M prepared -c "$CLIENTS" -j 2 -T 900 -l --log-prefix="during-$3" -f guarded.sql >/dev/null 2>&1) &
	bench=$!
	sleep 2
	p0=$(now_us)
	while :; do
		n=$(psql -qXAt -c "SELECT idempotency.purge($BATCH)")
		purged=$((purged + n))
		[ "$n" -lt "$BATCH" ] && break
	done
	p1=$(now_us)
	kill -INT $bench 2>/dev/null; wait $bench 2>/dev/null
	during=$(stats "$WORK/during-$3" "$p0" "$p1")
	secs=$(awk -v a="$p0" -v b="$p1" 'BEGIN { printf "%.2f", (b - a) / 1000000 }')
	rate=$(awk -v n="$purged" -v a="$p0" -v b="$p1" 'BEGIN { printf "%.0f", n / ((b - a) / 1000000) }')
	RESULTS+=("$(printf '%-34s %9s in %7s s = %7s rows/s' "$label" "$purged" "$secs" "$rate")")
	LATENCY+=("$(printf '%-34s %8s %9s %9s %9s' "while purging $3" $during)")
}
RESULTS=() LATENCY=()

# 1. the plain key table
purge_run "expired keys, plain table" "$N" keys
left1=$(psql -qXAt -c "SELECT count(*) FROM idempotency.idempotency_key WHERE key LIKE 'expired-%'")

# 2. the key table hash-partitioned (the README's recipe), N expired keys again
recipe=$(sed -n '/^-- the recipe (README), in one transaction$/,/^COMMIT;$/p' sql/partitioned.sql)
[ -n "$recipe" ] || { echo "recipe not found in sql/partitioned.sql" >&2; exit 2; }
echo "partitioning the key table and loading $N expired keys ..."
psql -qX -c "$recipe" >/dev/null || exit 2
psql -qX <<SQL
INSERT INTO idempotency.idempotency_key (owner, scope, key, status, response, attempts, created_at, updated_at, expires_at)
SELECT 'postgres', '', 'expired-' || i, 'completed', '{"ok": true}', 1,
       now() - interval '2 days', now() - interval '2 days', now() - interval '1 day' + i * interval '1 ms'
  FROM generate_series(1, $N) i;
VACUUM ANALYZE;
CHECKPOINT;
SQL
purge_run "expired keys, hash-partitioned (4)" "$N" parted
left2=$(psql -qXAt -c "SELECT count(*) FROM idempotency.idempotency_key WHERE key LIKE 'expired-%'")

# 3. delivered outbox messages
echo "loading $M delivered outbox messages ..."
psql -qX <<SQL >/dev/null
SELECT idempotency.create_topic('bench', retention => '0');
INSERT INTO idempotency.outbox_message (id, topic_id, owner, message_id, payload, headers, state,
       attempts, available_at, published_at, published_by, delivered_at, expires_at)
SELECT nextval('idempotency.outbox_message_id_seq'), t.id, 'postgres', gen_random_uuid(),
       jsonb_build_object('order', i), '{}', 'delivered', 1, now() - interval '2 days',
       now() - interval '2 days', 'postgres', now() - interval '1 day', now() - interval '1 day' + i * interval '1 ms'
  FROM generate_series(1, $M) i, idempotency.outbox_topic t;
VACUUM ANALYZE;
CHECKPOINT;
SQL
purge_run "delivered outbox messages" "$M" messages
left3=$(psql -qXAt -c "SELECT count(*) FROM idempotency.outbox_message")
counted=$(psql -qXAt -c "SELECT delivered FROM idempotency.outbox_stats WHERE topic = 'bench'")

echo
echo "purge, batch $BATCH, $CLIENTS clients of guarded requests meanwhile:"
printf '%s\n' "${RESULTS[@]}"
echo "left: $left1 and $left2 expired keys, $left3 messages; outbox_stats counts $counted delivered"
printf '%-34s %8s %9s %9s %9s\n' "guarded request" requests "avg ms" "p50 ms" "p99 ms"
printf '%-34s %8s %9s %9s %9s\n' "alone" $alone
printf '%s\n' "${LATENCY[@]}"
