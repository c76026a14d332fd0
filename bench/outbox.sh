#!/usr/bin/env bash
# bench/outbox.sh — the outbox, side by side in one run on one
# throwaway cluster, each pair interleaved:
#
#   (a) publish() inside once(), with its wake-up (a relay blocked in
#       wait_for() on the topic, or nobody waiting), against once() + the
#       same message row stored by a plain INSERT with no wake-up at all
#       (the floor), against once() alone, and a topic with notify => true:
#       tps at OUTBOX_A_CLIENTS (1 4 16) clients, pgbench -M prepared,
#       OUTBOX_ROUNDS rounds interleaved, median and spread (min-max); and
#       (OUTBOX_CALLGRIND=1) instructions per request (callgrind, postgres
#       --single, as bench/instructions.sh)
#   (b) relay throughput, claim + ack of a batch in one statement, batch 1,
#       10, 100, with 1 and 4 relays (pgbench clients; OUTBOX_B_RELAYS), against pgmq 1.5.1
#       read + delete of the same batches (messages per second; unkeyed
#       messages, and ours also with 1000 message keys)
#   (bi) the same claim + ack / read + delete, counted instead of timed:
#       instructions and CPU time per delivered message, summed over the
#       backends of a fixed number of transactions (perf stat on the
#       postmaster, whose children inherit the counters), less the cost of
#       the clients' connections; and at batch 1 the WAL flushes per
#       message (pg_stat_wal.wal_sync, their time with track_wal_io_timing)
#       and pg_test_fsync's flush rate: numbers the machine's load does not
#       move (OUTBOX_BI_MSGS messages per point at batch 10 and 100, a
#       tenth of them at batch 1, where every message is a commit)
#   (bc) instructions per delivered message, one relay, under callgrind in
#       postgres --single (where perf has no hardware counter)
#   (c) commit-to-handler latency p50/p99: our Node relay blocked in
#       wait_for() (woken through shared memory), against a pgmq reader
#       polling every 100 ms
#   (d) WAL bytes and dead row versions per delivered message, ours
#       (publish, claim + ack of 10, purge) against pgmq's (send, read + delete
#       of 10), one message per transaction, after a CHECKPOINT
#   (e) OUTBOX_TOTAL (1 M) messages through one topic with retention 0,
#       published, relayed and purged by the purge worker concurrently:
#       table size and dead tuples along the way
#
# pgmq comes from ../shared/vendor/pgmq-1.5.1.tar.gz (or OUTBOX_PGMQ_TAR),
# built and installed into pg_config's prefix when missing; never committed.
# Environment: OUTBOX_SECS (5), OUTBOX_ROUNDS (3; OUTBOX_B_ROUNDS (1) for b), OUTBOX_CLIENTS (4),
# OUTBOX_N (2000 callgrind requests), OUTBOX_TOTAL (1000000),
# OUTBOX_PARTS ("a b bi bc c d e"), OUTBOX_B_BATCHES ("1 10 100"), OUTBOX_B_RATE (8000),
# OUTBOX_B_MAX (200000 messages at most per queue in b), OUTBOX_B_RELAYS ("1 4"),
# OUTBOX_BI_MSGS (20000), OUTBOX_A_CLIENTS ("1 4 16"), OUTBOX_CALLGRIND (0),
# OUTBOX_WAL_N (5000), OUTBOX_E_VACUUM_AFTER (for (e); unset: the default of
# idempotency.outbox_vacuum_after; 0: autovacuum alone), OUTBOX_CONF (one more
# postgresql.conf line, e.g. "idempotency.outbox_count_deltas = 16").  Prints a Markdown report (and appends it to
# OUTBOX_REPORT when set).
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
. test/cluster.sh
SECS=${OUTBOX_SECS:-5}
ROUNDS=${OUTBOX_ROUNDS:-3}
B_ROUNDS=${OUTBOX_B_ROUNDS:-1}
CLIENTS=${OUTBOX_CLIENTS:-4}
N=${OUTBOX_N:-2000}
TOTAL=${OUTBOX_TOTAL:-1000000}
PARTS=${OUTBOX_PARTS:-a b bi bc c d e}
B_BATCHES=${OUTBOX_B_BATCHES:-1 10 100}
B_RATE=${OUTBOX_B_RATE:-8000}	# (b) fills batch x B_RATE x OUTBOX_SECS messages (at most B_MAX)
B_MAX=${OUTBOX_B_MAX:-200000}
B_RELAYS=${OUTBOX_B_RELAYS:-1 4}
BI_MSGS=${OUTBOX_BI_MSGS:-20000}
A_CLIENTS=${OUTBOX_A_CLIENTS:-1 4 16}
CALLGRIND=${OUTBOX_CALLGRIND:-0}
WAL_N=${OUTBOX_WAL_N:-5000}
PGMQ_TAR=${OUTBOX_PGMQ_TAR:-$ROOT/../shared/vendor/pgmq-1.5.1.tar.gz}
[ -f "$PGMQ_TAR" ] || PGMQ_TAR=/work/shared/vendor/pgmq-1.5.1.tar.gz

# pgmq into this server's prefix
if [ ! -f "$(pg_config --sharedir)/extension/pgmq--1.5.1.sql" ]; then
	T=$(mktemp -d)
	tar xzf "$PGMQ_TAR" -C "$T" && make -s -C "$T"/pgmq-1.5.1 >/dev/null 2>&1 &&
		make -s -C "$T"/pgmq-1.5.1 install >/dev/null 2>&1 ||
		{ echo "pgmq 1.5.1 did not build from $PGMQ_TAR" >&2; exit 2; }
	rm -rf "$T"
fi
[ "$CALLGRIND" = 1 ] && ! command -v valgrind >/dev/null &&
	{ apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }

bench_start "shared_preload_libraries = 'idempotency'" "idempotency.purge_interval = 1" \
	"idempotency.purge_batch = 10000" "max_connections = 100" ${OUTBOX_CONF:+"$OUTBOX_CONF"}
