# pg_dump keeps the key rows, and a restore into another cluster, where the
# same roles have other OIDs, keeps each key with its role (owner is regrole,
# dumped by name): duplicates after the restore still replay.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $src = PostgreSQL::Test::Cluster->new('source');
$src->init;
$src->start;
$src->safe_psql('postgres', q{
	CREATE ROLE app;
	CREATE EXTENSION idempotency;
	SET ROLE app;
	BEGIN;
	SELECT outcome FROM idempotency.begin('order-1', '{"sku": "A"}', scope => 'orders');
	SELECT idempotency.complete('order-1', '{"order_id": 1}', scope => 'orders');
	SELECT outcome FROM idempotency.begin('order-2');
	SELECT idempotency.fail('order-2', '{"error": "declined"}', retryable => false);
	COMMIT;
	RESET ROLE;
	BEGIN;
	SELECT outcome FROM idempotency.begin('order-1', scope => 'orders');
	SELECT idempotency.complete('order-1', '"the superuser''s own key"', scope => 'orders');
	COMMIT;
	SET ROLE app;
	SELECT idempotency.issue_token('checkout');
	SELECT idempotency.first_seen('consumer', 'msg-1');
	SELECT outcome FROM idempotency.begin('pay-1', lease => '1 hour', scope => 'payments');
	SELECT idempotency.checkpoint('pay-1', 'charge', '{"charge": "ch_1"}', 1, 'payments');
	RESET ROLE;
});
# a request in progress: its retry after the restore must send the other
# system the same derived key
my $derive = q{SET ROLE app; SELECT idempotency.derive_key('pay-1', 'charge', 'payments')};
my $derived = $src->safe_psql('postgres', $derive);

# a role that is dropped with its rows left behind (DROP ROLE does not see
# them): its key, token, seen message, topic and message
$src->safe_psql('postgres', q{
	CREATE ROLE doomed;
	GRANT CREATE ON SCHEMA public TO doomed;
	SET ROLE app;
	SELECT idempotency.create_topic('app_topic');
	SELECT idempotency.grant_topic('app_topic', 'doomed', publish => true, consume => false);
	SET ROLE doomed;
	SELECT idempotency.publish('app_topic', '{"published by": "doomed"}');
	BEGIN;
	SELECT outcome FROM idempotency.begin('secret-1');
	SELECT idempotency.complete('secret-1', '{"card": "4242 4242 4242 4242"}');
	COMMIT;
	SELECT idempotency.issue_token('doomed-scope');
	SELECT idempotency.first_seen('doomed-scope', 'msg-d');
	SELECT idempotency.create_topic('doomed_topic');
	SELECT idempotency.publish('doomed_topic', '{"refund": 5}');
	RESET ROLE;
	REVOKE CREATE ON SCHEMA public FROM doomed;
});
my $doomed_oid = $src->safe_psql('postgres', q{SELECT oid FROM pg_roles WHERE rolname = 'doomed'});
$src->safe_psql('postgres', q{DROP ROLE doomed});
is( $src->safe_psql('postgres', qq{SELECT count(*) FROM idempotency.idempotency_key WHERE owner = $doomed_oid}),
	'1', 'DROP ROLE leaves the dropped role\'s key row behind');

my $rows = q{SELECT owner::text, scope, key, status, response, retryable, attempts,
	encode(request_hash, 'hex'), created_at, expires_at
	FROM idempotency.idempotency_key WHERE owner::oid IN (SELECT oid FROM pg_roles) ORDER BY 1, 2, 3};
my $before = $src->safe_psql('postgres', $rows);

my $dump = PostgreSQL::Test::Utils::tempdir() . '/keys.dump';
$src->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $src->connstr('postgres') ],
	'pg_dump succeeds');

# another cluster: fillers shift the OIDs, so only the role name can match
my $dst = PostgreSQL::Test::Cluster->new('restore');
$dst->init;
$dst->start;
$dst->safe_psql('postgres', q{CREATE ROLE filler1; CREATE ROLE filler2; CREATE ROLE app;
	CREATE DATABASE restored;});
