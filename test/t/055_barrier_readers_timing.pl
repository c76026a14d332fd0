# The acked counts' barriers (src/outbox_counts.c), deterministic: readers of the
# database whose snapshots are taken before, between and after the barrier
# marks, a READ COMMITTED cursor declared before the acks and fetched after
# many, acks in a savepoint rolled back, PREPARE TRANSACTION then COMMIT or
# ROLLBACK PREPARED around the barrier, a purge inside REPEATABLE READ and
# plain purges beside old readers.  A transaction stays open in another
# database, so the horizon folds nothing.  Every reader must keep its
# numbers; every new snapshot must see exactly the committed acks.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('barrier_timing');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.outbox_count_deltas = 16
idempotency.purge_interval = 0
max_prepared_transactions = 5
});
$node->start;
$node->safe_psql('postgres', q{CREATE DATABASE elsewhere});
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('busy');
	SELECT count(idempotency.publish('busy', '{}')) FROM generate_series(1, 200);
});
my $open = $node->background_psql('elsewhere', on_error_stop => 1);
$open->query_safe(q{BEGIN; SELECT pg_catalog.txid_current()});

my $ack = q{SELECT idempotency.ack(c.claim, ARRAY[c.id]) FROM idempotency.claim('busy', 1) AS c;};
my $read = q{SELECT delivered FROM idempotency.outbox_stats WHERE topic = 'busy'};
sub acks { $node->safe_psql('postgres', $ack) for 1 .. $_[0]; }
sub stats { return $node->safe_psql('postgres', $read); }
sub session
{
	my $s = $node->background_psql('postgres', on_error_stop => 1);
	$s->query_safe($_) for @_;
	return $s;
}

my $r1 = session(q{BEGIN ISOLATION LEVEL REPEATABLE READ});
is($r1->query_safe($read), '0', 'r1 before any ack');
my $c1 = session(q{BEGIN}, qq{DECLARE cur CURSOR FOR $read});

acks(5);
is(stats(), '5', '5 acks');
my $r2 = session(q{BEGIN ISOLATION LEVEL REPEATABLE READ});
is($r2->query_safe($read), '5', 'r2 after 5 acks');

my $p = session(q{BEGIN}, $ack, q{PREPARE TRANSACTION 'p1'});
is(stats(), '5', 'a prepared ack is not counted');
$node->safe_psql('postgres', qq{BEGIN; SAVEPOINT s; $ack ROLLBACK TO SAVEPOINT s; $ack COMMIT;});
is(stats(), '6', 'an ack rolled back to its savepoint is not counted, the next one is');
$p->query_safe(qq{BEGIN; $ack PREPARE TRANSACTION 'p2'});
acks(6);
is(stats(), '12', '6 acks more');
$node->safe_psql('postgres', q{COMMIT PREPARED 'p1'});
is(stats(), '13', 'COMMIT PREPARED counts its ack');
$node->safe_psql('postgres', q{ROLLBACK PREPARED 'p2'});
is(stats(), '13', 'ROLLBACK PREPARED counts nothing');
is($r1->query_safe($read), '0', 'r1 keeps its numbers');
is($r2->query_safe($read), '5', 'r2 keeps its numbers');
is($c1->query_safe(q{FETCH cur}), '0', 'the cursor reads as of its DECLARE');

my $r3 = session(q{BEGIN ISOLATION LEVEL SERIALIZABLE});
is($r3->query_safe($read), '13', 'r3 (serializable) after the prepared ones');
$r1->query_safe(q{COMMIT});
$c1->query_safe(q{COMMIT});
acks(10);
is(stats(), '23', '10 acks more');
is($r2->query_safe($read), '5', 'r2 keeps its numbers after r1 ended');
is($r3->query_safe($read), '13', 'r3 keeps its numbers');
$r2->query_safe(q{COMMIT});
acks(10);
is(stats(), '33', '10 acks more after r2 ended');
is($r3->query_safe($read), '13', 'r3 keeps its numbers after r2 ended');

# a purge inside REPEATABLE READ, beside r3
my $pr = session(q{BEGIN ISOLATION LEVEL REPEATABLE READ});
is($pr->query_safe($read), '33', 'the purging transaction reads 33');
$pr->query_safe(q{SELECT idempotency.purge()});
is($pr->query_safe($read), '33', 'and 33 after its purge');
is($r3->query_safe($read), '13', 'r3 does not see the open purge');
is(stats(), '33', 'nor does a new snapshot count it twice');
$pr->query_safe(q{COMMIT});
is(stats(), '33', 'the committed purge counts nothing twice');
is($r3->query_safe($read), '13', 'r3 does not see the committed purge');

my $r4 = session(q{BEGIN ISOLATION LEVEL REPEATABLE READ});
is($r4->query_safe($read), '33', 'r4 after the purge');
acks(10);
$node->safe_psql('postgres', q{SELECT idempotency.purge()});
is(stats(), '43', '10 acks more, purged');
is($r3->query_safe($read), '13', 'r3 still 13');
is($r4->query_safe($read), '33', 'r4 still 33');
$r3->query_safe(q{COMMIT});
$r4->query_safe(q{COMMIT});
acks(16);
is(stats(), '59', '16 acks more');
$node->safe_psql('postgres', q{SELECT idempotency.purge()});
is(stats(), '59', 'purged, 59');
$open->query_safe(q{COMMIT});
acks(1);
$node->safe_psql('postgres', q{SELECT idempotency.purge()});
$node->safe_psql('postgres', q{SELECT idempotency.purge()});
is(stats(), '60', 'once the other database ended, 60');
is($node->safe_psql('postgres', q{SELECT purged_delivered FROM idempotency.outbox_topic}), '60',
	'all in the row');
my @bad = grep { /WARNING|ERROR|TRAP|PANIC/ } split /\n/, slurp_file($node->logfile);
is(scalar(@bad), 0, 'no WARNING or ERROR in the server log') or diag join("\n", @bad);

$_->quit for ($r1, $r2, $r3, $r4, $c1, $p, $pr, $open);
$node->stop;
done_testing();