R=$WORK/report.md
echo "## The outbox (bench/outbox.sh, $(date -u +%F), $(nproc) cores, $(psql --version | awk '{print $3}'))" >"$R"
echo >>"$R"
echo "Load at the start: $(uptime | sed 's/.*load average/load average/') (the machine is shared: other jobs may run beside the bench)." >>"$R"
psql -qX -v ON_ERROR_STOP=1 >/dev/null <<'SQL' || exit 2
CREATE EXTENSION idempotency;
CREATE EXTENSION pgmq;
CREATE TABLE payment (id bigserial PRIMARY KEY, key text NOT NULL, amount int NOT NULL);
SELECT idempotency.create_topic('bench');
SELECT idempotency.create_topic('relay');
SELECT idempotency.create_topic('keyed');
SELECT idempotency.create_topic('million', retention => '0 s');
SELECT idempotency.create_topic('latency');
SELECT idempotency.create_topic('quiet', notify => false);
SELECT idempotency.create_topic('loud', notify => true);
SELECT idempotency.create_topic('walt', retention => '0 s');
-- the floor of (a): a plain table shaped like outbox_message, same indexes
CREATE TABLE floor_message (LIKE idempotency.outbox_message INCLUDING DEFAULTS INCLUDING INDEXES);
CREATE SEQUENCE floor_message_id_seq;
SELECT pgmq.create('relay');
SELECT pgmq.create('latency');
SELECT pgmq.create('walq');
SQL
median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
tps() { awk '/^tps = / { printf "%d", $3 }' "$1"; }

