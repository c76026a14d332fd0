# Between a new library and ALTER EXTENSION UPDATE the library serves the
# previous release's SQL objects (docs/upgrading.md).  Every function of
# 0.5.0's SQL is called against this library, with the library not
# preloaded and preloaded; the outbox's relay calls in that window are not
# handed out twice; and a key, a lease and a claim taken in the window keep
# their lock, their derived key and their claim across the update.  (The
# library once read claims through functions that 0.5.0's SQL does not
# have: claim() failed without the library preloaded, ack(), nack() and
# release() with it, so claimed messages were handed out again.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('window');
$node->init;
$node->append_conf('postgresql.conf', q{idempotency.purge_interval = 0});
$node->start;
$node->safe_psql('postgres', q{CREATE ROLE payer; CREATE ROLE consumer});

# every function of 0.5.0's SQL, as a role (one line "label|value" each)
my $calls = q{
SET ROLE payer;
BEGIN; SELECT 'begin|' || outcome FROM idempotency.begin('w-1', '{"a": 1}');
SELECT 'complete|' || idempotency.complete('w-1', '"done"')::text; COMMIT;
SELECT 'replay|' || outcome || ' ' || response::text FROM idempotency.begin('w-1', '{"a": 1}');
BEGIN; SELECT 'begin2|' || outcome FROM idempotency.begin('w-2');
SELECT 'fail|' || idempotency.fail('w-2', '"no"', retryable => false)::text; COMMIT;
SELECT 'lease|' || outcome FROM idempotency.begin('w-lease', lease => '1 hour');
SELECT 'checkpoint|' || idempotency.checkpoint('w-lease', 'p1', '{"s": 1}', 1)::text;
SELECT 'derive_key|' || (idempotency.derive_key('w-lease', 'charge') ~ '^idk_[a-z2-7]{26}$');
SELECT 'renew|' || (idempotency.renew('w-lease', '1 hour', 1) > now());
SELECT 'lookup|' || status || ' ' || recovery_point FROM idempotency.lookup('w-lease');
SELECT 'complete_lease|' || idempotency.complete('w-lease', '"ok"', attempt => 1)::text;
SELECT 'forget|' || idempotency.forget('w-2');
SELECT 'fingerprint|' || length(idempotency.fingerprint('{"a": 1}'));
SELECT 'once_text|' || (idempotency.once('w-once', '{}', 'SELECT 1 AS x')).outcome;
SELECT 'once_any|' || (idempotency.once('w-once2', '{}', 'SELECT $1::int AS x', 5)).outcome;
SELECT 'http_text|' || (idempotency.http_response(200, 'body') ->> 'body');
SELECT 'http_bytea|' || (idempotency.http_response(200, '\x00ff'::bytea) ? 'body_base64');
SELECT 'purge|' || (idempotency.purge() >= 0);
SELECT 'token|' || idempotency.consume_token(idempotency.issue_token('s'), 's');
SELECT 'first_seen|' || idempotency.first_seen('c', 'm-1');
SELECT 'create_machine|' || idempotency.create_machine('w_m', '{"pending": ["paid"]}')::text;
SELECT 'transition|' || idempotency.transition('public.w_orders', 1, 'paid', 'w_m');
SELECT 'update_versioned|' || idempotency.update_versioned('public.w_orders', 1, 1, '{"status": "paid"}');
SELECT 'insert_once|' || (idempotency.insert_once('public.w_orders', '{"id": 2, "status": "new"}')).inserted;
SELECT 'create_topic|' || (idempotency.create_topic('w_topic', max_attempts => 3) > 0);
SELECT 'alter_topic|' || idempotency.alter_topic('w_topic', retention => '1 hour')::text;
SELECT 'grant_topic|' || idempotency.grant_topic('w_topic', 'consumer')::text;
SELECT 'revoke_topic|' || idempotency.revoke_topic('w_topic', 'consumer')::text;
SELECT 'publish|' || count(idempotency.publish('w_topic', jsonb_build_object('n', n))) FROM generate_series(1, 4) AS n;
CREATE TEMP TABLE c AS SELECT * FROM idempotency.claim('w_topic', 10, '1 hour');
SELECT 'claim|' || count(*) FROM c;
SELECT 'claim_again|' || count(*) FROM idempotency.claim('w_topic', 10, '1 hour');
SELECT 'ack|' || idempotency.ack((SELECT claim FROM c LIMIT 1), ARRAY(SELECT id FROM c ORDER BY id LIMIT 1));
SELECT 'nack|' || idempotency.nack((SELECT claim FROM c LIMIT 1), ARRAY(SELECT id FROM c ORDER BY id OFFSET 1 LIMIT 1), '{"e": 1}', '0 seconds');
SELECT 'release|' || idempotency.release((SELECT claim FROM c LIMIT 1), ARRAY(SELECT id FROM c ORDER BY id OFFSET 2));
SELECT 'claim_after|' || count(*) FROM idempotency.claim('w_topic', 10, '1 hour');
SELECT 'redrive|' || idempotency.redrive('w_topic');
SELECT 'outbox_stats|' || published || ' ' || delivered FROM idempotency.outbox_stats;
SELECT 'drop_topic|' || idempotency.drop_topic('w_topic', force => true)::text;
SELECT 'stats|' || (count(*) >= 0) FROM idempotency.stats;
RESET ROLE;
SELECT 'stats_reset|' || idempotency.stats_reset()::text;
UPDATE idempotency.lock_secret SET secret = substr(sha256('window'), 1, 16);
SELECT 'lock_secret_changed|' || count(*) FROM idempotency.lock_secret;
SELECT 'distribute|' || idempotency.distribute()::text;
};
my %want = (
	begin => 'new', complete => '', replay => 'replay "done"', begin2 => 'new', fail => '',
	lease => 'new', checkpoint => '', derive_key => 'true', renew => 'true',
	lookup => 'in_progress p1', complete_lease => '', forget => 'true', fingerprint => '32',
	once_text => 'new', once_any => 'new', http_text => 'body', http_bytea => 'true',
	purge => 'true', token => 'true', first_seen => 'true', create_machine => '',
	transition => 'applied', update_versioned => '2', insert_once => 'true',
	create_topic => 'true', alter_topic => '', grant_topic => '', revoke_topic => 'true',
	publish => '4', claim => '4', claim_again => '0', ack => '1', nack => '1', release => '2',
	claim_after => '3', redrive => '0', outbox_stats => '4 1', drop_topic => '',
	stats => 'true', stats_reset => '', lock_secret_changed => '1');

