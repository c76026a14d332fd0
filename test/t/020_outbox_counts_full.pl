# The acked counts in shared memory never lose a count when their table is
# full, and one role cannot take the places of others.  The table has a
# fixed number of places for the whole cluster (one per topic with counts
# the purge has not written yet).  One role acks one message in each of
# more topics than there are places; then another role, in another
# database, acks a message: both are counted in outbox_stats, before and
# after the purge writes the counts into the topics' rows.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('counts_full');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE ROLE regress_filler;
	CREATE ROLE regress_other;
	CREATE DATABASE other;
});
$node->safe_psql($_, q{CREATE EXTENSION idempotency}) for ('postgres', 'other');

# more topics than the table has places (4096), one message each acked
my $n = 4200;
$node->safe_psql('postgres', qq{
	SET ROLE regress_filler;
	DO \$\$
	BEGIN
	  FOR i IN 1 .. $n LOOP
	    PERFORM idempotency.create_topic('fill-' || i);
	    PERFORM idempotency.publish('fill-' || i, '{}');
	    PERFORM idempotency.ack(c.claim, ARRAY[c.id])
	       FROM idempotency.claim('fill-' || i) AS c;
	  END LOOP;
	END \$\$;
});
is($node->safe_psql('postgres', q{SET ROLE regress_filler;
		SELECT count(*) || ' ' || sum(published) || ' ' || sum(delivered)
		  FROM idempotency.outbox_stats}),
	"$n $n $n", "every one of the filler's $n acked messages is counted");

# the filler holds at most its share of the places (512): the acks that
# found none wrote their counts into their topics' rows
is($node->safe_psql('postgres', q{SELECT sum(purged_delivered) FROM idempotency.outbox_topic}),
	$n - 512, "the filler's counts beyond its 512 places are in its topics' rows");

# another role, another database: its ack is counted too
$node->safe_psql('other', q{
	SET ROLE regress_other;
	SELECT idempotency.create_topic('mine');
	SELECT idempotency.publish('mine', '{}');
	SELECT idempotency.ack(c.claim, ARRAY[c.id]) FROM idempotency.claim('mine') AS c;
});
is($node->safe_psql('other', q{SET ROLE regress_other;
		SELECT published || ' ' || delivered FROM idempotency.outbox_stats}),
	'1 1', "another role's ack in another database is counted");
is($node->safe_psql('other', q{SELECT purged_delivered FROM idempotency.outbox_topic}),
	'0', 'in a place of shared memory (not in the row): the filler took none of its places');

# the same role in the filler's database, on a new topic
$node->safe_psql('postgres', q{
	SET ROLE regress_other;
	SELECT idempotency.create_topic('late');
	SELECT idempotency.publish('late', '{}');
	SELECT idempotency.ack(c.claim, ARRAY[c.id]) FROM idempotency.claim('late') AS c;
});
is($node->safe_psql('postgres', q{SET ROLE regress_other;
		SELECT published || ' ' || delivered FROM idempotency.outbox_stats}),
	'1 1', "another role's ack in the filler's database is counted");
is($node->safe_psql('postgres', q{SELECT purged_delivered FROM idempotency.outbox_topic WHERE name = 'late'}),
	'0', 'also in shared memory');

# the purges write the counts into the rows: nothing counted twice or lost
# (a purge writes at most 1000 topics' counts)
$node->safe_psql('postgres', q{SET ROLE regress_filler; SELECT idempotency.purge()})
  for 1 .. 5;
$node->safe_psql('postgres', q{SET ROLE regress_other; SELECT idempotency.purge()});
$node->safe_psql('other', q{SET ROLE regress_other; SELECT idempotency.purge()});
is($node->safe_psql('postgres', q{
		SELECT count(*) || ' ' || sum(published) || ' ' || sum(delivered)
		  FROM idempotency.outbox_stats}),
	($n + 1) . ' ' . ($n + 1) . ' ' . ($n + 1), 'after the purges: every message counted once');
is($node->safe_psql('postgres', q{SELECT sum(purged_delivered) FROM idempotency.outbox_topic}),
	$n + 1, 'the purges wrote every count into the topics\' rows');
is($node->safe_psql('other', q{SELECT published || ' ' || delivered FROM idempotency.outbox_stats}),
	'1 1', 'and in the other database');

$node->stop;
done_testing();