# ---------------------------------------------------------------------------
part_a() {
	echo "### (a) publish() inside once() with its wake-up, against the same row stored with none, and once() alone" >>"$R"
	cat >"$WORK/once.sql" <<'S'
\set k random(1, 1000000000)
SELECT outcome FROM idempotency.once('o' || :client_id || '-' || :k, NULL,
  'INSERT INTO payment (key, amount) VALUES ($1, $2) RETURNING id', 'o' || :client_id || '-' || :k, 10);
S
	cat >"$WORK/publish.sql" <<'S'
\set k random(1, 1000000000)
SELECT outcome FROM idempotency.once('p' || :client_id || '-' || :k, NULL,
  'WITH p AS (INSERT INTO payment (key, amount) VALUES ($1, $2) RETURNING id)
   SELECT idempotency.publish(''bench'', jsonb_build_object(''payment'', p.id), $1) FROM p',
  'p' || :client_id || '-' || :k, 10);
S
	cat >"$WORK/publish_loud.sql" <<'S'
\set k random(1, 1000000000)
SELECT outcome FROM idempotency.once('l' || :client_id || '-' || :k, NULL,
  'WITH p AS (INSERT INTO payment (key, amount) VALUES ($1, $2) RETURNING id)
   SELECT idempotency.publish(''loud'', jsonb_build_object(''payment'', p.id), $1) FROM p',
  'l' || :client_id || '-' || :k, 10);
S
	# the floor: the same row, stored by a plain INSERT (no topic, no lock, no wake-up)
	cat >"$WORK/floor.sql" <<'S'
\set k random(1, 1000000000)
SELECT outcome FROM idempotency.once('f' || :client_id || '-' || :k, NULL,
  'WITH p AS (INSERT INTO payment (key, amount) VALUES ($1, $2) RETURNING id)
   INSERT INTO floor_message (id, topic_id, owner, message_id, message_key, payload, headers, state, available_at, published_at, published_by)
   SELECT nextval(''floor_message_id_seq''), 1, current_user::regrole, gen_random_uuid(), $1, jsonb_build_object(''payment'', p.id), ''{}'', ''pending'', now(), now(), current_user::regrole FROM p RETURNING id',
  'f' || :client_id || '-' || :k, 10);
S
	# a relay blocked in wait_for() on topic bench, woken by every commit
	{
		echo "SELECT cursor AS c FROM idempotency.wait_for('{bench}', '0') \\gset"
		for i in $(seq 200000); do
			echo "SELECT cursor AS c FROM idempotency.wait_for('{bench}', '10 s', :'c') \\gset"
		done
	} >"$WORK/waiter.sql"
	local r s c waiter
	: >"$WORK/a.dat"
	for c in $A_CLIENTS; do
		for r in $(seq "$ROUNDS"); do
			for s in once floor publish wake publish_loud; do
				waiter=
				if [ $s = wake ]; then
					psql -qX -f "$WORK/waiter.sql" >/dev/null 2>&1 &
					waiter=$!
					sleep 0.3
				fi
				pgbench -n -M prepared -c "$c" -j "$c" -T "$SECS" -f "$WORK/${s/wake/publish}.sql" >"$WORK/a.out" 2>&1
				[ -n "$waiter" ] && { kill "$waiter"; wait "$waiter" 2>/dev/null; }
				echo "$c $r $s $(tps "$WORK/a.out")" >>"$WORK/a.dat"
			done
			psql -qX -c "DELETE FROM idempotency.outbox_message" -c "TRUNCATE floor_message" \
				-c "VACUUM idempotency.outbox_message" >/dev/null
		done
	done
	{
		echo
		echo "| clients | once() alone | floor: + the row, plain INSERT | + publish(), nobody waiting | + publish(), a relay in wait_for() | + publish(), notify => true | wake-up / floor | wake-up / once() | notify / floor |"
		echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
		for c in $A_CLIENTS; do
			local cell=() med=() v
			for s in once floor publish wake publish_loud; do
				v=$(awk -v c=$c -v s=$s '$1 == c && $3 == s { print $4 }' "$WORK/a.dat")
				med+=("$(echo "$v" | median)")
				cell+=("$(echo "$v" | median) ($(echo "$v" | sort -n | head -1)-$(echo "$v" | sort -n | tail -1))")
			done
			awk -v c=$c -v a="${cell[0]}" -v b="${cell[1]}" -v p="${cell[2]}" -v w="${cell[3]}" -v l="${cell[4]}" \
				-v o=${med[0]} -v f=${med[1]} -v wk=${med[3]} -v lo=${med[4]} \
				'BEGIN { printf "| %d | %s | %s | %s | %s | %s | %.2f | %.2f | %.2f |\n", c, a, b, p, w, l, wk / f, wk / o, lo / f }'
		done
		echo
		echo "tps, median of $ROUNDS interleaved rounds (min-max), pgbench -M prepared, ${SECS} s per run, fsync on; each request one autocommit statement (once() inserting a payment, and the message in the same statement: keyed publish(), or for the floor a plain INSERT of the same row into a table shaped like outbox_message with its indexes). \"a relay in wait_for()\": one psql session loops on wait_for() with its cursor, so every commit wakes it (and it takes CPU on this machine). Target: wake-up / floor ≥ 0.9."
	} >>"$R"
	[ "$CALLGRIND" = 1 ] || return 0
	local t_once t_pub t_quiet
	t_once=$(awk '$1 == 4 && $3 == "once" { print $4 }' "$WORK/a.dat" | median)
	t_pub=$(awk '$1 == 4 && $3 == "wake" { print $4 }' "$WORK/a.dat" | median)
	t_quiet=$(awk '$1 == 4 && $3 == "publish" { print $4 }' "$WORK/a.dat" | median)

	# instructions: postgres --single under callgrind
	local DATA=$CLUSTER_DIR/data
	psql -qX -c "CHECKPOINT" >/dev/null
	as_pg "$PG_BINDIR/pg_ctl" -D "$DATA" -w stop >/dev/null
	local P="PREPARE onc(text) AS SELECT outcome FROM idempotency.once(\$1, NULL, 'INSERT INTO payment (key, amount) VALUES (\$1, \$2) RETURNING id', \$1, 10);
PREPARE onp(text) AS SELECT outcome FROM idempotency.once(\$1, NULL, 'WITH p AS (INSERT INTO payment (key, amount) VALUES (\$1, \$2) RETURNING id) SELECT idempotency.publish(''bench'', jsonb_build_object(''payment'', p.id), \$1) FROM p', \$1, 10);
PREPARE onw(text) AS SELECT outcome FROM idempotency.once(\$1, NULL, 'WITH p AS (INSERT INTO payment (key, amount) VALUES (\$1, \$2) RETURNING id) SELECT idempotency.publish(''bench'', jsonb_build_object(''payment'', p.id), \$1) FROM p', \$1, 10);
PREPARE onn(text) AS SELECT outcome FROM idempotency.once(\$1, NULL, 'WITH p AS (INSERT INTO payment (key, amount) VALUES (\$1, \$2) RETURNING id) SELECT idempotency.publish(''bench'', jsonb_build_object(''payment'', p.id)) FROM p', \$1, 10);
PREPARE onf(text) AS SELECT outcome FROM idempotency.once(\$1, NULL, 'WITH p AS (INSERT INTO payment (key, amount) VALUES (\$1, \$2) RETURNING id) INSERT INTO floor_message (id, topic_id, owner, message_id, message_key, payload, headers, state, available_at, published_at, published_by) SELECT nextval(''floor_message_id_seq''), 1, current_user::regrole, gen_random_uuid(), \$1, jsonb_build_object(''payment'', p.id), ''{}'', ''pending'', now(), now(), current_user::regrole FROM p RETURNING id', \$1, 10);"
	count() {	# kind -> instructions of the whole session
		local f="$WORK/cg-$1.sql" i
		{
			echo "$P"
			# a waiter's entry for topic bench (onw: each commit adds to its
			# count) or for another topic (the others: the same one-time cost)
			if [ "$1" = onw ]; then echo "SELECT * FROM idempotency.wait_for('{bench}', '0');"
			else echo "SELECT * FROM idempotency.wait_for('{quiet}', '0');"; fi
			# warm-up: plans prepared and kept, caches filled
			for i in $(seq 1 50); do [ "$1" != empty ] && echo "EXECUTE $1('w-$1-$i');"; done
			[ "$1" = empty ] || for i in $(seq 1 "$N"); do echo "EXECUTE $1('$1-$i');"; done
		} >"$f"
		chmod 644 "$f"
		as_pg valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.$1" \
			"$PG_BINDIR/postgres" --single -D "$DATA" postgres <"$f" >/dev/null 2>&1
		[ -n "${OUTBOX_KEEP:-}" ] && cp "$WORK/cg.$1" "$OUTBOX_KEEP/"
		awk '/^summary:|^totals:/ { print $2; exit }' "$WORK/cg.$1"
	}
	local empty i_once i_pub i_wake i_nokey i_floor
	empty=$(count empty)
	i_once=$(count onc); i_pub=$(count onp); i_wake=$(count onw); i_nokey=$(count onn); i_floor=$(count onf)
	# the 50 warm-up requests are counted too; subtract them as average requests
	i_once=$(( (i_once - empty) / (N + 50) ))
	i_pub=$(( (i_pub - empty) / (N + 50) ))
	i_wake=$(( (i_wake - empty) / (N + 50) ))
	i_nokey=$(( (i_nokey - empty) / (N + 50) ))
	i_floor=$(( (i_floor - empty) / (N + 50) ))
	as_pg "$PG_BINDIR/pg_ctl" -D "$DATA" -l "$CLUSTER_DIR/server.log" -w start >/dev/null
	{
		echo
		echo "| request (one autocommit statement) | instructions | vs once() | tps (4 clients, median of $ROUNDS) | vs once() |"
		echo "|---|---:|---:|---:|---:|"
		echo "| once(): insert a payment | $i_once | 1.00 | $t_once | 1.00 |"
		awk -v i="$i_wake" -v b="$i_once" -v t="$t_pub" -v tb="$t_once" 'BEGIN { printf "| once() + publish(keyed) in the same statement, the topic waited on (its count at commit) | %d | %.2f | %d | %.2f |\n", i, i / b, t, t / tb }'
		awk -v i="$i_pub" -v b="$i_once" -v t="$t_quiet" -v tb="$t_once" 'BEGIN { printf "| once() + publish(keyed), nobody ever waited on the topic | %d | %.2f | %d | %.2f |\n", i, i / b, t, t / tb }'
		awk -v i="$i_nokey" -v b="$i_once" 'BEGIN { printf "| once() + publish(no key) in the same statement | %d | %.2f | | |\n", i, i / b }'
		awk -v i="$i_floor" -v b="$i_once" 'BEGIN { printf "| floor: once() + a plain INSERT of the same row into a table with the same indexes | %d | %.2f | | |\n", i, i / b }'
		echo
		echo "Instructions: $N requests each (after 50 warm-up requests) in \`postgres --single\` under callgrind; target ≤ 1.15. tps: pgbench -M prepared, ${SECS} s per run, fsync on."
	} >>"$R"
}