for my $preload (0, 1)
{
	my $mode = $preload ? 'preloaded' : 'not preloaded';
	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = '" . ($preload ? 'idempotency' : '') . "'");
	$node->restart;
	my $db = $preload ? 'window_pre' : 'window_plain';
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, q{
		CREATE EXTENSION idempotency VERSION '0.5.0';
		CREATE TABLE w_orders (id int PRIMARY KEY, status text, version bigint DEFAULT 1);
		GRANT ALL ON w_orders TO payer;
		INSERT INTO w_orders VALUES (1, 'pending', 1)});
	my ($rc, $out, $err) = $node->psql($db, $calls, on_error_stop => 0, extra_params => [ '-At' ]);
	my %got = map { my ($k, $v) = split /\|/, $_, 2; ($k => $v // '') } grep { /\|/ } split /\n/, $out;
	for my $k (sort keys %want)
	{
		# the counters need the library preloaded (documented: 55000)
		next if !$preload && ($k eq 'stats' || $k eq 'stats_reset');
		is($got{$k}, $want{$k}, "$mode, 0.5.0's SQL: $k");
	}
	my @errors = grep { /ERROR/ } split /\n/, $err;
	my @expected = $preload ? () : grep { /statistics are not being collected/ } @errors;
	my @other = grep { !/statistics are not being collected/ && !/needs the citus extension/ } @errors;
	is("@other", '', "$mode, 0.5.0's SQL: no error but the documented ones");
	like($err, qr/needs the citus extension/, "$mode, 0.5.0's SQL: distribute() without Citus is 55000 as before");

	# across the update: a lease, a claim and a key's lock taken in the window
	$node->safe_psql($db, q{SET ROLE payer;
		SELECT idempotency.create_topic('across');
		SELECT idempotency.publish('across', '{"n": 1}');
		SELECT outcome FROM idempotency.begin('across-lease', lease => '1 hour')});
	my $derived = $node->safe_psql($db, q{SET ROLE payer; SELECT idempotency.derive_key('across-lease', 'charge')});
	my $claim = $node->safe_psql($db, q{SET ROLE payer; SELECT claim || ' ' || id FROM idempotency.claim('across', 1, '1 hour')});
	like($claim, qr/^[0-9a-f-]{36} \d+$/, "$mode: a message claimed in the window");
	my ($token, $id) = split / /, $claim;
	$node->safe_psql($db, q{ALTER EXTENSION idempotency UPDATE});
	is($node->safe_psql($db, q{SET ROLE payer; SELECT count(*) FROM idempotency.claim('across', 10, '1 hour')}),
		'0', "$mode: the message claimed in the window is not handed out again after the update");
	is($node->safe_psql($db, qq{SET ROLE payer; SELECT idempotency.ack('$token', ARRAY[$id]::int8[])}),
		'1', "$mode: the window's claim acks after the update");
	is($node->safe_psql($db, q{SET ROLE payer; SELECT idempotency.derive_key('across-lease', 'charge')}),
		$derived, "$mode: the lease begun in the window derives the same key after the update");
	my ($rc2, $o2, $e2) = $node->psql($db, q{SET ROLE payer; SET idempotency.lock_wait = 0;
		SELECT outcome FROM idempotency.begin('across-lease', lease => '1 hour')});
	like($e2, qr/in progress/, "$mode: the lease begun in the window still holds its key after the update");
	is($node->safe_psql($db, q{SET ROLE payer; SELECT idempotency.complete('across-lease', '"ok"', attempt => 1);
			SELECT status FROM idempotency.lookup('across-lease')}) =~ s/^\s+//r,
		'completed', "$mode: and its holder completes it");
}

# A session that published in the window (0.5.0's regrole owner columns)
# and goes on after ALTER EXTENSION UPDATE (a pooled connection) keeps
# publish()'s fast path: the message row is not written through the SPI
# INSERT, which auto_explain's nested statements would show.  The topic
# lookup's SELECT shows that auto_explain sees publish()'s statements.
{
	$node->safe_psql('postgres', q{CREATE DATABASE window_session});
	$node->safe_psql('window_session', q{CREATE EXTENSION idempotency VERSION '0.5.0'});
	my ($rc, $out, $err) = $node->psql('window_session', q{
		SET ROLE payer;
		SELECT idempotency.create_topic('pooled') > 0;
		SELECT idempotency.publish('pooled', '{"n": 1}') IS NOT NULL;
		RESET ROLE;
		ALTER EXTENSION idempotency UPDATE;
		LOAD 'auto_explain';
		SET auto_explain.log_min_duration = 0;
		SET auto_explain.log_nested_statements = on;
		SET auto_explain.log_level = notice;
		SET ROLE payer;
		SELECT idempotency.publish('pooled', '{"n": 2}') IS NOT NULL;
		SELECT count(*) FROM idempotency.outbox_message WHERE owner::regrole = 'payer'::regrole},
		on_error_stop => 1, extra_params => [ '-At' ]);
	is("$rc $out", "0 t\nt\nt\n2", 'a session of the window publishes after the update');
	like($err, qr/FROM idempotency\.outbox_topic/, 'auto_explain shows the statements publish() runs');
	unlike($err, qr/INSERT INTO idempotency\.outbox_message/,
		'a session of the window keeps the fast path after the update (no SPI INSERT)');
}

# The update turns the outbox's owner and grantee columns from regrole into
# idempotency.roleref (the same oid on disk): a topic, a grant and messages
# made by 0.5.0 keep their roles, the grant still lets its grantee consume
# and is taken back by revoke_topic(), and the grant's lookup by
# (topic_id, grantee) still uses outbox_grant_pkey.
{
	$node->safe_psql('postgres', q{CREATE DATABASE window_roles});
	$node->safe_psql('window_roles', q{
		CREATE EXTENSION idempotency VERSION '0.5.0';
		SET ROLE payer;
		SELECT idempotency.create_topic('granted');
		SELECT idempotency.grant_topic('granted', 'consumer', publish => false, consume => true);
		SELECT idempotency.publish('granted', jsonb_build_object('n', n)) FROM generate_series(1, 3) AS n;
		RESET ROLE;
		ALTER EXTENSION idempotency UPDATE});
	is($node->safe_psql('window_roles', q{
		SELECT string_agg(format('%s %s', pg_typeof(t.owner), t.owner), ',')
		  FROM idempotency.outbox_topic AS t}),
		'idempotency.roleref payer', '0.5.0\'s topic: its owner a roleref, the same role');
	is($node->safe_psql('window_roles', q{
		SELECT string_agg(format('%s %s %s', pg_typeof(g.grantee), g.grantee, g.topic_owner), ',')
		  FROM idempotency.outbox_grant AS g}),
		'idempotency.roleref consumer payer', '0.5.0\'s grant: grantee and topic owner the same roles');
	is($node->safe_psql('window_roles', q{
		SELECT string_agg(DISTINCT format('%s %s', m.owner, m.published_by), ',')
		  FROM idempotency.outbox_message AS m}),
		'payer payer', '0.5.0\'s messages: owner and publisher the same roles');
	is($node->safe_psql('window_roles', q{
		SET ROLE consumer; SELECT count(*) FROM idempotency.claim('granted', 10, '1 hour')}),
		'3', '0.5.0\'s grant lets its grantee claim after the update');
	like($node->safe_psql('window_roles', q{
		SET enable_seqscan = off;
		PREPARE g(int, regrole) AS SELECT 1 FROM idempotency.outbox_grant AS g
		 WHERE g.topic_id OPERATOR(pg_catalog.=) $1 AND g.grantee OPERATOR(pg_catalog.=) $2;
		SET plan_cache_mode = force_generic_plan;
		EXPLAIN (COSTS OFF) EXECUTE g(1, 'consumer')}),
		qr/Index (Only )?Scan using outbox_grant_pkey/, 'a grant\'s lookup by (topic_id, grantee) uses the primary key after the update');
	is($node->safe_psql('window_roles', q{
		SET ROLE payer; SELECT idempotency.revoke_topic('granted', 'consumer')}),
		't', 'revoke_topic() takes 0.5.0\'s grant back after the update');
	my ($rc, $out, $err) = $node->psql('window_roles', q{
		SET ROLE consumer; SELECT count(*) FROM idempotency.claim('granted', 10, '1 hour')});
	like($err, qr/permission denied for topic "granted"/, 'and its grantee may no longer claim');
}

$node->stop;
done_testing();
