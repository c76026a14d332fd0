# Logical replication of the outbox's tables to another cluster with
# binary = true (a blue/green switch, a major upgrade by replication).
# Roles have other oids on the subscriber.  The owner and grantee columns
# of topics, grants and messages are idempotency.roleref, as the key
# table's owner is (042_logical_owner.pl): they travel by the role's name,
# so on the subscriber each topic, grant and message stays with its role,
# never with whatever role has the publisher's oid there (a regrole went
# as that oid).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pub = PostgreSQL::Test::Cluster->new('publisher');
$pub->init(allows_streaming => 'logical');
$pub->start;
my $sub = PostgreSQL::Test::Cluster->new('subscriber');
$sub->init;
$sub->start;

$pub->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE ROLE filler_1; CREATE ROLE filler_2; CREATE ROLE filler_3;
	CREATE ROLE payer;
	CREATE ROLE filler_4; CREATE ROLE filler_5;
	CREATE ROLE reader;
	CREATE PUBLICATION outbox FOR TABLE idempotency.outbox_topic, idempotency.outbox_grant,
		idempotency.outbox_message;
});
my $payer_oid = $pub->safe_psql('postgres', q{SELECT oid FROM pg_roles WHERE rolname = 'payer'});
my $reader_oid = $pub->safe_psql('postgres', q{SELECT oid FROM pg_roles WHERE rolname = 'reader'});

# on the subscriber, bystander takes payer's publisher oid and onlooker
# reader's; payer and reader exist there under other oids
sub role_with_oid
{
	my ($name, $oid) = @_;
	$sub->safe_psql('postgres', qq{
	DO \$\$
	DECLARE o oid;
	BEGIN
		LOOP
			CREATE ROLE $name;
			SELECT oid INTO o FROM pg_roles WHERE rolname = '$name';
			EXIT WHEN o >= $oid;
			DROP ROLE $name;
		END LOOP;
		IF o <> $oid THEN
			RAISE EXCEPTION '$name got oid %, not $oid', o;
		END IF;
	END \$\$});
}
$sub->safe_psql('postgres', q{CREATE EXTENSION idempotency; CREATE ROLE payer; CREATE ROLE reader});
role_with_oid('bystander', $payer_oid);
role_with_oid('onlooker', $reader_oid);

(my $connstr = $pub->connstr('postgres')) =~ s/'/''/g;
$sub->safe_psql('postgres', qq{CREATE SUBSCRIPTION outbox CONNECTION '$connstr' PUBLICATION outbox
	WITH (binary = true, copy_data = false)});
$sub->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_stat_subscription WHERE subname = 'outbox' AND pid IS NOT NULL})
  or die 'the subscription did not start';
$pub->safe_psql('postgres', q{
	SET ROLE payer;
	SELECT idempotency.create_topic('payer_topic');
	SELECT idempotency.grant_topic('payer_topic', 'reader', publish => false);
	SELECT idempotency.publish('payer_topic', '{"n": 1}');
	SELECT idempotency.publish('payer_topic', '{"n": 2}', 'order-7');
});
$sub->poll_query_until('postgres', q{SELECT count(*) = 2 FROM idempotency.outbox_message})
  or die 'the streamed messages did not arrive';

my %sees = (
	payer     => '1|1|2|payer|payer|reader',
	reader    => '1|1|2|payer|payer|reader',
	bystander => '0|0|0|||',
	onlooker  => '0|0|0|||',
);
for my $role (sort keys %sees)
{
	is($sub->safe_psql('postgres', qq{SET ROLE $role;
		SELECT (SELECT count(*) FROM idempotency.outbox_topic),
		       (SELECT count(*) FROM idempotency.outbox_grant),
		       (SELECT count(*) FROM idempotency.outbox_message),
		       (SELECT owner FROM idempotency.outbox_topic),
		       (SELECT string_agg(DISTINCT owner::text, ',') FROM idempotency.outbox_message),
		       (SELECT grantee FROM idempotency.outbox_grant)}),
		$sees{$role}, "$role on the subscriber: topics, grants, messages and their roles as on the publisher");
}
is($sub->safe_psql('postgres', q{SET ROLE reader; SELECT topic, owner FROM idempotency.outbox_stats}),
	'payer_topic|payer', 'outbox_stats on the subscriber names the topic\'s owner');
is($sub->safe_psql('postgres', q{SELECT string_agg(DISTINCT published_by::text, ',') FROM idempotency.outbox_message}),
	'payer', 'published_by names the publishing role');

$sub->safe_psql('postgres', q{DROP SUBSCRIPTION outbox});
$sub->stop;
$pub->stop;
done_testing();
