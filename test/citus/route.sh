# test/citus/route.sh — sourced by test/citus/run (its cluster, roles app
# and bypass, its ok / not_ok / check / q / qa): attacks on a call carried
# to the node of its key's shard (src/keystore.c, the carried call),
# each a check that failed before its fix.
#
#   - LOCK TABLE of the route tables: the grant that lets a role carry a
#     call (a write on an always-empty table) must not let it hold up every
#     other role's carried calls: 42501 on the shells of every node, and a
#     carried call of another role goes through meanwhile;
#   - the caller's session settings: a call carried from the coordinator to
#     a worker must act on the caller's idempotency.default_ttl (how long a
#     key guards against a retry) and idempotency.lock_wait (the clients
#     SET LOCAL it: lockWaitMs), as the same call on the key's own node
#     does.  once() outside a transaction block, which Citus delegates
#     whole to the key's node, runs under the settings of the session
#     Citus opens there (a limit, docs/citus.md): the role's and the
#     database's settings, which Citus propagates to every node (ALTER
#     ROLE ... SET), so the check is that those reach it.

# rv node role sql: the first line of the verbose answer (its SQLSTATE)
rv() { psql -qAtX -U "$2" -p "$(citus_port "$1")" -c '\set VERBOSITY verbose' -c "$3" 2>&1 | head -n 1; }
# the node (w1 or w2) of key k's shard
rt_node() {
	case $(q c "SELECT p.nodeport FROM pg_dist_shard_placement AS p
	             WHERE p.shardid = get_shard_id_for_distribution_column('idempotency.idempotency_key', '$1')") in
	"$PORT_W1") echo w1 ;; "$PORT_W2") echo w2 ;; *) echo none ;;
	esac
}
# rt_key prefix node: a key starting with prefix whose shard is on node
rt_key() {
	local i
	for i in $(seq 1 64); do
		[ "$(rt_node "$1-$i")" = "$2" ] && { echo "$1-$i"; return; }
	done
}
q c "CREATE ROLE rt_other LOGIN" >/dev/null

# --- LOCK TABLE of the route tables -------------------------------------
# Before: distribute() granted PUBLIC DELETE on key_route and token_route,
# and a DELETE grant allows LOCK TABLE in every mode: app locked key_route
# on the coordinator and every role's begin() through any node waited on it.
out=""
for role in app bypass; do
	for node in c w1; do
		for tab in key_route token_route; do
			for mode in "ROW EXCLUSIVE" "SHARE" "ACCESS EXCLUSIVE"; do
				out="$out$(rv "$node" "$role" "BEGIN; LOCK TABLE idempotency.$tab IN $mode MODE; COMMIT" | cut -c1-14)|"
			done
		done
	done
done
check "app and bypass on c and w1: LOCK TABLE of key_route and token_route (ROW EXCLUSIVE, SHARE, ACCESS EXCLUSIVE): 42501 each" \
	"$(printf 'ERROR:  42501:|%.0s' $(seq 1 24))" "$out"

# app tries to hold key_route and token_route locked for 4 s; rt_other's
# begin()/complete() and issue_token() through the coordinator (carried to
# the workers) meanwhile, each bounded by a 2 s lock_timeout
rt_k=$(rt_key rt-lock w1)
psql -qAtX -U app -p "$PORT_C" -c "BEGIN; LOCK TABLE idempotency.key_route, idempotency.token_route IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(4); COMMIT" \
	>"$OUT/rt-lock.out" 2>&1 &
rt_pid=$!
sleep 1
out=$(psql -qAtX -v ON_ERROR_STOP=1 -U rt_other -p "$PORT_C" 2>&1 <<SQL | cut -c1-40 | tr '\n' ' '
\set VERBOSITY verbose
SET lock_timeout = '2s';
BEGIN;
SELECT outcome FROM idempotency.begin('$rt_k', '{}');
SELECT idempotency.complete('$rt_k', '{"ok": true}');
COMMIT;
SELECT idempotency.issue_token('rt') IS NOT NULL;
SQL
)
wait "$rt_pid"
check "... while app tries to hold them, rt_other's begin()/complete() and issue_token() through c go through (no 55P03)" \
	"new  t " "$out"
