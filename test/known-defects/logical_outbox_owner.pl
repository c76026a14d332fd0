# Logical replication of the outbox's tables to another cluster with
# binary = true: their owner and grantee columns are still regrole, which
# travels as the publisher's oid, so on the subscriber a topic belongs to
# whatever role has that oid there (the key, token, seen-message and
# state-machine tables are idempotency.roleref and travel by name:
# test/t/042_logical_owner.pl).  Fails as of this commit; the fix is the
# same roleref conversion for outbox_topic.owner, outbox_grant.grantee and
# topic_owner, outbox_message.owner (their policies and the views over them
# made again around it, and the outbox's shape checks taking a roleref).
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
	CREATE PUBLICATION topics FOR TABLE idempotency.outbox_topic;
});
my $payer_oid = $pub->safe_psql('postgres', q{SELECT oid FROM pg_roles WHERE rolname = 'payer'});
$sub->safe_psql('postgres', qq{
	CREATE EXTENSION idempotency;
	CREATE ROLE payer;
	DO \$\$
	DECLARE o oid;
	BEGIN
		LOOP
			CREATE ROLE bystander;
			SELECT oid INTO o FROM pg_roles WHERE rolname = 'bystander';
			EXIT WHEN o >= $payer_oid;
			DROP ROLE bystander;
		END LOOP;
		IF o <> $payer_oid THEN
			RAISE EXCEPTION 'bystander got oid %, not $payer_oid', o;
		END IF;
	END \$\$});
(my $connstr = $pub->connstr('postgres')) =~ s/'/''/g;
$sub->safe_psql('postgres', qq{CREATE SUBSCRIPTION topics CONNECTION '$connstr' PUBLICATION topics
	WITH (binary = true, copy_data = false)});
$sub->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_stat_subscription WHERE subname = 'topics' AND pid IS NOT NULL})
  or die 'the subscription did not start';
$pub->safe_psql('postgres', q{SET ROLE payer; SELECT idempotency.create_topic('payer_topic')});
$sub->poll_query_until('postgres', q{SELECT count(*) = 1 FROM idempotency.outbox_topic WHERE name = 'payer_topic'})
  or die 'the streamed topic did not arrive';
is($sub->safe_psql('postgres', q{SET ROLE bystander; SELECT count(*) FROM idempotency.outbox_topic}),
	'0', 'bystander (payer\'s publisher oid) does not own payer\'s replicated topic');
is($sub->safe_psql('postgres', q{SET ROLE payer; SELECT count(*) FROM idempotency.outbox_topic}),
	'1', 'payer owns its topic on the subscriber');
$sub->safe_psql('postgres', q{DROP SUBSCRIPTION topics});
$sub->stop;
$pub->stop;
done_testing();
