# test/citus/addnode.sh — sourced by test/citus/run (its cluster, its ok /
# not_ok / check, role app and its machine 'account'): a worker added after
# keys exist: the same identity on a node added later.
#
# w3 starts empty, with three roles of its own first, so that app's oid
# there differs from every other node's.  citus_add_node() creates the
# roles and the extension on it; a shard group of keys, seen message ids and
# payments is moved there; the reference tables (state_machine with its
# roleref owner, derive_key()'s secret) are copied to it.  Its keys must
# replay through w3 and the other nodes, derive the same downstream keys,
# and every copied owner must be app's own oid on w3.

# five keys in the shard group of 'nw-1'
nw_keys=$(q c "SELECT string_agg(k, ' ') FROM (SELECT 'nwk-' || g AS k FROM generate_series(1, 400) AS g
                WHERE get_shard_id_for_distribution_column('idempotency.idempotency_key', 'nwk-' || g)
                    = get_shard_id_for_distribution_column('idempotency.idempotency_key', 'nw-1')
                LIMIT 5) AS s")
set -- $nw_keys
nw_paid=$1 nw_lease=$2 nw_msg=$3 nw_acct=$4 nw_new=$5
nw_shard=$(q c "SELECT get_shard_id_for_distribution_column('idempotency.idempotency_key', 'nw-1')")
nw_from=$(q c "SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = $nw_shard")
out=$(qa c "SELECT outcome FROM idempotency.once('$nw_paid', '{}', 'INSERT INTO public.payments VALUES (\$1, 1, \$2) RETURNING amount', '$nw_paid', 'c')")
out="$out $(qa w1 "SELECT outcome || ' ' || attempts FROM idempotency.begin('$nw_lease', '{}', lease => '1 hour')")"
out="$out $(qa w2 "SELECT idempotency.first_seen('nw', '$nw_msg')")"
nw_derived=$(qa w2 "SELECT idempotency.derive_key('$nw_lease', 'charge')")
check "added node: before it, a key paid, a lease begun, a message id seen (one shard group)" "new new 1 t" "$out"

out=$(citus_node_init w3 2>&1 && {
	q w3 "CREATE ROLE skew_w3a; CREATE ROLE skew_w3b; CREATE ROLE skew_w3c; CREATE EXTENSION citus"
	q c "SELECT 1 FROM citus_add_node('$CITUS_DIR', $(citus_port w3))"
})
out="$out $(q w3 "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")"
check "added node: a third worker (w3) added with citus_add_node(): the extension 0.6.0 there" "1 0.6.0" "$out"
out=$(for node in c w1 w2 w3; do q "$node" "SELECT 'app'::regrole::oid"; done | sort -u | wc -l)
check "... role app on w3 too, under an oid of its own (4 oids on 4 nodes)" "4" "$out"

# a block_writes move needs the reference tables on w3 first (Citus's hint;
# citus_rebalance_start() copies them by itself): copied by name
out=$(q c "SELECT replicate_reference_tables('block_writes')")
out="$out$(q c "SELECT count(*) FROM pg_dist_placement AS p JOIN pg_dist_shard AS s USING (shardid)
               WHERE s.logicalrelid IN ('idempotency.state_machine'::regclass, 'idempotency.derive_secret'::regclass)
                 AND p.groupid = (SELECT groupid FROM pg_dist_node WHERE nodeport = $(citus_port w3))")"
