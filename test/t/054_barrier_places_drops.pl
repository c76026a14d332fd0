# The acked counts' barriers (src/outbox_counts.c): places held by barriers
# of a database or an install that is dropped come back (DROP DATABASE,
# DROP EXTENSION then CREATE EXTENSION), and are reused: 40 topics crowded
# one after the other each fold through a barrier, none writes into its
# row.  A transaction stays open in database elsewhere all along, so only
# the barriers fold.  Dropped topics (drop_topic()) give their places back
# once their barriers have passed.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('barrier_places_drops');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.outbox_count_deltas = 16
idempotency.purge_interval = 0
});
$node->start;
$node->safe_psql('postgres', q{CREATE DATABASE elsewhere});
my $open = $node->background_psql('elsewhere', on_error_stop => 1);
$open->query_safe(q{BEGIN; SELECT pg_catalog.txid_current()});

sub ack_n
{
	my ($db, $topic, $n) = @_;
	$node->safe_psql($db, qq{
		SELECT idempotency.ack(c.claim, ARRAY[c.id])
		  FROM idempotency.claim('$topic', 1) AS c}) for 1 .. $n;
}

# 32 quiet topics in db, each crowded once
sub fill
{
	my ($db) = @_;
	$node->safe_psql($db, q{
		CREATE EXTENSION IF NOT EXISTS idempotency;
		SELECT idempotency.create_topic('q' || i) FROM generate_series(1, 32) i;
		SELECT idempotency.publish('q' || i, '{}') FROM generate_series(1, 32) i, generate_series(1, 8);
	});
	ack_n($db, "q$_", 8) for 1 .. 32;
}

# the row writes of 40 acks of a new topic
sub busy
{
	my ($db, $topic) = @_;
	$node->safe_psql($db, qq{
		SELECT idempotency.create_topic('$topic');
		SELECT idempotency.publish('$topic', '{}') FROM generate_series(1, 40);
	});
	ack_n($db, $topic, 40);
	is($node->safe_psql($db, qq{SELECT delivered FROM idempotency.outbox_stats WHERE topic = '$topic'}),
		'40', "$topic: every ack counted");
	return $node->safe_psql($db, qq{SELECT purged_delivered FROM idempotency.outbox_topic WHERE name = '$topic'});
}

$node->safe_psql('postgres', q{CREATE EXTENSION idempotency});

# a dropped database's barriers
$node->safe_psql('postgres', q{CREATE DATABASE x});
fill('x');
$node->safe_psql('postgres', q{DROP DATABASE x});
is(busy('postgres', 'after_dropdb'), '0', 'DROP DATABASE gives back the places of its barriers');

# a dropped install's barriers
$node->safe_psql('postgres', q{CREATE DATABASE y});
fill('y');
$node->safe_psql('y', q{DROP EXTENSION idempotency CASCADE; CREATE EXTENSION idempotency});
is(busy('y', 'after_dropext'), '0', 'DROP EXTENSION gives back the places of its barriers');

# places reused: 40 topics crowded one after the other
$node->safe_psql('postgres', q{
	SELECT idempotency.create_topic('r' || i) FROM generate_series(1, 40) i;
	SELECT idempotency.publish('r' || i, '{}') FROM generate_series(1, 40) i, generate_series(1, 20);
});
ack_n('postgres', "r$_", 20) for 1 .. 40;
is($node->safe_psql('postgres', q{SELECT sum(delivered) FROM idempotency.outbox_stats WHERE topic LIKE 'r%'}),
	'800', '40 topics: every ack counted');
is($node->safe_psql('postgres', q{SELECT sum(purged_delivered) FROM idempotency.outbox_topic WHERE name LIKE 'r%'}),
	'0', '40 topics crowded one after the other each fold through a barrier');

# a dropped topic's barrier: the topic can never be acked again
$node->safe_psql('postgres', q{CREATE DATABASE z});
fill('z');
$node->safe_psql('z', q{SELECT idempotency.drop_topic('q' || i, true) FROM generate_series(1, 32) i});
$node->safe_psql('z', q{SELECT idempotency.purge()});
is(busy('z', 'after_droptopic'), '0', 'dropped topics give back the places of their barriers');

# once the other database's transaction ended, a purge folds by the horizon
# and the places come back
$open->query_safe(q{COMMIT});
$node->safe_psql('z', q{SELECT idempotency.purge()});
$open->query_safe(q{BEGIN; SELECT pg_catalog.txid_current()});
is(busy('z', 'after_horizon'), '0', 'after the horizon passed, the places are free again');

$open->query_safe(q{COMMIT});
$open->quit;
$node->stop;
done_testing();