out=$(psql -qAtX -U rt_other -p "$(citus_port w1)" -c "SELECT status FROM idempotency.lookup('$rt_k')" 2>&1)
out="$out $(q c "SELECT count(*) FROM idempotency.key_route") $(q c "SELECT count(*) FROM idempotency.token_route")"
check "... the key is completed on its node; the route tables are still empty" "completed 0 0" "$out"
# the grant that carries a call writes nothing: INSERT refused, UPDATE and
# DELETE of an always-empty table touch no row
out=""
for role in app bypass; do
	out="$out$(rv c "$role" "INSERT INTO idempotency.key_route VALUES ('x')" | cut -c1-14)|"
	out="$out$(rv w1 "$role" "INSERT INTO idempotency.token_route VALUES (gen_random_uuid())" | cut -c1-14)|"
	out="$out$(rv c "$role" "TRUNCATE idempotency.key_route" | cut -c1-14)|"
done
out="$out $(q c "SELECT count(*) FROM idempotency.key_route") $(q c "SELECT count(*) FROM idempotency.token_route")"
check "app and bypass: INSERT into and TRUNCATE of the route tables 42501; nothing was written" \
	"$(printf 'ERROR:  42501:|%.0s' $(seq 1 6)) 0 0" "$out"

# --- the caller's settings travel with a carried call ---------------------
# Before: the call ran on the worker under the worker's settings: a role
# that SET idempotency.default_ttl = 3600 got keys and message ids that
# lived the server's default (a day) when carried, 3600 s on their own
# node; and a SET LOCAL idempotency.lock_wait was not honoured (the call
# waited the server's 20 s instead of answering IK002).
rt_t1=$(rt_key rt-ttl-a w1)
rt_t2=$(rt_key rt-ttl-b w1)
rt_m=$(rt_key rt-ttl-m w2)
out=$(psql -qAtX -v ON_ERROR_STOP=1 -U app -p "$PORT_C" 2>&1 <<SQL | tr '\n' ' '
SET idempotency.default_ttl = 3600;
BEGIN;
SELECT outcome FROM idempotency.begin('$rt_t1', '{}');
SELECT idempotency.complete('$rt_t1', '{}');
COMMIT;
BEGIN;
SELECT outcome FROM idempotency.once('$rt_t2', '{}', 'SELECT 1');
COMMIT;
SELECT idempotency.first_seen('rt', '$rt_m');
SQL
)
out="$out$(q c "SELECT string_agg(round(extract(epoch FROM expires_at - created_at))::text, ' ' ORDER BY key)
                  FROM idempotency.idempotency_key WHERE key IN ('$rt_t1', '$rt_t2')")"
out="$out $(q c "SELECT round(extract(epoch FROM expires_at - first_seen_at)) FROM idempotency.seen_message WHERE message_id = '$rt_m'")"
check "SET idempotency.default_ttl = 3600, then begin(), once() (in a transaction block) and first_seen() through c of keys on w1 and w2: each lives 3600 s" \
	"new  new t 3600 3600 3600" "$out"
# once() outside a transaction block is not carried by the extension but
# delegated whole by Citus (distribute(): create_distributed_function) to
# the key's node, in a session Citus opens there as the caller: a session
# SET on the entry node does not travel with it (Citus sends none), the
# role's own settings do: ALTER ROLE ... SET on the coordinator reaches
# every node (docs/citus.md, Limits)
q c "CREATE ROLE rt_ttl LOGIN" >/dev/null
q c "ALTER ROLE rt_ttl SET idempotency.default_ttl = 3600" >/dev/null
rt_t3=$(rt_key rt-ttl-c w1)
out=$(psql -qAtX -v ON_ERROR_STOP=1 -U rt_ttl -p "$PORT_C" \
	-c "SELECT outcome FROM idempotency.once('$rt_t3', '{}', 'SELECT 1')" 2>&1)
out="$out $(q c "SELECT round(extract(epoch FROM expires_at - created_at)) FROM idempotency.idempotency_key WHERE key = '$rt_t3'")"
out="$out $(q w1 "SELECT pg_catalog.array_to_string(s.setconfig, ',') FROM pg_db_role_setting AS s WHERE s.setrole = 'rt_ttl'::regrole")"
check "ALTER ROLE rt_ttl SET idempotency.default_ttl = 3600 on c reaches w1, and rt_ttl's once() through c outside a transaction block (Citus delegates it to w1) keeps the key 3600 s" \
	"new 3600 idempotency.default_ttl=3600" "$out"

rt_w=$(rt_key rt-wait w1)
psql -qAtX -U app -p "$PORT_W1" -c "BEGIN; SELECT 1 FROM idempotency.begin('$rt_w', '{}'); SELECT pg_sleep(5); ROLLBACK" \
	>"$OUT/rt-wait.out" 2>&1 &
