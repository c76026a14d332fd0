# test/citus/upgrade.sh — sourced by test/citus/run (its cluster, its ok /
# not_ok / check): ALTER EXTENSION idempotency UPDATE from 0.5.0 on Citus
# with keys in flight.
#
# A second database, upd, on the same three nodes is its own Citus cluster
# (Citus's metadata is per database) with idempotency 0.5.0 in it:
#   - keys of role upa: one completed and paid, a lease held for an hour, a
#     lease of a few seconds with a recovery point (it lapses during the
#     update: a takeover after it), a token, a seen message id, a topic with
#     two messages; each lease's derive_key() noted;
#   - 0.5.0's distribute(): owner columns of role names (text) on every node;
#   - ALTER EXTENSION idempotency UPDATE on the coordinator (Citus carries
#     it to the workers), then, until distribute() runs, every function
#     refuses the text owners (55000) and writes nothing;
#   - distribute() once: roleref owners on every node; then retries through
#     c, w1 and w2 replay (paid once), the held lease stays held, the lapsed
#     one is taken over (attempt 2, from its point; attempt 1 fenced),
#     derive_key() gives the same downstream keys on every node, the token,
#     the message id and the messages are there, and a rename after all of
#     it changes nothing.
# The keys are written by the library under test serving 0.5.0's SQL (as
# sql/upgrade.sql does; the README: the new library serves the old SQL
# until the update) before 0.5.0's distribute() moves them into shards:
# the library refuses 0.5.0's text owners once they are distributed (the
# third check), so the rows in flight are exactly what 0.5.0 leaves on disk,
# written before distribution.

qd() { psql -qAtX -v ON_ERROR_STOP=1 -d upd -p "$(citus_port "$1")" -c "$2" 2>&1; }
qdf() { psql -qAtX -v ON_ERROR_STOP=1 -d upd -p "$(citus_port "$1")" 2>&1; }
# as role upa; qdv: the first line of the verbose error (SQLSTATE)
qdu() { psql -qAtX -v ON_ERROR_STOP=1 -d upd -U upa -p "$(citus_port "$1")" -c "$2" 2>&1; }
qdv() { psql -qAtX -d upd -U "${3:-upa}" -p "$(citus_port "$1")" -c '\set VERBOSITY verbose' -c "$2" 2>&1 | head -n 1; }
owner_types() {	# the owner columns' types on every node
	for node in c w1 w2; do
		qd "$node" "SELECT string_agg(format_type(a.atttypid, NULL), ' ' ORDER BY c.relname)
		              FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid
		             WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind = 'r'
		               AND a.attname = 'owner'
		               AND c.relname IN ('idempotency_key', 'seen_message', 'state_machine', 'token')"
	done | sort | uniq -c | sed 's/^ *//' | tr '\n' ' '
}

upd_pay='INSERT INTO public.up_pay VALUES ($1, $2) RETURNING key'
out=""
for node in c w1 w2; do
	# (unless Citus carried the coordinator's CREATE DATABASE over)
	[ "$(q "$node" "SELECT count(*) FROM pg_database WHERE datname = 'upd'")" = 1 ] ||
		out="$out$(PGOPTIONS="-c client_min_messages=warning" q "$node" "CREATE DATABASE upd")"
	out="$out$(qd "$node" "CREATE EXTENSION citus")"
done
out="$out$(qdf c <<SQL
SELECT 1 FROM citus_set_coordinator_host('$CITUS_DIR', $PORT_C);
SELECT 1 FROM citus_add_node('$CITUS_DIR', $PORT_W1);
SELECT 1 FROM citus_add_node('$CITUS_DIR', $PORT_W2);
CREATE EXTENSION idempotency VERSION '0.5.0';
CREATE TABLE public.up_pay (key text COLLATE "C" NOT NULL, node text);
SQL
)"
out="$out$(q c "CREATE ROLE upa LOGIN")"
out="$out$(qd c "GRANT SELECT, INSERT ON public.up_pay TO upa")"
out=$(echo "$out" | grep -v '^1$')
vers=$(for node in c w1 w2; do qd "$node" "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"; done | tr '\n' ' ')
check "upgrade: database upd on c, w1, w2, its own Citus cluster, idempotency 0.5.0 on every node" "0.5.0 0.5.0 0.5.0 " "$out$vers"

