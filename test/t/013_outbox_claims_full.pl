# The claim table in shared memory holds idempotency.outbox_claims entries
# and no more.  The table is a shared
# dynahash: hash_search(HASH_ENTER_NULL) returns NULL only when the whole
# shared memory segment is exhausted, not at its max_size, so with the GUC
# at its minimum (64) one relay claimed 28 000 messages, ate the segment's
# spare memory, and every other session of the cluster then failed to take
# locks ("out of shared memory", 53200) until a restart.
#
# Here: with outbox_claims = 64, a claim of 200 hands out 64 and warns
# (53400) naming the GUC, a second claim hands out none, the spare shared
# memory is what it was before the claims, a session can still take
# thousands of locks, and once the claims lapse the next claim takes them
# over (the lapsed entries are dropped) and gets 64 again.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('claims_full');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0
idempotency.outbox_claims = 64
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('big');
	SELECT count(idempotency.publish('big', jsonb_build_object('i', i)))
	  FROM generate_series(1, 40000) i;
});

# spare shared memory (the anonymous free block) before any claim
my $free_before = $node->safe_psql('postgres',
	q{SELECT allocated_size FROM pg_shmem_allocations WHERE name IS NULL});

my ($stdout, $stderr);
$node->psql('postgres', q{SELECT count(*) FROM idempotency.claim('big', 200, '1 hour')},
	stdout => \$stdout, stderr => \$stderr,
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
is($stdout, '64', 'a claim of 200 with outbox_claims = 64 hands out 64');
like($stderr, qr/WARNING:  53400: idempotency.outbox_claims \(64\)/,
	'and warns 53400 naming the GUC');

$node->psql('postgres', q{SELECT count(*) FROM idempotency.claim('big', 200, '1 hour')},
	stdout => \$stdout, stderr => \$stderr);
is($stdout, '0', 'a second claim hands out none while the 64 are held');
like($stderr, qr/idempotency.outbox_claims \(64\)/, 'and warns again');

# many relays, big batches: still 64 in flight
for my $i (1 .. 9)
{
	$node->psql('postgres', q{SELECT count(*) FROM idempotency.claim('big', 5000, '1 hour')});
}
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.outbox_in_flight}),
	'64', 'outbox_in_flight shows 64 claims after nine more claims of 5000');

my $free_after = $node->safe_psql('postgres',
	q{SELECT allocated_size FROM pg_shmem_allocations WHERE name IS NULL});
cmp_ok($free_after, '>=', $free_before - 8192,
	"the claims took no spare shared memory ($free_before bytes before, $free_after after)");

# the lock table can still grow into the spare memory
is($node->safe_psql('postgres',
		q{SELECT count(pg_advisory_xact_lock(i)) FROM generate_series(1, 8000) i}),
	'8000', 'another session still takes 8000 locks');

# nothing was written: every message still pending, attempts 0
is($node->safe_psql('postgres',
		q{SELECT state || ' ' || count(*) || ' ' || max(attempts) FROM idempotency.outbox_message GROUP BY state}),
	'pending 40000 0', 'the rows are unchanged: 40000 pending, attempts 0');

# lapsed claims are dropped when the table is full: the next claim gets 64
$node->restart;
$node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.claim('big', 64, '1 ms')});
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.outbox_in_flight}),
	'64', 'after a restart: 64 short claims');
$node->safe_psql('postgres', q{SELECT pg_sleep(0.05)});
$node->psql('postgres', q{SELECT count(*) FROM idempotency.claim('big', 200, '1 hour')},
	stdout => \$stdout, stderr => \$stderr);
is($stdout, '64', 'once they lapse the next claim takes 64 (lapsed ones dropped or taken over)');

$node->stop;
done_testing();
