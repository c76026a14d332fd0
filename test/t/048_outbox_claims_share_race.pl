# A role's share of the claim table in shared memory (046) holds for
# relays of the same role claiming at the same moment: a claim() call
# counts its role's claims once, then adds its own, and counts again when
# other calls made claims since that could be the role's (its other
# relays) and take it to its eighth; without that, each call counted
# before the others' entries were in, so k relays at once took up to k
# eighths, and five filled the table for every other role.
#
# With a 16384-entry table: a superuser's topic holds half of it (8192
# claims, not limited); then four sessions of role hog, released together
# from an advisory lock, each claim 2048 of a topic of hog's: together
# they hold hog's share, 2048, and no more.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $k = 4;
my $node = PostgreSQL::Test::Cluster->new('claims_share_race');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0
idempotency.outbox_claims = 16384
});
$node->start;
$node->safe_psql('postgres', q{CREATE ROLE hog});
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('admin');
	SELECT count(idempotency.publish('admin', jsonb_build_object('n', i))) FROM generate_series(1, 8192) i;
});
for my $i (1 .. $k)
{
	$node->safe_psql('postgres', qq{
		SET ROLE hog;
		SELECT idempotency.create_topic('h$i');
		SELECT count(idempotency.publish('h$i', jsonb_build_object('n', i))) FROM generate_series(1, 2048) i;
	});
}
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.claim('admin', 8192, '1 hour')}),
	'8192', "a superuser's topic holds half the table");

my $gate = $node->background_psql('postgres');
$gate->query_safe(q{SELECT pg_advisory_lock(1)});
my @relays;
for my $i (1 .. $k)
{
	my $s = $node->background_psql('postgres');
	$s->query_safe(q{SET ROLE hog});
	$s->query_until(qr/started/, qq{\\echo started
SELECT count(*) FROM (SELECT pg_advisory_lock_shared(1)::text AS x) AS l,
  LATERAL idempotency.claim('h$i' || l.x, 2048, '1 hour');
});
	push @relays, $s;
}
$node->poll_query_until('postgres', qq{
	SELECT count(*) = $k FROM pg_locks WHERE locktype = 'advisory' AND NOT granted})
  or die 'the relays did not wait at the gate';
$gate->query_safe(q{SELECT pg_advisory_unlock(1)});
$node->poll_query_until('postgres', q{
	SELECT count(*) = 0 FROM pg_stat_activity
	 WHERE query LIKE '%idempotency.claim(''h%' AND state = 'active' AND pid <> pg_backend_pid()})
  or die 'the relays did not finish';

my $held = $node->safe_psql('postgres',
	q{SELECT count(*) FROM idempotency.outbox_in_flight WHERE topic LIKE 'h%'});
note("role hog holds $held claims");
cmp_ok($held, '<=', 2048, "$k relays of one role at once hold no more than its eighth (2048)");
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.outbox_in_flight}) < 16384 ? 'room' : 'full',
	'room', 'and leave room in the table for other roles');

$_->quit for @relays;
$gate->quit;
$node->stop;
done_testing();