# --- 0.5.0: keys in flight ---------------------------------------------------
u_lease=4	# seconds: the short lease lapses while the update runs
out=$(psql -qAtX -v ON_ERROR_STOP=1 -d upd -U upa -p "$PORT_C" 2>&1 <<SQL
SELECT outcome FROM idempotency.once('u-done', '{}', '$upd_pay', 'u-done', 'c');
SELECT outcome || ' ' || attempts FROM idempotency.begin('u-held', '{}', lease => '1 hour');
SELECT outcome || ' ' || attempts FROM idempotency.begin('u-lapse', '{}', lease => '$u_lease seconds');
SELECT idempotency.checkpoint('u-lapse', 'charged', '{"charge": "ch_9"}', 1);
SELECT 'token ' || idempotency.issue_token('up', ttl => '1 day');
SELECT idempotency.first_seen('orders', 'um-1', ttl => '1 day');
SELECT 'topic ' || idempotency.create_topic('up-topic') > '';
SELECT 'msg ' || idempotency.publish('up-topic', '{"n": 1}', 'k1');
SELECT 'msg ' || idempotency.publish('up-topic', '{"n": 2}', 'k2');
SQL
)
u_token=$(echo "$out" | sed -n 's/^token //p')
u_msgs=$(echo "$out" | sed -n 's/^msg //p' | tr '\n' ' ')
check "upgrade: on 0.5.0, role upa: a key paid, a lease held, a lease with a point, a token, a message id, a topic with two messages" \
	"new|new 1|new 1||t|t|2" "$(echo "$out" | grep -v '^token \|^msg ' | tr '\n' '|')$(echo "$u_msgs" | wc -w)"
u_held=$(qdu c "SELECT idempotency.derive_key('u-held', 'charge')")
u_lapse=$(qdu c "SELECT idempotency.derive_key('u-lapse', 'charge')")
case "$u_held$u_lapse" in
idk_*idk_*) ok "upgrade: derive_key() of both leases on 0.5.0" ;;
*) not_ok "upgrade: derive_key() on 0.5.0" "$u_held $u_lapse" ;;
esac

# 0.5.0's distribute(): role names in the owner columns, then the business
# table co-located with the keys (its row copied into its shard)
out=$(qdf c <<'SQL'
SET client_min_messages = warning;
SELECT idempotency.distribute();
SELECT 1 FROM create_distributed_table('public.up_pay', 'key', colocate_with => 'idempotency.idempotency_key');
SELECT 1 FROM truncate_local_data_after_distributing_table('public.up_pay');
SQL
)
# (state_machine keeps regrole: 0.5.0 did not convert it)
check "upgrade: 0.5.0's distribute(); owner columns of role names (text) on every node" \
	"|1|1|3 text text regrole text " "$(echo "$out" | tr '\n' '|')$(owner_types)"
# 0.5.0's write grants to PUBLIC (on the shells of every node and on the
# shards), under own-row write policies: "writes policies" per node
write_grants() {
	local node
	for node in c w1 w2; do
		psql -qAtX -d upd -p "$(citus_port "$node")" -c "SET citus.override_table_visibility = off" -c "
		SELECT count(*) FILTER (WHERE has_table_privilege('upa', c.oid, 'INSERT') OR has_table_privilege('upa', c.oid, 'UPDATE')
		                           OR has_table_privilege('upa', c.oid, 'DELETE'))
		       || ' ' || (SELECT count(*) FROM pg_policy AS p JOIN pg_class AS pc ON pc.oid = p.polrelid
		                   WHERE p.polname LIKE '%_own_rows_write' AND pc.relnamespace = 'idempotency'::regnamespace)
		  FROM pg_class AS c
		 WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind = 'r'
		   AND c.relname ~ '^(idempotency_key|token|seen_message)(_[0-9]+)?$'" 2>&1
	done | tr '\n' ' '
}
u_grants=$(write_grants)
case $u_grants in "0 0 "*) ;; *) u_grants_ok=1 ;; esac
check "upgrade: 0.5.0's distribute() granted PUBLIC writes on the key, token and seen-message tables, shards too (tables policies per node: $u_grants)" \
	"1" "${u_grants_ok:-0}"
out=$(qdv w1 "SELECT outcome FROM idempotency.once('u-done', '{}', '$upd_pay', 'u-done', 'w1')")
check "upgrade: the new library on 0.5.0's distributed tables (before the update) refuses text owners: 55000" \
	"ERROR:  55000: table idempotency.idempotency_key is distributed by Citus, but its owner column is of type text" "$out"

# --- the update --------------------------------------------------------------
out=$(qd c "ALTER EXTENSION idempotency UPDATE TO '0.6.0'")
vers=$(for node in c w1 w2; do qd "$node" "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"; done | tr '\n' ' ')
check "upgrade: ALTER EXTENSION idempotency UPDATE on the coordinator: 0.6.0 on every node" "0.6.0 0.6.0 0.6.0 " "$out$vers"
check "... it revoked 0.5.0's write grants and dropped its write policies on every node, shards too (tables policies per node)" \
	"0 0 0 0 0 0 " "$(write_grants)"