# ---------------------------------------------------------------------------
fill_ours() {	# topic count keys(0 = none)
	psql -qX -c "SELECT count(idempotency.publish('$1', jsonb_build_object('n', i, 'pad', repeat('x', 100)),
	                     CASE WHEN $3 > 0 THEN 'k' || (i % $3) END))
	             FROM generate_series(1, $2) i" >/dev/null
}
fill_pgmq() {	# queue count
	psql -qX -c "SELECT count(*) FROM pgmq.send_batch('$1',
	               ARRAY(SELECT jsonb_build_object('n', i, 'pad', repeat('x', 100)) FROM generate_series(1, $2) i))" >/dev/null
}
part_b() {
	echo >>"$R"
	echo "### (b) relay throughput: claim + ack against pgmq read + delete (messages/s)" >>"$R"
	echo 'SELECT count(*) FROM (SELECT idempotency.ack(c.claim, array_agg(c.id)) FROM idempotency.claim(:topic, :batch) c GROUP BY c.claim) a;' >"$WORK/ours.sql"
	echo "SELECT pgmq.delete('relay', ARRAY(SELECT msg_id FROM pgmq.read('relay', 30, :batch)));" >"$WORK/pgmq.sql"
	local b c r sys
	: >"$WORK/b.dat"
	for r in $(seq "$B_ROUNDS"); do
		for b in $B_BATCHES; do
			for c in $B_RELAYS; do
				local need=$(( b * B_RATE * SECS ))
				[ $need -gt $B_MAX ] && need=$B_MAX
				for sys in ours keyed pgmq; do
					psql -qX -c "DELETE FROM idempotency.outbox_message" -c "DELETE FROM pgmq.q_relay" >/dev/null
					psql -qX -c "VACUUM ANALYZE idempotency.outbox_message" -c "VACUUM ANALYZE pgmq.q_relay" >/dev/null
					case $sys in
						ours) fill_ours relay $need 0 ;;
						keyed) fill_ours keyed $need 1000 ;;
						pgmq) fill_pgmq relay $need ;;
					esac
					psql -qX -c "VACUUM ANALYZE idempotency.outbox_message" -c "VACUUM ANALYZE pgmq.q_relay" >/dev/null
					local f=$WORK/ours.sql topic=relay
					[ $sys = pgmq ] && f=$WORK/pgmq.sql
					[ $sys = keyed ] && topic=keyed
					local before after
					before=$(psql -qXAt -c "SELECT (SELECT count(*) FROM idempotency.outbox_message WHERE state = 'pending') + (SELECT count(*) FROM pgmq.q_relay)")
					pgbench -n -M prepared -c $c -j $c -T "$SECS" -D batch=$b -D topic=$topic -f "$f" >"$WORK/b.out" 2>&1
					after=$(psql -qXAt -c "SELECT (SELECT count(*) FROM idempotency.outbox_message WHERE state = 'pending') + (SELECT count(*) FROM pgmq.q_relay)")
					[ "$after" -eq 0 ] && { echo "# warning: $sys batch $b x$c ran dry" >&2; echo "$sys batch $b x$c (round $r)" >>"$WORK/b.dry"; }
					echo "$r $sys $b $c $(( (before - after) / SECS ))" >>"$WORK/b.dat"
				done
			done
		done
	done
	{
		echo
		echo "| batch | relays | ours | ours, 1000 keys | pgmq 1.5.1 | ours / pgmq |"
		echo "|---:|---:|---:|---:|---:|---:|"
		for b in $B_BATCHES; do
			for c in $B_RELAYS; do
				local o k p
				o=$(awk -v b=$b -v c=$c '$2 == "ours" && $3 == b && $4 == c { print $5 }' "$WORK/b.dat" | median)
				k=$(awk -v b=$b -v c=$c '$2 == "keyed" && $3 == b && $4 == c { print $5 }' "$WORK/b.dat" | median)
				p=$(awk -v b=$b -v c=$c '$2 == "pgmq" && $3 == b && $4 == c { print $5 }' "$WORK/b.dat" | median)
				awk -v b=$b -v c=$c -v o=$o -v k=$k -v p=$p 'BEGIN { printf "| %d | %d | %d | %d | %d | %.2f |\n", b, c, o, k, p, o / p }'
			done
		done
		echo
		echo "One statement per batch (claim and ack, or read and delete, in one transaction), pgbench -M prepared, ${SECS} s, median of $B_ROUNDS rounds, each from a freshly filled and vacuumed queue of batch × $B_RATE × ${SECS} messages, at most $B_MAX, with a 100-byte pad; target ours / pgmq ≥ 1.5."
		[ -s "$WORK/b.dry" ] && echo "Ran dry (the queue emptied before the ${SECS} s were up, so the rate is a lower bound): $(paste -sd ';' "$WORK/b.dry" | sed 's/;/; /g')." 
	} >>"$R"
}

