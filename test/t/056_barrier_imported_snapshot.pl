# The acked counts' barriers (src/outbox_counts.c): snapshots imported with SET
# TRANSACTION SNAPSHOT.  A barrier records the transactions of the database
# that hold a snapshot when it starts; an importer that imports after that
# from a recorded exporter is not recorded itself.
#  (a) imported before the barrier starts: recorded, keeps its numbers;
#  (b) imported after, the exporter still open: keeps its numbers;
#  (c) imported after, the exporter ends first: the documented limit
#      (src/outbox_counts.c, barrier_start()): the importer may read the
#      deltas the barrier folded (7 of the 8 acks after its snapshot, when
#      this was written), so only what every later snapshot reads is checked.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('barrier_imported');
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
	SELECT idempotency.create_topic('a');
	SELECT idempotency.create_topic('b');
	SELECT idempotency.create_topic('c');
	SELECT count(idempotency.publish(t, '{}')) FROM unnest(ARRAY['a', 'b', 'c']) t, generate_series(1, 40);
});
my $open = $node->background_psql('elsewhere', on_error_stop => 1);
$open->query_safe(q{BEGIN; SELECT pg_catalog.txid_current()});

sub acks
{
	my ($topic, $n) = @_;
	$node->safe_psql('postgres', qq{SELECT idempotency.ack(c.claim, ARRAY[c.id]) FROM idempotency.claim('$topic', 1) AS c})
	  for 1 .. $n;
}
sub read_q { return qq{SELECT delivered FROM idempotency.outbox_stats WHERE topic = '$_[0]'}; }
sub exporter
{
	my $e = $node->background_psql('postgres', on_error_stop => 1);
	$e->query_safe(q{BEGIN ISOLATION LEVEL REPEATABLE READ});
	$e->query_safe(read_q('a'));
	return ($e, $e->query_safe(q{SELECT pg_export_snapshot()}));
}
sub importer
{
	my $i = $node->background_psql('postgres', on_error_stop => 1);
	$i->query_safe(qq{BEGIN ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION SNAPSHOT '$_[0]'});
	return $i;
}

# (a)
my ($e, $sid) = exporter();
my $i = importer($sid);
acks('a', 12);
$e->query_safe(q{COMMIT});
acks('a', 12);
is($i->query_safe(read_q('a')), '0', '(a) imported before the barrier: 0 acks seen');
$i->query_safe(q{COMMIT});

# (b)
($e, $sid) = exporter();
acks('b', 12);
$i = importer($sid);
acks('b', 12);
is($i->query_safe(read_q('b')), '0', '(b) imported after the barrier, exporter open: 0 acks seen');
$e->query_safe(q{COMMIT});
$i->query_safe(q{COMMIT});

# (c)
($e, $sid) = exporter();
acks('c', 8);
$i = importer($sid);
$e->query_safe(q{COMMIT});
acks('c', 8);
note('(c) the importer reads ' . $i->query_safe(read_q('c')) . ' acks (the documented limit)');
$i->query_safe(q{COMMIT});
is($node->safe_psql('postgres', read_q('c')), '16', '(c) after the importer ended, every ack is counted once');

$open->query_safe(q{COMMIT});
$_->quit for ($e, $i, $open);
$node->stop;
done_testing();
