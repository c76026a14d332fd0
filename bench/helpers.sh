#!/usr/bin/env bash
# bench/helpers.sh — each write helper against the hand-written SQL it
# replaces, pgbench -M prepared, interleaved rounds on one throwaway cluster.
#
#   bash bench/helpers.sh [seconds=10] [clients=4] [rounds=2]
#
# Each pair does the same work per transaction:
#   transition:  flip a random order between pending and paid
#                helper:  transition(orders, id, to, 'order')
#                by hand: UPDATE orders SET status = to WHERE id = $1 AND status = from
#   versioned:   read a random item's version, then decrement its stock
#                helper:  update_versioned(item, id, v, {"qty": ...})
#                by hand: UPDATE item SET qty = qty - 1, version = version + 1
#                         WHERE id = $1 AND version = $2 RETURNING version
#   insert_once: insert a random request id (mostly new, some duplicates)
#                helper:  insert_once(purchase, row, '{request_id}')
#                by hand: WITH ins AS (INSERT ... ON CONFLICT DO NOTHING RETURNING *)
#                         SELECT * FROM ins UNION ALL SELECT ... WHERE request_id = $1
# The hand-written statements also run with -M simple (parsed and planned on
# every call): the difference is what keeping a prepared plan saves.
set -u
cd "$(dirname "$0")/.." || exit 2
. test/cluster.sh
SECS=${1:-10} CLIENTS=${2:-4} ROUNDS=${3:-2}
bench_start "shared_buffers = '512MB'"

psql -qX <<'SQL'
CREATE EXTENSION idempotency;
SELECT idempotency.create_machine('order', '{"pending": ["paid"], "paid": ["pending"]}');
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL DEFAULT 'pending');
INSERT INTO orders SELECT i FROM generate_series(1, 100000) i;
CREATE TABLE item (id int PRIMARY KEY, qty int NOT NULL, version bigint NOT NULL DEFAULT 1);
INSERT INTO item SELECT i, 1000000 FROM generate_series(1, 100000) i;
CREATE TABLE purchase (id bigserial PRIMARY KEY, request_id text NOT NULL UNIQUE,
                       amount int NOT NULL, status text NOT NULL DEFAULT 'new');
VACUUM ANALYZE;
SQL

cat >"$WORK/transition_helper.sql" <<'S'
\set id random(1, 100000)
\set paid random(0, 1)
\if :paid
SELECT idempotency.transition('orders', :id::int, 'paid', 'order');
\else
SELECT idempotency.transition('orders', :id::int, 'pending', 'order');
\endif
S
cat >"$WORK/transition_sql.sql" <<'S'
\set id random(1, 100000)
\set paid random(0, 1)
\if :paid
UPDATE orders SET status = 'paid' WHERE id = :id AND status = 'pending';
\else
UPDATE orders SET status = 'pending' WHERE id = :id AND status = 'paid';
\endif
S
cat >"$WORK/versioned_helper.sql" <<'S'
\set id random(1, 100000)
BEGIN;
SELECT version AS v, qty AS q FROM item WHERE id = :id \gset
SELECT idempotency.update_versioned('item', :id::int, :v::bigint, jsonb_build_object('qty', :q::int - 1));
END;
S
cat >"$WORK/versioned_sql.sql" <<'S'
\set id random(1, 100000)
BEGIN;
SELECT version AS v, qty AS q FROM item WHERE id = :id \gset
UPDATE item SET qty = :q::int - 1, version = version + 1 WHERE id = :id AND version = :v RETURNING version;
END;
S
cat >"$WORK/insert_helper.sql" <<'S'
\set r random(1, 2000000)
SELECT inserted, "row" FROM idempotency.insert_once('purchase',
  jsonb_build_object('request_id', 'req-' || :r::int, 'amount', 10), '{request_id}');
S
cat >"$WORK/insert_sql.sql" <<'S'
\set r random(1, 2000000)
WITH ins AS (INSERT INTO purchase (request_id, amount) VALUES ('req-' || :r::int, 10)
             ON CONFLICT (request_id) DO NOTHING RETURNING *)
SELECT true, to_jsonb(ins.*) FROM ins
UNION ALL
SELECT false, to_jsonb(p.*) FROM purchase p WHERE p.request_id = 'req-' || :r::int
LIMIT 1;
S

tps() {	# script mode -> tps
	pgbench -n -M "$2" -c "$CLIENTS" -j 2 -T "$SECS" -f "$WORK/$1.sql" 2>/dev/null |
		awk '/^tps/ { printf "%.0f", $3 }'
}
declare -A sum
for round in $(seq 1 "$ROUNDS"); do
	for pair in transition versioned insert; do
		for side in helper sql; do
			t=$(tps "${pair}_$side" prepared)
			sum[${pair}_$side]=$(( ${sum[${pair}_$side]:-0} + t ))
			echo "round $round $pair $side (prepared): $t tps"
		done
		t=$(tps "${pair}_sql" simple)
		sum[${pair}_simple]=$(( ${sum[${pair}_simple]:-0} + t ))
		echo "round $round $pair sql (simple): $t tps"
	done
done
echo
printf '%-12s %12s %12s %8s %14s\n' helper "helper tps" "by hand tps" ratio "by hand, -M simple"
for pair in transition versioned insert; do
	h=$(( ${sum[${pair}_helper]} / ROUNDS )) s=$(( ${sum[${pair}_sql]} / ROUNDS )) m=$(( ${sum[${pair}_simple]} / ROUNDS ))
	printf '%-12s %12d %12d %8s %14d\n' "$pair" "$h" "$s" "$(awk -v a="$h" -v b="$s" 'BEGIN { printf "%.2f", a / b }')" "$m"
done
echo "($CLIENTS clients, $SECS s per run, $ROUNDS interleaved rounds, fsync on, $(nproc) cores)"