# ---------------------------------------------------------------------------
part_bi() {
	echo >>"$R"
	echo "### (b), counted: instructions and CPU time per delivered message; WAL flushes at batch 1" >>"$R"
	command -v perf >/dev/null || { apt-get update -qq && apt-get install -y -qq linux-perf >/dev/null; }
	if ! perf stat -e task-clock -x, true >/dev/null 2>&1; then
		echo >>"$R"
		echo "(not measured: perf does not run here)" >>"$R"
		return 0
	fi
	# instructions need a hardware counter (a virtual machine may have none:
	# then the column stays empty, and part bc counts them under callgrind)
	local hw=instructions,
	perf stat -e instructions -x, true 2>&1 | grep -q "not supported" && hw=
	local pm b c sys f topic need t got before after i0 i1 ms
	pm=$(head -1 "$CLUSTER_DIR/data/postmaster.pid")
	# nothing forked by the postmaster during a count but the clients' backends
	psql -qX -c "ALTER SYSTEM SET autovacuum = off" -c "ALTER SYSTEM SET track_wal_io_timing = on" \
		-c "SELECT pg_reload_conf()" >/dev/null
	echo 'SELECT count(*) FROM (SELECT idempotency.ack(c.claim, array_agg(c.id)) FROM idempotency.claim(:topic, :batch) c GROUP BY c.claim) a;' >"$WORK/ours.sql"
	echo "SELECT pgmq.delete('relay', ARRAY(SELECT msg_id FROM pgmq.read('relay', 30, :batch)));" >"$WORK/pgmq.sql"
	echo "SELECT 1;" >"$WORK/one.sql"
	counted() {	# pgbench args... -> "instructions task-clock-ms" of the backends it used
		local base
		base=$(pgrep -P "$pm" | tr '\n' ' ')
		perf stat -e ${hw}task-clock -x, -o "$WORK/perf.out" -p "$pm" &
		local perf=$!
		sleep 0.5
		pgbench "$@" >"$WORK/bi.out" 2>&1
		# its backends exit after it: wait until the postmaster reaped them
		# (no psql here: its backend would be counted too)
		for _ in $(seq 100); do
			local p new=0
			for p in $(pgrep -P "$pm"); do [[ " $base " == *" $p "* ]] || new=1; done
			[ $new = 0 ] && break
			sleep 0.05
		done
		kill -INT "$perf"
		wait "$perf" 2>/dev/null
		awk -F, '$3 ~ /^instructions/ { i = $1 + 0 } $3 ~ /task-clock/ { t = $1 } END { printf "%d %.1f\n", i, t }' "$WORK/perf.out"
	}
	wal() { psql -qXAt -F ' ' -c "SELECT wal_sync, wal_sync_time, wal_write FROM pg_stat_wal"; }
	: >"$WORK/bi.dat"
	for c in 1 4; do
		# the clients' connections alone (backend start, one statement, exit)
		echo "conn $c $(counted -n -c $c -j $c -t 1 -f "$WORK/one.sql")" >>"$WORK/bi.dat"
	done
	for b in 1 10 100; do
		for c in 1 4; do
			need=$BI_MSGS
			[ $b = 1 ] && need=$((BI_MSGS / 10))
			t=$(( need / (b * c) ))
			for sys in ours keyed pgmq; do
				psql -qX -c "DELETE FROM idempotency.outbox_message" -c "DELETE FROM pgmq.q_relay" >/dev/null
				psql -qX -c "VACUUM ANALYZE idempotency.outbox_message" -c "VACUUM ANALYZE pgmq.q_relay" >/dev/null
				case $sys in
					ours) fill_ours relay $((need + need / 10 + b * c)) 0 ;;
					keyed) fill_ours keyed $((need + need / 10 + b * c)) 1000 ;;
					pgmq) fill_pgmq relay $((need + need / 10 + b * c)) ;;
				esac
				psql -qX -c "VACUUM ANALYZE idempotency.outbox_message" -c "VACUUM ANALYZE pgmq.q_relay" -c "CHECKPOINT" >/dev/null
				f=$WORK/ours.sql topic=relay
				[ $sys = pgmq ] && f=$WORK/pgmq.sql
				[ $sys = keyed ] && topic=keyed
				before=$(psql -qXAt -c "SELECT (SELECT count(*) FROM idempotency.outbox_message WHERE state = 'pending') + (SELECT count(*) FROM pgmq.q_relay)")
				i0=$(wal)
				got=$(counted -n -M prepared -c $c -j $c -t $t -D batch=$b -D topic=$topic -f "$f")
				i1=$(wal)
				after=$(psql -qXAt -c "SELECT (SELECT count(*) FROM idempotency.outbox_message WHERE state = 'pending') + (SELECT count(*) FROM pgmq.q_relay)")
				echo "run $sys $b $c $((before - after)) $got $i0 $i1 $(awk '/^tps = / { printf "%d", $3 }' "$WORK/bi.out")" >>"$WORK/bi.dat"
			done
		done
	done
	psql -qX -c "ALTER SYSTEM RESET autovacuum" -c "ALTER SYSTEM RESET track_wal_io_timing" \
		-c "SELECT pg_reload_conf()" >/dev/null
	ms=$("$PG_BINDIR/pg_test_fsync" -s 2 -f "$WORK/fsync.test" 2>/dev/null |
		awk '/fdatasync/ && /ops\/sec/ { for (i = 1; i <= NF; i++) if ($i == "usecs/op") { print $(i - 1) / 1000; exit } }')
	rm -f "$WORK/fsync.test"
	{
		echo
		echo "| batch | relays | ours: instructions per message | ours, 1000 keys | pgmq | ours / pgmq (instructions) | ours: CPU µs per message | ours, 1000 keys | pgmq | ours / pgmq (CPU) |"
		echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
		for b in 1 10 100; do
			for c in 1 4; do
				awk -v b=$b -v c=$c '
					$1 == "conn" && $2 == c { ci = $3; ct = $4 }
					$1 == "run" && $3 == b && $4 == c { n[$2] = $5; i[$2] = $6; t[$2] = $7 }
					END {
						for (s in n) { pi[s] = n[s] ? (i[s] - ci) / n[s] : 0; pt[s] = n[s] ? (t[s] - ct) * 1000 / n[s] : 0 }
						if (i["ours"] > 0)
							printf "| %d | %d | %d | %d | %d | %.2f |", b, c, pi["ours"], pi["keyed"], pi["pgmq"], pi["ours"] / pi["pgmq"]
						else
							printf "| %d | %d | - | - | - | - |", b, c
						printf " %.1f | %.1f | %.1f | %.2f |\n", pt["ours"], pt["keyed"], pt["pgmq"], pt["pgmq"] ? pt["ours"] / pt["pgmq"] : 0
					}' "$WORK/bi.dat"
			done
		done
		echo
		echo "A fixed number of claim + ack (read + delete) transactions, pgbench -M prepared, one statement each, fsync on, autovacuum off, from a freshly filled and vacuumed queue: $BI_MSGS messages per point at batch 10 and 100, $((BI_MSGS / 10)) at batch 1. Instructions (user and kernel; "-" where the machine has no hardware counter, as in a virtual machine: then see part bc) and CPU time (task-clock) summed over the backends by perf stat on the postmaster (children inherit the counters), less those of the same clients' connections alone; the WAL writer, checkpointer and the purge worker are not counted (nor are they for pgmq). A ratio of 0.67 or less is what 1.5 × pgmq's throughput takes where both are bound by CPU."
		echo
		echo "| batch 1 | relays | WAL flushes per message | ms per flush (wal_sync_time) | WAL writes per message | tps |"
		echo "|---|---:|---:|---:|---:|---:|"
		for c in 1 4; do
			for sys in ours pgmq; do
				awk -v c=$c -v s=$sys '$1 == "run" && $2 == s && $3 == 1 && $4 == c {
					n = $5; ds = $11 - $8; dt = $12 - $9; dw = $13 - $10
					printf "| %s | %d | %.2f | %.2f | %.2f | %d |\n", s, c, n ? ds / n : 0, ds ? dt / ds : 0, n ? dw / n : 0, $14 }' "$WORK/bi.dat"
			done
		done
		echo
		echo "pg_stat_wal over the batch-1 runs (synchronous_commit on): each message is its own transaction, and its commit waits for one WAL flush unless another backend's flush covered it. pg_test_fsync on the cluster's file system: ${ms:-?} ms per fdatasync. A relay doing one message per commit cannot go faster than one flush per message; if both systems flush once per message, the ratio at batch 1 is bounded by the flush, not by our CPU."
	} >>"$R"
}

