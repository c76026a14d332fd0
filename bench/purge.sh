#!/usr/bin/env bash
# bench/purge.sh — purge throughput on N expired keys, and the latency of a
# guarded request (BEGIN; begin(); complete(); COMMIT on a new key) with and
# without a purge running, in one run on one throwaway cluster (fsync on).
#
#   bash bench/purge.sh [expired_keys=1000000] [clients=4] [batch=10000]
#
# Prints: rows/s of the purge, and avg/p50/p99 latency of the guarded
# request alone and while the purge runs (pgbench -M prepared, per-request
# log filtered to the purge window).
set -u
cd "$(dirname "$0")/.." || exit 2
. test/cluster.sh
N=${1:-1000000} CLIENTS=${2:-4} BATCH=${3:-10000}
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

echo "guarded requests while purge($BATCH) deletes $N expired keys ..."
(cd "$WORK" && pgbench -n -M prepared -c "$CLIENTS" -j 2 -T 600 -l --log-prefix=during -f guarded.sql >/dev/null 2>&1) &
bench=$!
sleep 2
p0=$(now_us)
purged=0
while :; do
	n=$(psql -qXAt -c "SELECT idempotency.purge($BATCH)")
	purged=$((purged + n))
	[ "$n" -lt "$BATCH" ] && break
done
p1=$(now_us)
kill -INT $bench 2>/dev/null; wait $bench 2>/dev/null
during=$(stats "$WORK/during" "$p0" "$p1")
left=$(psql -qXAt -c "SELECT count(*) FROM idempotency.idempotency_key WHERE key LIKE 'expired-%'")

secs=$(awk -v a="$p0" -v b="$p1" 'BEGIN { printf "%.2f", (b - a) / 1000000 }')
rate=$(awk -v n="$purged" -v a="$p0" -v b="$p1" 'BEGIN { printf "%.0f", n / ((b - a) / 1000000) }')
echo
echo "purge: $purged expired keys in $secs s = $rate rows/s (batch $BATCH, $CLIENTS clients of load; $left left)"
printf '%-28s %8s %9s %9s %9s\n' "guarded request" requests "avg ms" "p50 ms" "p99 ms"
printf '%-28s %8s %9s %9s %9s\n' "alone" $alone
printf '%-28s %8s %9s %9s %9s\n' "while purge runs" $during
