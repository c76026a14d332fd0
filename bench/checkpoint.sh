#!/usr/bin/env bash
# bench/checkpoint.sh — what a recovery point costs: instructions per
# idempotency.checkpoint(), counted by callgrind in a single-user backend
# (deterministic, like bench/instructions.sh), against a plain UPDATE of one
# row by primary key.
#
#   bash bench/checkpoint.sh [requests=2000]
#
# Each request is one transaction that records one phase's point and state
# for its own key (N keys, each begun with a lease beforehand):
#   update     UPDATE phase_row SET point, state WHERE key = $1  (an ordinary
#              table shaped like the recovery columns: the hand-written way)
#   keyupdate  the same UPDATE on idempotency.idempotency_key itself, by its
#              primary key, without any check (what checkpoint() writes)
#   checkpoint SELECT idempotency.checkpoint($1, 'charged', state, 1): the
#              attempt check (key lock, primary-key probe) and that UPDATE
# and prints the instructions per request of each and the differences.
set -u
cd "$(dirname "$0")/.." || exit 2
. test/cluster.sh
N=${1:-2000}
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
bench_start
psql -qX -v ON_ERROR_STOP=1 >/dev/null <<SQL || exit 2
CREATE EXTENSION idempotency;
CREATE TABLE phase_row (key text PRIMARY KEY, point text, state jsonb);
INSERT INTO phase_row SELECT 'u-' || i, NULL, NULL FROM generate_series(1, $N) i;
DO \$\$
BEGIN
  FOR i IN 1..$N LOOP
    PERFORM idempotency.begin('c-' || i, lease => '1 day');
    PERFORM idempotency.begin('k-' || i, lease => '1 day');
    COMMIT;
  END LOOP;
END \$\$;
VACUUM ANALYZE;
SQL
DATA=$CLUSTER_DIR/data
as_pg "$PG_BINDIR/pg_ctl" -D "$DATA" -w stop >/dev/null

STATE='{"charge": "ch_1234567890", "order": 42}'
PREPARES="PREPARE upd(text) AS UPDATE phase_row SET point = 'charged', state = '$STATE' WHERE key = \$1;
PREPARE kup(text) AS UPDATE idempotency.idempotency_key SET recovery_point = 'charged', recovery_state = '$STATE', updated_at = now() WHERE owner = 'postgres'::regrole AND scope = '' AND key = \$1;
PREPARE chk(text) AS SELECT idempotency.checkpoint(\$1, 'charged', '$STATE', 1);"

gen() {	# kind -> the prepares, then N requests (one transaction each)
	echo "$PREPARES"
	[ "$1" = empty ] && return
	for i in $(seq 1 "$N"); do
		case $1 in
			update) echo "BEGIN; EXECUTE upd('u-$i'); COMMIT;" ;;
			keyupdate) echo "BEGIN; EXECUTE kup('k-$i'); COMMIT;" ;;
			checkpoint) echo "BEGIN; EXECUTE chk('c-$i'); COMMIT;" ;;
		esac
	done
}
count() {	# kind -> instructions of the whole session
	local f="$WORK/$1.sql" out="$WORK/cg.$1"
	gen "$1" >"$f"
	chmod 644 "$f"
	as_pg valgrind --tool=callgrind --callgrind-out-file="$out" \
		"$PG_BINDIR/postgres" --single -D "$DATA" postgres <"$f" >"$WORK/$1.out" 2>&1
	grep -q ERROR "$WORK/$1.out" && { echo "errors in $1:" >&2; grep -m3 ERROR "$WORK/$1.out" >&2; }
	awk '/^summary:|^totals:/ { print $2; exit }' "$out"
}
empty=$(count empty)
KINDS="update keyupdate checkpoint"
for k in $KINDS; do
	eval "ins_$k=\$(( ( \$(count $k) - empty ) / N ))"
done
printf '%-11s %14s\n' request "instructions"
for k in $KINDS; do eval "printf '%-11s %14d\n' $k \$ins_$k"; done
echo "checkpoint - update:    $((ins_checkpoint - ins_update)) instructions per request"
echo "checkpoint - keyupdate: $((ins_checkpoint - ins_keyupdate)) instructions per request (the attempt check and the function call)"
echo "checkpoint / update:    $(awk "BEGIN { printf \"%.2f\", $ins_checkpoint / $ins_update }")"
echo "($N requests each, postgres --single under callgrind, $(psql --version | awk '{ print $3 }'))"