# ---------------------------------------------------------------------------
part_bc() {
	echo >>"$R"
	echo "### (b), in instructions: claim + ack against read + delete under callgrind, one relay" >>"$R"
	command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
	local DATA=$CLUSTER_DIR/data sys b t
	psql -qX -c "DELETE FROM idempotency.outbox_message" -c "DELETE FROM pgmq.q_relay" >/dev/null
	fill_ours relay 5000 0
	fill_ours keyed 5000 1000
	fill_pgmq relay 5000
	psql -qX -c "VACUUM ANALYZE idempotency.outbox_message" -c "VACUUM ANALYZE pgmq.q_relay" -c "CHECKPOINT" >/dev/null
	as_pg "$PG_BINDIR/pg_ctl" -D "$DATA" -w stop >/dev/null
	local P="PREPARE ours(int) AS SELECT count(*) FROM (SELECT idempotency.ack(c.claim, array_agg(c.id)) FROM idempotency.claim('relay', \$1) c GROUP BY c.claim) a;
PREPARE keyed(int) AS SELECT count(*) FROM (SELECT idempotency.ack(c.claim, array_agg(c.id)) FROM idempotency.claim('keyed', \$1) c GROUP BY c.claim) a;
PREPARE pgmq(int) AS SELECT pgmq.delete('relay', ARRAY(SELECT msg_id FROM pgmq.read('relay', 30, \$1)));"
	cg() {	# sys batch transactions -> instructions of the session
		local f="$WORK/cg-$1-$2-$3.sql" i
		{
			echo "$P"
			for i in $(seq 1 5); do echo "EXECUTE $1($2);"; done	# warm-up: plans kept, caches filled
			for i in $(seq 1 "$3"); do echo "EXECUTE $1($2);"; done
		} >"$f"
		chmod 644 "$f"
		as_pg valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" \
			"$PG_BINDIR/postgres" --single -D "$DATA" postgres <"$f" >/dev/null 2>&1
		awk '/^summary:|^totals:/ { print $2; exit }' "$WORK/cg.out"
	}
	: >"$WORK/bc.dat"
	for b in 1 10 100; do
		t=$(( b == 1 ? 400 : b == 10 ? 80 : 16 ))
		for sys in ours keyed pgmq; do
			# the same session without the counted transactions, subtracted
			echo "$sys $b $t $(cg $sys $b 0) $(cg $sys $b $t)" >>"$WORK/bc.dat"
		done
	done
	as_pg "$PG_BINDIR/pg_ctl" -D "$DATA" -l "$CLUSTER_DIR/server.log" -w start >/dev/null
	{
		echo
		echo "| batch | ours: instructions per message | ours, 1000 keys | pgmq 1.5.1 | ours / pgmq |"
		echo "|---:|---:|---:|---:|---:|"
		for b in 1 10 100; do
			awk -v b=$b '$2 == b { v[$1] = ($5 - $4) / ($2 * $3) }
				END { printf "| %d | %d | %d | %d | %.2f |\n", b, v["ours"], v["keyed"], v["pgmq"], v["ours"] / v["pgmq"] }' "$WORK/bc.dat"
		done
		echo
		echo "One relay in \`postgres --single\` under callgrind (instructions of the whole server process, user space; the same in any load): after 5 warm-up transactions, 400 transactions of batch 1, 80 of 10, 16 of 100 (claim + ack in one statement, or read + delete), less the same session without them; queues of 5000 messages (100-byte pad), each queue vacuumed once before. A single relay only: there is no concurrency in single-user mode (part bi gives CPU time with 4 relays)."
	} >>"$R"
}