out=$(qd c "SELECT count(*) FILTER (WHERE derive_seed IS NOT NULL AND get_byte(derive_seed, 0) = 0) || ' of ' || count(*)
              FROM idempotency.idempotency_key")
check "upgrade: every stored key has a version 0 seed (the shards too)" "3 of 3" "$out"

# until distribute(): 55000 from every entry point, nothing written
out=$( (qdv w1 "SELECT outcome FROM idempotency.once('u-done', '{}', '$upd_pay', 'u-done', 'w1')"
	qdv c "SELECT outcome FROM idempotency.begin('u-new', '{}')"
	qdv w2 "SELECT idempotency.consume_token('$u_token', 'up')"
	qdv c "SELECT idempotency.first_seen('orders', 'um-2')"
	qdv w2 "SELECT idempotency.derive_key('u-held', 'charge')") | cut -c1-15 | sort | uniq -c | sed 's/^ *//' | tr '\n' ' ')
check "upgrade: after the update, before distribute(): once(), begin(), consume_token(), first_seen(), derive_key() refuse with 55000" \
	"5 ERROR:  55000:  " "$out"
out=$(qd c "SELECT (SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'u-new')
            || ' ' || (SELECT count(*) FROM idempotency.token)
            || ' ' || (SELECT count(*) FROM idempotency.seen_message)
            || ' ' || (SELECT count(*) FROM public.up_pay)")
check "... and wrote nothing (no key, the token still there, one message id, one payment)" "0 1 1 1" "$out"

out=$(qd c "SELECT idempotency.distribute()")
check "upgrade: distribute() once: roleref owners on every node" "3 idempotency.roleref idempotency.roleref idempotency.roleref idempotency.roleref " "$out$(owner_types)"
out=$( (qdv w1 "UPDATE idempotency.idempotency_key SET status = 'completed' WHERE key = 'u-held'"
	qdv w2 "DELETE FROM idempotency.token"
	qdv c "INSERT INTO idempotency.seen_message (owner, scope, message_id, first_seen_at, expires_at) VALUES ('upa', 'orders', 'um-9', now(), now() + interval '1 day')") |
	cut -c1-14 | sort | uniq -c | sed 's/^ *//' | tr '\n' ' ')
check "... and upa's plain UPDATE (w1), DELETE (w2), INSERT (c) of its own rows: 42501" "3 ERROR:  42501: " "$out$(write_grants | tr -d '0 ')"
out=$(qd c "SELECT count(*) FROM idempotency.idempotency_key WHERE owner::text <> 'upa'")
check "... every key row still names upa" "0" "$out"
# the rows the tables had on c before 0.5.0 distributed them: Citus copied
# them to the shards and left them in c's own tables (no query reads them)
out=$(qd c "SELECT string_agg(c.relname || ' ' || pg_relation_size(c.oid), ', ' ORDER BY c.relname)
              FROM pg_class AS c
             WHERE c.relnamespace = 'idempotency'::regnamespace
               AND c.relname IN ('idempotency_key', 'seen_message', 'token')")
check "... the coordinator's own copies of the key, seen-message and token tables are empty (0.5.0 left its rows there)" \
	"idempotency_key 0, seen_message 0, token 0" "$out"

# --- after: every key, token, message id and message carried over ----------
out=$(for node in c w1 w2; do qdu "$node" "SELECT outcome FROM idempotency.once('u-done', '{}', '$upd_pay', 'u-done', '$node')"; done | tr '\n' ' ')
out="$out$(qd c "SELECT count(*) FROM public.up_pay WHERE key = 'u-done'")"
check "upgrade: the key paid on 0.5.0: retries through c, w1, w2 replay, paid once" "replay replay replay 1" "$out"
out=$(qdv w1 "SELECT outcome FROM idempotency.begin('u-held', '{}', lease => '1 hour')" | grep -o 'IK002\|in progress under a lease' | sort -u | tr '\n' ' ')
check "... the lease held on 0.5.0 is still held (begin() on w1: IK002)" "IK002 in progress under a lease " "$out"
out=$(for node in c w1 w2; do qdu "$node" "SELECT idempotency.derive_key('u-held', 'charge')"; done | sort -u | tr '\n' ' ')
check "... its derive_key() on c, w1, w2 is the one 0.5.0 gave" "$u_held " "$out"
out=$(psql -qAtX -v ON_ERROR_STOP=1 -d upd -U upa -p "$PORT_W2" 2>&1 <<SQL
BEGIN;
INSERT INTO public.up_pay VALUES ('u-held', 'w2');
SELECT idempotency.complete('u-held', '{"paid": true}', attempt => 1);
COMMIT;
SELECT status FROM idempotency.lookup('u-held');
SQL
)
out="$out $(qdu c "SELECT outcome FROM idempotency.begin('u-held', '{}')")"
check "... its holder (attempt 1) completes it on w2; a retry on c replays" "completed replay" "$(echo $out)"

# the short lease lapsed while the update ran (waits for it if not yet)
for i in $(seq 50); do
	[ "$(qdu c "SELECT locked_until < now() FROM idempotency.lookup('u-lapse')")" = t ] && break
	sleep 0.2
done
out=$(qdu w2 "SELECT outcome || ' ' || attempts || ' ' || recovery_point || ' ' || (recovery_state->>'charge') FROM idempotency.begin('u-lapse', '{}', lease => '1 hour')")
check "upgrade: the lapsed 0.5.0 lease taken over on w2: retry, attempt 2, from its point" "retry 2 charged ch_9" "$out"
out=$(qdv c "SELECT idempotency.complete('u-lapse', '{}', attempt => 1)" | cut -c1-15)
out="$out$(qdv w1 "SELECT idempotency.checkpoint('u-lapse', 'zombie', NULL, 1)" | cut -c1-15)"
out="$out$(qdu w2 "SELECT attempts || ' ' || status || ' ' || recovery_point FROM idempotency.lookup('u-lapse')")"
check "... the fenced attempt 1: complete() on c and checkpoint() on w1 raise IK004, nothing written" \
	"ERROR:  IK004: ERROR:  IK004: 2 in_progress charged" "$out"
out=$(for node in c w1 w2; do qdu "$node" "SELECT idempotency.derive_key('u-lapse', 'charge')"; done | sort -u | tr '\n' ' ')
check "... the new attempt derives the key 0.5.0 gave, on c, w1, w2" "$u_lapse " "$out"
out=$(psql -qAtX -v ON_ERROR_STOP=1 -d upd -U upa -p "$PORT_W1" 2>&1 <<SQL
BEGIN;
INSERT INTO public.up_pay VALUES ('u-lapse', 'w1');
SELECT idempotency.complete('u-lapse', '{"paid": true}', attempt => 2);
COMMIT;
SQL
)
out="$out$(for node in c w2; do qdu "$node" "SELECT outcome FROM idempotency.begin('u-lapse', '{}')"; done | tr '\n' ' ')"
out="$out$(qd c "SELECT count(*) FROM public.up_pay WHERE key = 'u-lapse'")"
check "... attempt 2 completes on w1; retries on c and w2 replay; paid once" "replay replay 1" "$out"

out=$( (qdu w1 "SELECT idempotency.consume_token('$u_token', 'up')"
	qdu c "SELECT idempotency.consume_token('$u_token', 'up')"
	qdu w2 "SELECT idempotency.first_seen('orders', 'um-1')"
	qdu c "SELECT idempotency.first_seen('orders', 'um-2')") | tr '\n' ' ')
check "upgrade: the 0.5.0 token consumed on w1 (t), again on c (f); message id um-1 seen on w2 (f), a new one (t)" "t f f t " "$out"
out=$(qdu c "SELECT string_agg(message_id::text, ' ' ORDER BY id) || ' ' FROM idempotency.claim('up-topic', 10)")
check "upgrade: the topic's two 0.5.0 messages are claimed, same message ids, in order" "$u_msgs" "$out"

# a rename after the update: the converted rows follow the role
q c "ALTER ROLE upa RENAME TO upa_renamed" >/dev/null
out=$(for node in w2 c; do psql -qAtX -d upd -U upa_renamed -p "$(citus_port "$node")" \
	-c "SELECT outcome FROM idempotency.once('u-done', '{}', '$upd_pay', 'u-done', '$node')" 2>&1; done | tr '\n' ' ')
out="$out$(psql -qAtX -d upd -U upa_renamed -p "$PORT_W1" -c "SELECT idempotency.derive_key('u-lapse', 'charge')" 2>&1 | sed "s/^$u_lapse\$/same/")"
out="$out $(qd c "SELECT count(*) FROM public.up_pay WHERE key = 'u-done'")"
check "upgrade: upa renamed afterwards: its 0.5.0 key replays through w2 and c, derive_key() on w1 unchanged, paid once" "replay replay same 1" "$out"
q c "ALTER ROLE upa_renamed RENAME TO upa" >/dev/null
