# The acked counts' barriers (src/outbox_counts.c): a long REPEATABLE READ
# reader in database a (a report, a pg_dump) rightly holds the barriers of
# a's crowded topics until it ends, but a database takes at most a quarter
# of the places.  The reader also holds the cluster's horizon back, so
# database b's topics need barriers too: b has no snapshot open, and its
# busy topic finds a place and writes nothing into its row.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('barrier_places_other_db');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.outbox_count_deltas = 16
idempotency.purge_interval = 0
});
$node->start;
$node->safe_psql('postgres', q{CREATE DATABASE a; CREATE DATABASE b});
$node->safe_psql('a', q{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('q' || i) FROM generate_series(1, 32) i;
	SELECT count(idempotency.publish('q' || i, '{}')) FROM generate_series(1, 32) i, generate_series(1, 12);
});
$node->safe_psql('b', q{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('busy');
	SELECT count(idempotency.publish('busy', '{}')) FROM generate_series(1, 40);
});

sub acks
{
	my ($db, $topic, $n) = @_;
	$node->safe_psql($db, qq{SELECT idempotency.ack(c.claim, ARRAY[c.id]) FROM idempotency.claim('$topic', 1) AS c})
	  for 1 .. $n;
}

# the long reader of database a
my $report = $node->background_psql('a', on_error_stop => 1);
$report->query_safe(q{BEGIN ISOLATION LEVEL REPEATABLE READ});
is($report->query_safe(q{SELECT sum(delivered) FROM idempotency.outbox_stats}), '0', 'the report reads 0');

# a's topics: 12 acks each, while the report runs
acks('a', "q$_", 12) for 1 .. 32;
is($node->safe_psql('a', q{SELECT sum(delivered) FROM idempotency.outbox_stats}), '384', "a's acks counted");

# b: nothing of b holds a snapshot
acks('b', 'busy', 40);
is($node->safe_psql('b', q{SELECT delivered FROM idempotency.outbox_stats}), '40', "b's acks counted");
is($node->safe_psql('b', q{SELECT purged_delivered FROM idempotency.outbox_topic}), '0',
	"a reader in database a sends none of b's acks into b's topic row");

$report->query_safe(q{COMMIT});
$report->quit;
$node->stop;
done_testing();