rt_pid=$!
sleep 1
t0=$(date +%s%N)
out=$(psql -qAtX -U app -p "$PORT_C" -c '\set VERBOSITY verbose' -c "BEGIN" -c "SET LOCAL idempotency.lock_wait = '300ms'" \
	-c "SELECT outcome FROM idempotency.begin('$rt_w', '{}')" -c "ROLLBACK" 2>&1 | grep -m1 ERROR | cut -c1-14)
ms=$((($(date +%s%N) - t0) / 1000000))
wait "$rt_pid"
out="$out $([ "$ms" -lt 2500 ] && echo fast || echo "waited ${ms}ms")"
out="$out $(q c "SELECT count(*) FROM idempotency.idempotency_key WHERE key = '$rt_w'")"
check "SET LOCAL idempotency.lock_wait = '300ms' (as the clients do), then begin() through c of a key held on w1: IK002 within the 300 ms (not the server's 20 s); nothing written" \
	"ERROR:  IK002: fast 0" "$out"

# --- shard moves: the route tables must not stop them ---------------------
# Before: key_route and token_route had no primary key (no replica
# identity): Citus's default shard transfer mode (auto, logical
# replication) refused to move any shard group of the keys or tokens, and
# during a force_logical move every carried call's UPDATE (DELETE before)
# of the source shard failed ("does not have a replica identity and
# publishes updates"), its transaction rolled back.
# (the suite's own public.payments, co-located with the keys, has no
# primary key: a replica identity for it, so that only the extension's
# tables are on trial)
q c "ALTER TABLE public.payments REPLICA IDENTITY FULL" >/dev/null
rt_mv=$(rt_key rt-move w1)
rt_sh=$(q c "SELECT get_shard_id_for_distribution_column('idempotency.idempotency_key', '$rt_mv')")
out=$(PGOPTIONS="-c statement_timeout=60s -c client_min_messages=warning" q c "SELECT citus_move_shard_placement($rt_sh, '$CITUS_DIR', $PORT_W1, '$CITUS_DIR', $PORT_W2)" 2>&1 | head -n 1)
out="$out $(rt_node "$rt_mv")"
check "a shard group of the keys moves w1 -> w2 in the default transfer mode (auto: logical replication)" " w2" "$out"
rt_tok=$(q c "SELECT get_shard_id_for_distribution_column('idempotency.token', gen_random_uuid()::text)")
rt_tok_from=$(q c "SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = $rt_tok")
rt_tok_to=$([ "$rt_tok_from" = "$PORT_W1" ] && echo "$PORT_W2" || echo "$PORT_W1")
out=$(PGOPTIONS="-c statement_timeout=60s -c client_min_messages=warning" q c "SELECT citus_move_shard_placement($rt_tok, '$CITUS_DIR', $rt_tok_from, '$CITUS_DIR', $rt_tok_to)" 2>&1 | head -n 1)
out="$out $(q c "SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = $rt_tok")"
check "a shard group of the tokens moves in the default transfer mode" " $rt_tok_to" "$out"
# a carried begin() ... complete() in flight while the group moves (back)
# with force_logical: the complete() is carried to the source shard while
# it is published
rt_from=$(q c "SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = $rt_sh")
rt_to=$([ "$rt_from" = "$PORT_W1" ] && echo "$PORT_W2" || echo "$PORT_W1")
psql -qAtX -U app -p "$PORT_C" -c "BEGIN" -c "SELECT outcome FROM idempotency.begin('$rt_mv', '{}')" -c "SELECT pg_sleep(3)" \
	-c "SELECT idempotency.complete('$rt_mv', '{\"moved\": true}')" -c "COMMIT" >"$OUT/rt-move.out" 2>&1 &
rt_pid=$!
sleep 1
PGOPTIONS="-c statement_timeout=60s -c client_min_messages=warning" q c "SELECT citus_move_shard_placement($rt_sh, '$CITUS_DIR', $rt_from, '$CITUS_DIR', $rt_to, 'force_logical')" >"$OUT/rt-move2.out" 2>&1
wait "$rt_pid"
out="$(grep -m1 -o 'ERROR: .*' "$OUT/rt-move.out" | cut -c1-60) $(q c "SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = $rt_sh" | sed "s/^$rt_to\$/moved/")"
out="$out $(for node in c w1 w2; do qa "$node" "SELECT outcome FROM idempotency.once('$rt_mv', '{}', 'SELECT 1')"; done | tr '\n' ' ')"
check "force_logical move of that group with a carried begin()/complete() in flight: it commits (no replica identity error); the key replays through c, w1, w2" \
	" moved replay replay replay " "$out"
