# The claim table in shared memory (idempotency.outbox_claims entries for
# the whole cluster) has no share per role, as the acked counts have
# (outbox_counts.c: COUNT_SHARE): any role may create a topic, publish to
# it and claim its own messages with a long visibility, and so fill the
# table for every role of every database.  Until those claims lapse (a
# visibility of a year: until a restart) every other relay gets nothing
# and a 53400 warning.
#
# Here role hog fills a 64-entry table in database one; role victim, in
# database two, publishes one message and claims it.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('claims_share');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0
idempotency.outbox_claims = 64
});
$node->start;
$node->safe_psql('postgres', q{CREATE ROLE hog; CREATE ROLE victim});
for my $db ('one', 'two')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
}

$node->safe_psql('one', q{
	SET ROLE hog;
	SELECT idempotency.create_topic('hog');
	SELECT count(idempotency.publish('hog', jsonb_build_object('n', i))) FROM generate_series(1, 64) i;
	SELECT count(*) FROM idempotency.claim('hog', 64, '1 year');
});
is($node->safe_psql('one', q{SELECT count(*) FROM idempotency.outbox_in_flight}),
	'64', 'role hog holds 64 claims in database one');

$node->safe_psql('two', q{
	SET ROLE victim;
	SELECT idempotency.create_topic('work');
	SELECT idempotency.publish('work', '{"n": 1}');
});
my ($rc, $out, $err) = $node->psql('two',
	q{SET ROLE victim; SELECT count(*) FROM idempotency.claim('work', 10, '30 seconds')});
is($out, '1', 'role victim in database two claims its one message');
unlike($err, qr/WARNING/, 'and is not warned of a full table');
note("victim's claim said: $err") if $err ne '';

$node->stop;
done_testing();
