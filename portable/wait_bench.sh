#!/usr/bin/env bash
# portable/wait_bench.sh — what the portable wait_for() (polling) and
# publish() cost: the time from a publisher's commit to the waiter's return,
# the cost of one look, and publish() per message.  A measurement, not a
# timed test.
#
#   PG_CONFIG=$(bash portable/server.sh) bash portable/wait_bench.sh [WAITS]
#
# On a throwaway cluster (test/cluster.sh) of a PostgreSQL without the C
# library, the portable script installed by the superuser.  Latency: a
# waiter runs wait_for('{lat}', '10 s', cursor); a publisher commits after a
# random delay of 0.1 to 0.9 s; both take clock_timestamp() (the waiter at
# its return, the publisher right after its commit).  One look:
# wait_for(..., '0', cursor) 1,000 times, with nothing in the topic, then
# with 1,000 ready messages of a key whose head is claimed (every ready row
# is read for its xmin).  publish(): 10,000 in one statement, unkeyed, each
# of a new key, and unkeyed without the foreign key from outbox_message to
# outbox_topic.
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
WAITS=${1:-20}
version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$top/idempotency.control")
script=$here/build/idempotency--$version.sql
PG_CONFIG=${PG_CONFIG:-pg_config}
if [ -e "$("$PG_CONFIG" --pkglibdir)/idempotency.so" ]; then
	echo "wait_bench.sh: $("$PG_CONFIG" --pkglibdir) has the C library; use a PostgreSQL without it" >&2
	exit 2
fi
perl "$here/build.pl" "$top/idempotency--$version.sql" "$here/src" >"$script" 2>/dev/null || exit 1
. "$top/test/cluster.sh"
trap cluster_stop EXIT
cluster_start >/dev/null || exit 1
q() { "$PG_BINDIR/psql" -X -q -At -v ON_ERROR_STOP=1 "$@"; }
q -f "$script" >/dev/null || exit 1
q -c "SELECT idempotency.create_topic('lat')" >/dev/null

lat=$(mktemp)
for i in $(seq 1 "$WAITS"); do
	c=$(q -c "SELECT cursor FROM idempotency.wait_for('{lat}', '0')")
	q -c "SELECT extract(epoch FROM clock_timestamp()) FROM idempotency.wait_for('{lat}', '10 s', '$c')" >"$lat.w" &
	sleep "0.$((RANDOM % 9 + 1))"
	t=$(q -c "SELECT idempotency.publish('lat', '{}')" -c "SELECT extract(epoch FROM clock_timestamp())" | tail -1)
	wait
	awk -v t="$t" '{ printf "%.1f\n", ($1 - t) * 1000 }' "$lat.w" >>"$lat"
	q -c "SELECT count(idempotency.ack(claim, ARRAY[id])) FROM idempotency.claim('lat', 100)" >/dev/null
done
sort -n "$lat" | awk '{ a[NR] = $1 } END { printf "commit to wake-up, ms over %d waits: min %.1f, median %.1f, max %.1f\n", NR, a[1], a[int((NR + 1) / 2)], a[NR] }'
rm -f "$lat" "$lat.w"

look() {
	local c
	c=$(q -c "SELECT cursor FROM idempotency.wait_for('{lat}', '0')")
	q -c '\timing on' -c "DO \$\$ BEGIN FOR i IN 1..1000 LOOP PERFORM idempotency.wait_for('{lat}', '0', '$c'); END LOOP; END \$\$" |
		sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | awk -v what="$1" '{ printf "one look, %s: %.2f ms\n", what, $1 / 1000 }'
}
look "nothing in the topic"
q -c "SELECT count(idempotency.publish('lat', '{}', 'hot')) FROM generate_series(1, 1000)" >/dev/null
q -c "SELECT count(*) FROM idempotency.claim('lat', 1)" >/dev/null
look "1,000 ready messages behind a claimed head"

pub() {
	q -c "$2" >/dev/null
	q -c '\timing on' -c "$2" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' |
		awk -v what="$1" '{ printf "publish(), %s: %.0f us per message\n", what, $1 * 1000 / 10000 }'
}
q -c "SELECT idempotency.create_topic('pub')" >/dev/null
pub "unkeyed" "SELECT count(idempotency.publish('pub', '{}')) FROM generate_series(1, 10000)"
pub "each of a new key" "SELECT count(idempotency.publish('pub', '{}', pg_catalog.gen_random_uuid()::text)) FROM generate_series(1, 10000)"
q -c "ALTER TABLE idempotency.outbox_message DROP CONSTRAINT outbox_message_topic_fkey" >/dev/null
pub "unkeyed, without the foreign key" "SELECT count(idempotency.publish('pub', '{}')) FROM generate_series(1, 10000)"