# ---------------------------------------------------------------------------
part_c() {
	echo >>"$R"
	echo "### (c) commit-to-handler latency" >>"$R"
	export NODE_PATH=$ROOT/clients/node/node_modules
	(cd "$ROOT/clients/node" && [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error >/dev/null)
	cat >"$WORK/latency.js" <<'JS'
// latency.js MODE COUNT: MODE ours (relay() blocked in wait_for()) or pgmq
// (pgmq.read every 100 ms); a publisher commits COUNT messages 30 ms apart.
// Each message carries its sequence number; the publisher notes its clock
// just before it sends COMMIT, the handler (same process, same clock) its
// own when the message arrives: commit-to-handler, the commit's own WAL
// flush included.  Prints p50 and p99 ms.
const pg = require('pg');
const { relay } = require(process.env.ROOT + '/clients/node');
const [mode, count] = [process.argv[2], Number(process.argv[3])];
const pool = new pg.Pool({ max: 4 });
const { performance } = require('perf_hooks');
const lat = [], sent = [];
let done;
const finished = new Promise(r => { done = r; });
function got(payload) {
	lat.push(performance.now() - sent[payload.seq]);
	if (lat.length === count) done();
}
let r = null, timer = null, stop = false;
if (mode === 'ours') {
	r = relay('latency', async m => got(m.payload), { pool, batchSize: 10, concurrency: 10, pollInterval: 60000, handleSignals: false });
} else {
	(async function poll() {
		while (!stop) {
			const { rows } = await pool.query("SELECT msg_id, message FROM pgmq.read('latency', 30, 10)");
			for (const row of rows) got(row.message);
			if (rows.length) await pool.query("SELECT pgmq.delete('latency', $1::bigint[])", [rows.map(x => x.msg_id)]);
			else await new Promise(res => { timer = setTimeout(res, 100); });
		}
	})();
}
(async () => {
	const c = new pg.Client();
	await c.connect();
	await new Promise(res => setTimeout(res, 300));
	for (let i = 0; i < count; i++) {
		await c.query('BEGIN');
		if (mode === 'ours') await c.query("SELECT idempotency.publish('latency', $1::jsonb)", [JSON.stringify({ seq: i })]);
		else await c.query("SELECT pgmq.send('latency', $1::jsonb)", [JSON.stringify({ seq: i })]);
		sent[i] = performance.now();
		await c.query('COMMIT');
		await new Promise(res => setTimeout(res, 30));
	}
	await finished;
	stop = true;
	if (timer) clearTimeout(timer);
	if (r) await r.stop();
	await c.end();
	await pool.end();
	lat.sort((a, b) => a - b);
	const q = p => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))];
	console.log(`${q(0.5).toFixed(1)} ${q(0.99).toFixed(1)}`);
})();
JS
	local ours pgmq rours rpgmq pm load
	load=$(uptime | sed 's/.*load average/load average/')
	ours=$(ROOT=$ROOT node "$WORK/latency.js" ours 300)
	pgmq=$(ROOT=$ROOT node "$WORK/latency.js" pgmq 300)
	# The same again with the cluster's new backends and the Node process
	# under SCHED_FIFO (chrt), so that other work on a shared machine does
	# not stand in the run queue before them: what a quiet machine would
	# show.  The policy is inherited by the backends the postmaster forks
	# from now on, and taken back from the postmaster afterwards.
	rours=- rpgmq=-
	pm=$(head -1 "$CLUSTER_DIR/data/postmaster.pid" 2>/dev/null)
	if [ "${OUTBOX_C_RT:-1}" = 1 ] && [ -n "$pm" ] && command -v chrt >/dev/null &&
		chrt -f -p 10 "$pm" 2>/dev/null; then
		rours=$(ROOT=$ROOT chrt -f 10 node "$WORK/latency.js" ours 300)
		rpgmq=$(ROOT=$ROOT chrt -f 10 node "$WORK/latency.js" pgmq 300)
		chrt -o -p 0 "$pm"
	fi
	{
		echo
		echo "| reader | p50 ms | p99 ms | under SCHED_FIFO: p50 ms | p99 ms |"
		echo "|---|---:|---:|---:|---:|"
		echo "| ours: Node relay(), idle in wait_for() | ${ours% *} | ${ours#* } | ${rours% *} | ${rours#* } |"
		echo "| pgmq: read every 100 ms | ${pgmq% *} | ${pgmq#* } | ${rpgmq% *} | ${rpgmq#* } |"
		echo
		echo "300 messages, one per transaction, 30 ms apart; from the publisher's clock just before it sends COMMIT (the commit's WAL flush included) to the handler, one process, one clock. Load during (c): $load. The last two columns: the cluster's backends and the Node process under SCHED_FIFO (chrt -f 10), so other work on the machine does not delay them. Target: p50 ≤ 2 ms, p99 ≤ 20 ms on a quiet machine."
	} >>"$R"
}

# ---------------------------------------------------------------------------
part_d() {
	echo >>"$R"
	echo "### (d) WAL bytes and dead row versions per delivered message" >>"$R"
	# no purge worker, no autovacuum: the WAL counted is the messages' own
	psql -qX -c "ALTER SYSTEM SET idempotency.purge_interval = 0" -c "SELECT pg_reload_conf()" \
		-c "ALTER TABLE idempotency.outbox_message SET (autovacuum_enabled = false)" \
		-c "ALTER TABLE pgmq.q_walq SET (autovacuum_enabled = false)" >/dev/null
	lsn() { psql -qXAt -c "SELECT pg_current_wal_insert_lsn()"; }
	tup() {	# table -> "ins upd hot del"
		psql -qXAt -F ' ' -c "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables WHERE relid = '$1'::regclass"
	}
	local sys t l0 l1 l2 l3 s0 s1
	: >"$WORK/d.dat"
	for sys in ours pgmq; do
		t=idempotency.outbox_message; [ $sys = pgmq ] && t=pgmq.q_walq
		psql -qX -c "DELETE FROM idempotency.outbox_message" -c "DELETE FROM pgmq.q_walq" \
			-c "VACUUM idempotency.outbox_message" -c "VACUUM pgmq.q_walq" -c "CHECKPOINT" >/dev/null
		s0=$(tup $t); l0=$(lsn)
		if [ $sys = ours ]; then
			psql -qX -c "DO \$\$ BEGIN FOR i IN 1..$WAL_N LOOP
			  PERFORM idempotency.publish('walt', jsonb_build_object('n', i, 'pad', repeat('x', 100))); COMMIT;
			END LOOP; END \$\$" >/dev/null
			l1=$(lsn)
			psql -qX -c "DO \$\$ DECLARE n int; BEGIN LOOP
			  SELECT count(*) INTO n FROM (SELECT idempotency.ack(c.claim, array_agg(c.id))
			                                 FROM idempotency.claim('walt', 10) c GROUP BY c.claim) a;
			  EXIT WHEN n = 0; COMMIT; END LOOP; END \$\$" >/dev/null
			l2=$(lsn)
			psql -qX -c "DO \$\$ BEGIN LOOP EXIT WHEN idempotency.purge(1000) = 0; COMMIT; END LOOP; END \$\$" >/dev/null
			l3=$(lsn)
		else
			psql -qX -c "DO \$\$ BEGIN FOR i IN 1..$WAL_N LOOP
			  PERFORM pgmq.send('walq', jsonb_build_object('n', i, 'pad', repeat('x', 100))); COMMIT;
			END LOOP; END \$\$" >/dev/null
			l1=$(lsn)
			psql -qX -c "DO \$\$ DECLARE ids bigint[]; BEGIN LOOP
			  SELECT array_agg(msg_id) INTO ids FROM pgmq.read('walq', 30, 10);
			  EXIT WHEN ids IS NULL; PERFORM pgmq.delete('walq', ids); COMMIT; END LOOP; END \$\$" >/dev/null
			l2=$(lsn); l3=$l2
		fi
		sleep 1
		s1=$(tup $t)
		psql -qXAt -F ' ' -c "SELECT '$sys',
		       round(('$l1'::pg_lsn - '$l0'::pg_lsn) / $WAL_N), round(('$l2'::pg_lsn - '$l1'::pg_lsn) / $WAL_N),
		       round(('$l3'::pg_lsn - '$l2'::pg_lsn) / $WAL_N), round(('$l3'::pg_lsn - '$l0'::pg_lsn) / $WAL_N)" >>"$WORK/d.dat"
		echo "$sys $s0 $s1" >>"$WORK/d.tup"
	done
	psql -qX -c "ALTER SYSTEM RESET idempotency.purge_interval" -c "SELECT pg_reload_conf()" \
		-c "ALTER TABLE idempotency.outbox_message RESET (autovacuum_enabled)" \
		-c "ALTER TABLE pgmq.q_walq RESET (autovacuum_enabled)" >/dev/null
	{
		echo
		echo "| system | publish | deliver | purge | WAL bytes per message | dead row versions per message (updates + deletes) | of them HOT |"
		echo "|---|---:|---:|---:|---:|---:|---:|"
		for sys in ours pgmq; do
			awk -v s=$sys -v n=$WAL_N 'NR == FNR && $1 == s { w = sprintf("| %s | %s | %s | %s | %s", $1, $2, $3, $4, $5) }
				NR != FNR && $1 == s { printf "%s | %.2f | %.2f |\n", w, (($7 - $3) + ($9 - $5)) / n, ($8 - $4) / n }' \
				"$WORK/d.dat" "$WORK/d.tup"
		done
		echo
		echo "$WAL_N messages (100-byte pad), each published in its own transaction, then delivered 10 per transaction (ours: claim + ack; pgmq: read + delete), then (ours) purged with retention 0; WAL from pg_current_wal_insert_lsn() after a CHECKPOINT (full-page images included), with autovacuum and the purge worker off; row versions from pg_stat_user_tables."
	} >>"$R"
}