check "added node: replicate_reference_tables() copies the state machines and derive_key()'s secret to w3" "2" "$out"
out=$(PGOPTIONS="-c statement_timeout=60s" q c "SELECT citus_move_shard_placement($nw_shard, '$CITUS_DIR', $nw_from, '$CITUS_DIR', $(citus_port w3), 'block_writes')")
out="$out$(q c "SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = $nw_shard")"
check "added node: the shard group moved to w3" "$(citus_port w3)" "$out"
out=$(q w3 "SELECT owner::text || ' ' || (owner::oid = 'app'::regrole::oid)
              FROM idempotency.idempotency_key_$nw_shard WHERE key IN ('$nw_paid', '$nw_lease') ORDER BY key" | sort -u)
check "... on w3 its key rows belong to app, by w3's own oid of app" "app true" "$out"

# w3's own tables came from the install script, whose owner columns are
# roleref already: once() there replays the paid key through Citus's route
# before distribute() runs again (which gives them the write policy)
out=$(psql -qAtX -U app -p "$(citus_port w3)" \
	-c "SELECT outcome FROM idempotency.once('$nw_paid', '{}', 'SELECT 1')" 2>&1 | head -n 1)
check "added node: before distribute() runs again, once() on w3 replays the paid key (its install-script tables have roleref owners)" \
	"replay" "$out"
out=$(q c "SELECT idempotency.distribute()")
out="$out$(q w3 "SELECT string_agg(format_type(a.atttypid, NULL), ' ' ORDER BY c.relname)
                  FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid
                 WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind = 'r' AND a.attname = 'owner'
                   AND c.relname IN ('idempotency_key', 'seen_message', 'state_machine', 'token')")"
out="$out $(q w3 "SELECT string_agg(polname, ' ' ORDER BY polname) FROM pg_policy
                   WHERE polrelid = 'idempotency.idempotency_key'::regclass")"
# no role but the owner writes the key, token and seen-message tables there
# either; PUBLIC updates (nothing) in the route tables, through
# which w3 carries a call to the node of its shard (src/keystore.c, the carried call)
out="$out $(q w3 "SELECT count(*) FILTER (WHERE has_table_privilege('app', t, 'INSERT') OR has_table_privilege('app', t, 'UPDATE')
                                           OR has_table_privilege('app', t, 'DELETE'))
                   || ' ' || has_column_privilege('app', 'idempotency.key_route', 'k', 'UPDATE')
                   || ' ' || has_column_privilege('app', 'idempotency.token_route', 't', 'UPDATE')
                   || ' ' || has_table_privilege('app', 'idempotency.key_route', 'DELETE')
                  FROM unnest(ARRAY['idempotency.idempotency_key', 'idempotency.token', 'idempotency.seen_message']::regclass[]) AS t")"
check "... distribute() again: w3's owner columns are roleref, no write policy, no write grant; UPDATE of the route tables' column (no table grant: no LOCK TABLE)" \
	"idempotency.roleref idempotency.roleref idempotency.roleref idempotency.roleref idempotency_key_own_rows 0 true true false" "$out"

out=$(for node in w3 c w1 w2; do qa "$node" "SELECT outcome FROM idempotency.once('$nw_paid', '{}', 'INSERT INTO public.payments VALUES (\$1, 1, \$2) RETURNING amount', '$nw_paid', '$node')"; done | tr '\n' ' ')
out="$out$(q c "SELECT count(*) FROM public.payments WHERE key = '$nw_paid'")"
check "added node: the key paid before replays through w3, c, w1, w2; paid once" "replay replay replay replay 1" "$out"
out=$(for node in w3 c; do qa "$node" "SELECT idempotency.derive_key('$nw_lease', 'charge')"; done | sort -u | tr '\n' ' ')
out="$out$(qa w3 "SELECT status FROM idempotency.lookup('$nw_lease')")"
check "... the lease: the same derived key on w3 and c as before the move, in progress on w3" "$nw_derived in_progress" "$out"
out=$(qfa w3 <<SQL
BEGIN;
INSERT INTO public.payments VALUES ('$nw_lease', 1, 'w3');
SELECT idempotency.complete('$nw_lease', '{"paid": true}', attempt => 1);
COMMIT;
SQL
)
out="$out$(qa c "SELECT outcome FROM idempotency.begin('$nw_lease', '{}')")"
out="$out $(q c "SELECT count(*) FROM public.payments WHERE key = '$nw_lease'")"
check "... its holder completes it on w3; a retry on c replays; paid once" "replay 1" "$out"
# a new key of that shard group, through w3, then through c and w1; and
# begin()/complete() on w3 of a key whose shard is on w1 (carried from w3
# to w1 through w3's copy of the route table, as app: src/keystore.c)
out=$(for node in w3 c w1; do qa "$node" "SELECT outcome FROM idempotency.once('$nw_new', '{}', 'INSERT INTO public.payments VALUES (\$1, 1, \$2) RETURNING amount', '$nw_new', '$node')"; done | tr '\n' ' ')
out="$out$(q c "SELECT count(*) FROM public.payments WHERE key = '$nw_new'")"
nw_tx=$(key_on "$PORT_W1" nwtx | head -n 1)
out="$out $(qfa w3 <<SQL
BEGIN;
SELECT outcome FROM idempotency.begin('$nw_tx', '{}');
SELECT idempotency.complete('$nw_tx', '{}') IS NOT NULL;
COMMIT;
SQL
)"
check "... a new key: new through w3, replayed through c and w1, paid once; begin()/complete() in a transaction on w3" "new replay replay 1 new t" "$(echo $out)"
out=$( (qa w3 "SELECT idempotency.first_seen('nw', '$nw_msg')"; qa c "SELECT idempotency.first_seen('nw', '$nw_msg')") | tr '\n' ' ')
check "... the message id seen before: not first on w3 or c" "f f " "$out"

# the reference tables on w3: derive_key()'s secret and the state machines
out=$(for node in c w3; do q "$node" "SELECT md5(string_agg(secret::text, ',' ORDER BY secret)) FROM idempotency.derive_secret"; done | sort -u | wc -l)
out="$out $(q w3 "SELECT owner::text || ' ' || (owner::oid = 'app'::regrole::oid) FROM idempotency.state_machine WHERE machine = 'account'")"
check "added node: w3 has derive_key()'s secret and the state machine 'account', owned by app (w3's oid)" "1 app true" "$out"
out=$(qa w3 "SELECT idempotency.create_machine('account', '{\"open\": [\"closed\"], \"closed\": []}')" 2>&1)
out="$out$(qa w3 "SELECT inserted FROM idempotency.insert_once('public.accounts', '{\"id\": \"$nw_acct\", \"balance\": 5}')")"
out="$out $(qa w3 "SELECT idempotency.transition('public.accounts', '$nw_acct'::text, 'closed', 'account', 'state')")"
check "... on w3 app is the machine's owner (create_machine() again: no error) and transition() applies it" "t applied" "$out"
out=$(psql -qAtX -p "$(citus_port w3)" -U payer -c '\set VERBOSITY verbose' \
	-c "SELECT idempotency.create_machine('account', '{\"open\": []}')" 2>&1 | head -n 1 | cut -c1-15)
check "... and another role (payer) is not: create_machine() of app's machine on w3 refused (42501)" "ERROR:  42501: " "$out"
