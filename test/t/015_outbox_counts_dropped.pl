# Acked counts in shared memory of a topic dropped before the purge wrote them
# do not stay there for good.  The table
# of counts has 4096 entries for the whole cluster; the purge wrote a topic's
# counts into its row and subtracted them, but a dropped topic has no row, so
# its entry stayed until a restart.  After 4096 topics dropped that way (a
# test suite's, a tenant's, in any database) every new topic's acks were
# counted nowhere: ack deleted the message and outbox_stats showed it neither
# published nor delivered.
#
# Here: twice 2050 topics, one message each acked, dropped before a purge;
# the purge; then a new topic's acked message is counted in outbox_stats, before
# and after the next purge writes it into the topic's row.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('counts_dropped');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0
});
$node->start;
$node->safe_psql('postgres', q{CREATE EXTENSION idempotency});

# two rounds of 2050 (fewer than 4096 topics with counts at once, which the
# docs say may lose counts): each acked, dropped, then the purge
for my $round (1, 2)
{
	$node->safe_psql('postgres', qq{
		DO \$\$
		BEGIN
		  FOR i IN 1 .. 2050 LOOP
		    PERFORM idempotency.create_topic('gone-$round-' || i);
		    PERFORM idempotency.publish('gone-$round-' || i, '{}');
		    PERFORM idempotency.ack(c.claim, ARRAY[c.id])
		       FROM idempotency.claim('gone-$round-' || i) AS c;
		  END LOOP;
		END \$\$;
	});
	is($node->safe_psql('postgres', q{SELECT count(*) || ' ' || sum(delivered) FROM idempotency.outbox_stats}),
		'2050 2050', "round $round: 2050 topics, one message each delivered (counted in shared memory)");
	$node->safe_psql('postgres', qq{
		DO \$\$
		BEGIN
		  FOR i IN 1 .. 2050 LOOP
		    PERFORM idempotency.drop_topic('gone-$round-' || i);
		  END LOOP;
		END \$\$;
	});
	$node->safe_psql('postgres', q{SELECT idempotency.purge()});
}

$node->safe_psql('postgres', q{
	SELECT idempotency.create_topic('fresh');
	SELECT idempotency.publish('fresh', '{}');
	SELECT idempotency.ack(c.claim, ARRAY[c.id]) FROM idempotency.claim('fresh') AS c;
});
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.outbox_message}),
	'0', 'ack deleted the new topic\'s message');
is($node->safe_psql('postgres', q{SELECT published || ' ' || delivered
		FROM idempotency.outbox_stats WHERE topic = 'fresh'}),
	'1 1', 'outbox_stats counts it published and delivered');
$node->safe_psql('postgres', q{SELECT idempotency.purge()});
is($node->safe_psql('postgres', q{SELECT purged_delivered FROM idempotency.outbox_topic WHERE name = 'fresh'}),
	'1', 'the purge writes it into the topic\'s row');
is($node->safe_psql('postgres', q{SELECT published || ' ' || delivered
		FROM idempotency.outbox_stats WHERE topic = 'fresh'}),
	'1 1', 'counted once after the purge');

$node->stop;
done_testing();
