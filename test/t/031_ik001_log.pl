# What the server log holds after IK001 (a key reused with another request):
# nothing derived from either request.  A fingerprint is a plain SHA-256 of
# the request's canonical encoding, so even a prefix of it lets a log reader
# guess a small request offline (a card's last four digits and a PIN are
# 10^8 candidates).  The test logs every IK001 with full verbosity, through
# begin() and once(), then looks in the log for every 8-hex-digit (32-bit)
# piece of both requests' fingerprints.
#
# The statement itself is the caller's text (docs/clients.md: pass the
# request as a parameter; log_min_error_statement): it is kept out of the
# log here, so what is left is what the extension adds.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('ik001_log');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0
log_error_verbosity = verbose
log_min_error_statement = panic
});
$node->start;
$node->safe_psql('postgres', q{CREATE EXTENSION idempotency; CREATE ROLE app});

my $first = '{"card_last4": "4242", "pin": "1234", "amount": 100}';
my $second = '{"card_last4": "4243", "pin": "9876", "amount": 100}';
$node->safe_psql('postgres', qq{
	SET ROLE app;
	BEGIN;
	SELECT outcome FROM idempotency.begin('pay-1', '$first');
	SELECT idempotency.complete('pay-1', '{"status": 201}');
	COMMIT;
	SELECT outcome FROM idempotency.once('pay-2', '$first', 'SELECT 1');
});

my $log_start = -s $node->logfile;
my ($rc, $out, $err) = $node->psql('postgres', qq{
	SET ROLE app;
	SELECT outcome FROM idempotency.begin('pay-1', '$second');
});
like($err, qr/ERROR:  .*already used with a different request/,
	'begin() of a used key with another request: IK001');
($rc, $out, $err) = $node->psql('postgres', qq{
	SET ROLE app;
	SELECT outcome FROM idempotency.once('pay-2', '$second', 'SELECT 1');
});
like($err, qr/ERROR:  .*already used with a different request/, 'once() of a used key with another request: IK001');

my $log = slurp_file($node->logfile, $log_start);
is(scalar(() = $log =~ /ERROR:  IK001: /g), 2, 'the log holds both IK001 errors');

for my $request ([ 'first', $first ], [ 'second', $second ])
{
	my $hex = $node->safe_psql('postgres',
		qq{SELECT encode(idempotency.fingerprint('$request->[1]'), 'hex')});
	is(length($hex), 64, "the $request->[0] request's fingerprint is a SHA-256");
	my @found = grep { index(lc($log), substr($hex, $_, 8)) >= 0 } 0 .. 56;
	is_deeply(\@found, [],
		"no 32-bit piece of the $request->[0] request's fingerprint is in the log");
}

$node->stop;
done_testing();