isnt(
	$dst->safe_psql('postgres', q{SELECT oid FROM pg_roles WHERE rolname = 'app'}),
	$src->safe_psql('postgres', q{SELECT oid FROM pg_roles WHERE rolname = 'app'}),
	'role app has another OID in the restore cluster');
# a new role in the restore cluster that has the dropped role's oid (an
# unrelated role; in one cluster too, after the oid counter wraps): 0.5.0
# and 0.6.0 before this test dumped the dropped role's rows with its oid as
# a bare number, restored as this role's
$dst->safe_psql('postgres', qq{DO \$\$
	DECLARE o oid;
	BEGIN
		LOOP
			CREATE ROLE heir;
			SELECT oid INTO o FROM pg_roles WHERE rolname = 'heir';
			EXIT WHEN o >= $doomed_oid;
			DROP ROLE heir;
		END LOOP;
		IF o <> $doomed_oid THEN
			RAISE EXCEPTION 'heir got oid %, not $doomed_oid', o;
		END IF;
	END \$\$});
is($dst->safe_psql('postgres', q{SELECT oid FROM pg_roles WHERE rolname = 'heir'}), $doomed_oid,
	'a new role in the restore cluster has the dropped role\'s oid');
$dst->command_ok([ 'pg_restore', '-d', $dst->connstr('restored'), $dump ],
	'pg_restore succeeds');
is( $dst->safe_psql('restored', q{SET ROLE heir;
		SELECT (SELECT count(*) FROM idempotency.idempotency_key) || ' ' || (SELECT count(*) FROM idempotency.token)
		|| ' ' || (SELECT count(*) FROM idempotency.seen_message) || ' ' || (SELECT count(*) FROM idempotency.outbox_topic)
		|| ' ' || (SELECT count(*) FROM idempotency.outbox_message)}),
	'0 0 0 0 0', 'the new role with the dropped role\'s oid sees none of its keys, tokens, messages or topics');
is( $dst->safe_psql('restored', q{SELECT count(*) FROM idempotency.idempotency_key k
		WHERE NOT EXISTS (SELECT FROM pg_roles r WHERE r.oid = k.owner)}),
	'0', 'no restored key row names a role that does not exist');
# a message the dropped role published to another role's topic is that
# role's and is dumped; its publisher, a regrole, dumped as a bare oid,
# named the new role with that oid
is( $dst->safe_psql('restored', q{SELECT count(*) || ' ' || count(*) FILTER (WHERE published_by::oid = 0)
		FROM idempotency.outbox_message WHERE payload = '{"published by": "doomed"}'}),
	'1 1', 'a message the dropped role published to a live role\'s topic is restored with nobody (0) as its publisher');
is( $dst->safe_psql('restored', q{SELECT count(*) FROM idempotency.outbox_message WHERE published_by = 'heir'::regrole}),
	'0', 'and the new role with the dropped role\'s oid published nothing');

is($dst->safe_psql('restored', $rows), $before, 'every key row is restored as it was');
my $others = q{SELECT owner::text, scope, token::text, expires_at FROM idempotency.token
	WHERE owner::oid IN (SELECT oid FROM pg_roles)
	UNION ALL SELECT owner::text, scope, message_id, expires_at FROM idempotency.seen_message
	WHERE owner::oid IN (SELECT oid FROM pg_roles) ORDER BY 1, 2, 3};
is($dst->safe_psql('restored', $others), $src->safe_psql('postgres', $others),
	'tokens and seen messages are restored too');
is( $dst->safe_psql('restored', q{SET ROLE app; SELECT idempotency.first_seen('consumer', 'msg-1')}),
	'f', 'a message seen before the dump is a redelivery after the restore');
is( $dst->safe_psql('restored', q{SET ROLE app;
		SELECT outcome || ' ' || response FROM idempotency.begin('order-1', '{"sku": "A"}', scope => 'orders')}),
	'replay {"order_id": 1}', 'a duplicate after the restore replays its role\'s answer');
