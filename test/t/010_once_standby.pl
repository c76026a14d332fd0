# One round trip on a hot standby: lookup() reads the key (no lock, no
# write), once() replays a finished key without running its statement, and a
# new key's work is refused as any write is (25006), leaving nothing behind.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->start;
$primary->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE TABLE payment (id serial PRIMARY KEY, amount numeric NOT NULL);
	SELECT outcome FROM idempotency.once('pay-1', '{"amount": 5}',
		'INSERT INTO payment (amount) VALUES ($1) RETURNING id, amount', '5');
});
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);

is($standby->safe_psql('postgres',
		q{SELECT status, attempts, retry_after IS NULL FROM idempotency.lookup('pay-1')}),
	'completed|1|t', 'lookup() on the standby: the finished key');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM idempotency.lookup('pay-2')}),
	'0', 'lookup() on the standby: no row for an unknown key');

my $once = q{SELECT outcome, response FROM idempotency.once('%s', '{"amount": 5}',
	'INSERT INTO payment (amount) VALUES ($1) RETURNING id, amount', '5')};
is($standby->safe_psql('postgres', sprintf($once, 'pay-1')),
	'replay|{"id": 1, "amount": 5}', 'once() on the standby replays a finished key');

my ($ret, $out, $err) = $standby->psql('postgres', sprintf($once, 'pay-2'),
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/25006/, 'once() of a new key on the standby: the write is refused (25006)');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM idempotency.lookup('pay-2')}),
	'0', 'and the key is still free');

done_testing();
