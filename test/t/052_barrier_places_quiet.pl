# The acked counts' barriers (src/outbox_counts.c): a barrier's place comes
# back once it has passed, even if its topic is never acked again.  With a
# transaction open in another database (the case barriers are for), 32
# topics each crowded once and then quiet must not keep the places from a
# busy topic, whose acks would otherwise write their counts into its row.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('barrier_places_quiet');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.outbox_count_deltas = 16
idempotency.purge_interval = 0
});
$node->start;
$node->safe_psql('postgres', q{CREATE DATABASE elsewhere});
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('busy');
	SELECT idempotency.publish('busy', '{}') FROM generate_series(1, 40);
	SELECT idempotency.create_topic('q' || i) FROM generate_series(1, 32) i;
	SELECT idempotency.publish('q' || i, '{}') FROM generate_series(1, 32) i, generate_series(1, 8);
});

my $open = $node->background_psql('elsewhere', on_error_stop => 1);
$open->query_safe(q{BEGIN; SELECT pg_catalog.txid_current()});

sub ack_one
{
	my ($topic) = @_;
	$node->safe_psql('postgres', qq{
		SELECT idempotency.ack(c.claim, ARRAY[c.id])
		  FROM idempotency.claim('$topic', 1) AS c});
}

# 32 topics crowded once (8 acks each, one transaction each), then quiet
for my $t (1 .. 32)
{
	ack_one("q$t") for 1 .. 8;
}
is($node->safe_psql('postgres', q{SELECT sum(delivered) FROM idempotency.outbox_stats WHERE topic <> 'busy'}),
	'256', 'the quiet topics count every ack');

# the purge folds by the horizon only: it frees no place either
$node->safe_psql('postgres', q{SELECT idempotency.purge()});

ack_one('busy') for 1 .. 40;
is($node->safe_psql('postgres', q{SELECT delivered FROM idempotency.outbox_stats WHERE topic = 'busy'}),
	'40', 'every ack of the busy topic is counted');
is($node->safe_psql('postgres', q{SELECT purged_delivered FROM idempotency.outbox_topic WHERE name = 'busy'}),
	'0', "passed barriers of quiet topics leave a place for the busy topic: no ack's count goes into its row");

$open->query_safe(q{COMMIT});
$open->quit;
$node->stop;
done_testing();
