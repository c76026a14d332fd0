# The acked counts of one database wait only for the snapshots of that
# database.  A topic keeps a few transactions' counts apart until every
# snapshot that could miss them has ended; a transaction left open in
# another database (idle in transaction, a long report) has no snapshot
# of this one's rows, so it must not hold them: acks beyond those few
# would write their counts into the topic's row and wait for each other.
# The cluster's horizon cannot tell (every snapshot taken in this database
# while the other transaction runs has its xid as xmin); a barrier of the
# topic waits for the transactions of this database that held a snapshot
# when it marked the ended counts.  A snapshot of this database held
# open keeps the counts it cannot see apart, and reads the same numbers
# until it ends.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('counts_horizon');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.outbox_count_deltas = 16
idempotency.purge_interval = 0
});
$node->start;
is($node->safe_psql('postgres', q{SHOW idempotency.outbox_count_deltas}), '16',
	'16 ack transactions per topic kept apart, as set (64 by default)');
$node->safe_psql('postgres', q{CREATE DATABASE elsewhere});
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('busy');
	SELECT idempotency.publish('busy', '{}') FROM generate_series(1, 40);
});

# n acks of the topic, each in its own transaction (after publishing n
# more messages when asked)
sub acks
{
	my ($n, $publish) = @_;
	$node->safe_psql('postgres', qq{SELECT idempotency.publish('busy', '{}') FROM generate_series(1, $n)})
	  if $publish;
	$node->safe_psql('postgres', q{
		SELECT idempotency.ack(c.claim, ARRAY[c.id])
		  FROM idempotency.claim('busy', 1) AS c}) for 1 .. $n;
}

# a transaction with an xid, left open in another database
my $open = $node->background_psql('elsewhere', on_error_stop => 1);
$open->query_safe(q{BEGIN; SELECT pg_catalog.txid_current()});

# 40 acks, each in its own transaction
acks(40);
is($node->safe_psql('postgres', q{SELECT delivered FROM idempotency.outbox_stats}),
	'40', 'every ack is counted');
is($node->safe_psql('postgres', q{SELECT purged_delivered FROM idempotency.outbox_topic}),
	'0', "another database's open transaction sends no ack's count into the topic's row");

# a REPEATABLE READ reader of this database, beside the other database's
# transaction: the barrier waits for it, and it reads the same count
# however many acks commit meanwhile
my $reader = $node->background_psql('postgres', on_error_stop => 1);
$reader->query_safe(q{BEGIN ISOLATION LEVEL REPEATABLE READ});
is($reader->query_safe(q{SELECT delivered FROM idempotency.outbox_stats}),
	'40', 'a reader holds its snapshot');
acks(30, 1);
is($reader->query_safe(q{SELECT delivered FROM idempotency.outbox_stats}),
	'40', 'the reader sees none of the 30 acks committed since its snapshot');
is($node->safe_psql('postgres', q{SELECT delivered FROM idempotency.outbox_stats}),
	'70', 'a new snapshot sees all of them');
$reader->query_safe(q{COMMIT});
is($reader->query_safe(q{SELECT delivered FROM idempotency.outbox_stats}),
	'70', 'and so does the reader once its transaction ended');
$reader->quit;
acks(20, 1);
is($node->safe_psql('postgres', q{SELECT delivered FROM idempotency.outbox_stats}),
	'90', 'the acks after the reader ended are counted');

# the same transaction in this database holds them, as documented
$open->quit;
$open = $node->background_psql('postgres', on_error_stop => 1);
$open->query_safe(q{BEGIN; SELECT pg_catalog.txid_current()});
acks(20, 1);
is($node->safe_psql('postgres', q{SELECT delivered FROM idempotency.outbox_stats}),
	'110', 'every ack is counted beside an open transaction of this database');
$open->query_safe(q{COMMIT});
$open->quit;

$node->safe_psql('postgres', q{SELECT idempotency.purge()});
is($node->safe_psql('postgres', q{SELECT delivered FROM idempotency.outbox_stats}),
	'110', 'the purge writes them once');
is($node->safe_psql('postgres', q{SELECT purged_delivered FROM idempotency.outbox_topic}),
	'110', 'into the row');

$node->stop;
done_testing();