# ---------------------------------------------------------------------------
part_e() {
	echo >>"$R"
	echo "### (e) $TOTAL messages through one topic (retention 0, purge worker every 1 s)" >>"$R"
	local chunk=20000 sent=0 step=$((TOTAL / 5))
	if [ -n "${OUTBOX_E_VACUUM_AFTER:-}" ]; then
		[[ $OUTBOX_E_VACUUM_AFTER =~ ^[0-9]+$ ]] || { echo "OUTBOX_E_VACUUM_AFTER: a number" >&2; exit 2; }
		psql -qX -c "ALTER SYSTEM SET idempotency.outbox_vacuum_after = $OUTBOX_E_VACUUM_AFTER" \
			-c "SELECT pg_reload_conf()" >/dev/null
	fi
	# a relay: claim 500 + ack, in its own transactions, until the topic is empty
	local DRAIN="DO \$\$ DECLARE n int; BEGIN LOOP
	  SELECT count(*) INTO n FROM (SELECT idempotency.ack(c.claim, array_agg(c.id))
	                                 FROM idempotency.claim('million', 500) c GROUP BY c.claim) a;
	  EXIT WHEN n = 0; COMMIT; END LOOP; END \$\$"
	{
		echo
		echo "| messages published | table + indexes | heap | indexes | rows in the table | dead rows (n_dead_tup) | vacuums by the outbox vacuum worker | autovacuums |"
		echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
	} >>"$R"
	snapshot() {
		psql -qX -c "SELECT pg_stat_force_next_flush()" >/dev/null 2>&1
		psql -qXAt -F ' | ' -c "SELECT '$1', pg_size_pretty(pg_total_relation_size('idempotency.outbox_message')),
		       pg_size_pretty(pg_relation_size('idempotency.outbox_message')),
		       pg_size_pretty(pg_indexes_size('idempotency.outbox_message')),
		       (SELECT count(*) FROM idempotency.outbox_message), n_dead_tup, vacuum_count, autovacuum_count
		  FROM pg_stat_user_tables WHERE relid = 'idempotency.outbox_message'::regclass" |
			sed 's/^/| /; s/$/ |/' >>"$R"
	}
	local t0=$(date +%s) next=$step
	while [ $sent -lt "$TOTAL" ]; do
		# publish a chunk (1000 keys) while two relays deliver the previous one
		psql -qX -c "$DRAIN" >/dev/null & local d1=$!
		psql -qX -c "$DRAIN" >/dev/null & local d2=$!
		fill_ours million $chunk 1000
		wait $d1 $d2
		sent=$((sent + chunk))
		if [ $sent -ge $next ]; then
			next=$((next + step))
			snapshot "$sent"
		fi
	done
	psql -qX -c "$DRAIN" >/dev/null
	# the worker purges the rest
	for i in $(seq 120); do
		[ "$(psql -qXAt -c "SELECT count(*) FROM idempotency.outbox_message")" -eq 0 ] && break
		sleep 0.5
	done
	snapshot "all delivered and purged"
	{
		echo
		echo "Published in transactions of $chunk (1000 message keys) while two relays (claim 500 + ack) deliver; ack deletes the message (claims in shared memory), and the outbox vacuum worker vacuums the table after every idempotency.outbox_vacuum_after = $(psql -qXAt -c "SHOW idempotency.outbox_vacuum_after") acked messages (0: off); the purge worker every idempotency.purge_interval = 1 s (purge_batch = 10000) writes the acked counts; autovacuum at its defaults (naptime $(psql -qXAt -c "SHOW autovacuum_naptime")). $(( $(date +%s) - t0 )) s in all; load at the end: $(uptime | sed 's/.*load average/load average/'). $(psql -qXAt -c "SELECT format('outbox_stats: published %s, delivered %s, dead %s', published, delivered, dead) FROM idempotency.outbox_stats WHERE topic = 'million'")."
	} >>"$R"
}

for p in $PARTS; do "part_$p"; done
echo
cat "$R"
[ -n "${OUTBOX_REPORT:-}" ] && { echo; cat "$R"; } >>"$OUTBOX_REPORT"
exit 0