is( $dst->safe_psql('restored', q{SET ROLE app;
		SELECT outcome || ' ' || status || ' ' || response FROM idempotency.begin('order-2')}),
	'replay failed {"error": "declined"}', 'a stored failure replays too');
my ($ret, $out, $err) = $dst->psql('restored', q{SET ROLE app;
	SELECT * FROM idempotency.begin('order-1', '{"sku": "B"}', scope => 'orders')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/IK001/, 'a different request after the restore is still IK001');
is( $dst->safe_psql('restored', q{SET ROLE app;
	SELECT recovery_point || ' ' || recovery_state FROM idempotency.lookup('pay-1', 'payments')}),
	'charge {"charge": "ch_1"}', 'a key in progress keeps its recovery point');
is($dst->safe_psql('restored', $derive), $derived,
	'derive_key() gives the same key after the restore (the dumped secret is the oldest row)');
is( $dst->safe_psql('restored', q{SELECT count(*) FROM idempotency.derive_secret}),
	'2', 'the restore added the dumped secret beside the one CREATE EXTENSION made');
is( $dst->safe_psql('restored', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	$src->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'the extension is restored at its version');
# (after the comparisons above: these write rows)
is( $dst->safe_psql('restored', q{SET ROLE heir;
		SELECT outcome || ' ' || coalesce(response::text, 'no response') FROM idempotency.begin('secret-1', lease => '1 minute')}),
	'new no response', 'its begin() of the dropped role\'s key is new: no stored answer (a card number) replayed');
is( $dst->safe_psql('restored', q{SET ROLE heir; SELECT idempotency.first_seen('doomed-scope', 'msg-d')}),
	't', 'and a message the dropped role saw is new to it');

# a hash-partitioned key table (README, "Partitioning the key table"): the
# partitions are dumped with their rows; the restore converts the target
# first and then loads the data
open(my $fh, '<', 'sql/partitioned.sql') or die "sql/partitioned.sql: $!";
my $sql = do { local $/; <$fh> };
close $fh;
my ($recipe) = $sql =~ /^-- the recipe \(README\), in one transaction\n(.*?^COMMIT;)/ms
  or die 'recipe not found in sql/partitioned.sql';
$src->safe_psql('postgres', q{CREATE DATABASE parted});
$src->safe_psql('parted', 'CREATE EXTENSION idempotency');
$src->safe_psql('parted', $recipe);
$src->safe_psql('parted', q{
	BEGIN;
	SELECT outcome FROM idempotency.begin('part-1');
	SELECT idempotency.complete('part-1', '"kept across the dump"');
	COMMIT;
	BEGIN;
	SELECT outcome FROM idempotency.begin('part-2');
	SELECT idempotency.complete('part-2', '"also kept"');
	COMMIT;
});
my $pdump = PostgreSQL::Test::Utils::tempdir() . '/parted.dump';
$src->command_ok([ 'pg_dump', '-Fc', '-f', $pdump, '-d', $src->connstr('parted') ],
	'pg_dump of a partitioned key table succeeds');
$dst->safe_psql('postgres', q{CREATE DATABASE parted});
$dst->safe_psql('parted', 'CREATE EXTENSION idempotency');
$dst->safe_psql('parted', $recipe);
$dst->command_ok([ 'pg_restore', '--data-only', '-d', $dst->connstr('parted'), $pdump ],
	'pg_restore --data-only into the converted target succeeds');
is( $dst->safe_psql('parted', q{SELECT relkind FROM pg_class WHERE oid = 'idempotency.idempotency_key'::regclass}),
	'p', 'the restored key table is partitioned');
is( $dst->safe_psql('parted', q{SELECT string_agg(outcome || ' ' || response, ', ')
		FROM (SELECT * FROM idempotency.begin('part-1') UNION ALL SELECT * FROM idempotency.begin('part-2')) b}),
	'replay "kept across the dump", replay "also kept"',
	'keys of a partitioned key table replay after the restore');

$src->stop;
$dst->stop;
done_testing();
