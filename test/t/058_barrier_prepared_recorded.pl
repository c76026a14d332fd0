# The acked counts' barriers (src/outbox_counts.c): a transaction that held
# a snapshot when a barrier started and was then prepared (PREPARE
# TRANSACTION) holds no snapshot any more, so it does not hold the barrier
# (the barrier asks whether the recorded process has moved on to another
# transaction, not whether the prepared transaction has ended), and the
# topic's acks fold.  The same prepared transaction prepared before the
# barrier started holds nothing either; the cluster's horizon is held back
# by the prepared xid in both cases.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('barrier_prepared');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.outbox_count_deltas = 16
idempotency.purge_interval = 0
max_prepared_transactions = 5
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('control');
	SELECT idempotency.create_topic('recorded');
	SELECT count(idempotency.publish(t, '{}')) FROM unnest(ARRAY['control', 'recorded']) t, generate_series(1, 40);
	CREATE TABLE side (i int);
});

sub acks
{
	my ($topic, $n) = @_;
	$node->safe_psql('postgres', qq{SELECT idempotency.ack(c.claim, ARRAY[c.id]) FROM idempotency.claim('$topic', 1) AS c})
	  for 1 .. $n;
}
sub row
{
	return $node->safe_psql('postgres', qq{SELECT purged_delivered FROM idempotency.outbox_topic WHERE name = '$_[0]'});
}

# control: prepared before the barrier starts
my $p = $node->background_psql('postgres', on_error_stop => 1);
$p->query_safe(q{BEGIN; INSERT INTO side VALUES (1); PREPARE TRANSACTION 'before'});
acks('control', 40);
is($node->safe_psql('postgres', q{SELECT delivered FROM idempotency.outbox_stats WHERE topic = 'control'}), '40', 'control: 40 counted');
is(row('control'), '0', 'control: a prepared transaction that was never recorded holds no barrier');
$node->safe_psql('postgres', q{ROLLBACK PREPARED 'before'});

# recorded: holds a snapshot when the barrier starts, prepared right after
$p->query_safe(q{BEGIN ISOLATION LEVEL REPEATABLE READ; INSERT INTO side VALUES (2); SELECT count(*) FROM side});
acks('recorded', 8);
$p->query_safe(q{PREPARE TRANSACTION 'after'});
acks('recorded', 32);
is($node->safe_psql('postgres', q{SELECT delivered FROM idempotency.outbox_stats WHERE topic = 'recorded'}), '40', 'recorded: 40 counted');
is(row('recorded'), '0', 'recorded: once prepared, the transaction holds no snapshot and no barrier');
$node->safe_psql('postgres', q{ROLLBACK PREPARED 'after'});

$p->quit;
$node->stop;
done_testing();
