# A key's identity across pg_dump and a restore, from 0.5.0 and from 0.6.0,
# into an empty database and into one that already has the extension (it
# was in template1 before the source had it, so the target's own
# derive_secret row is the older one).  The source has keys in flight: a
# completed key, a lease held for an hour with a recovery point, and a
# lease that lapses with a recovery point.  After each restore the
# completed key replays, the held lease stays held (IK002) and its holder
# completes it, the lapsed lease is taken over (retry, attempt 2, from its
# point), and both leases derive the downstream keys they derived on the
# source; keys the target had in flight before the restore keep theirs.
# pg_dump writes CREATE EXTENSION without a version, so a 0.5.0 dump is
# restored into 0.6.0 directly: its key rows have no derive_seed.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $tgt = PostgreSQL::Test::Cluster->new('target');
$tgt->init;
$tgt->start;
# the extension in template1 first: its secret is older than the sources'
$tgt->safe_psql('template1', q{CREATE EXTENSION idempotency});
# roles have other oids on the target
$tgt->safe_psql('postgres', q{CREATE ROLE filler_1; CREATE ROLE filler_2; CREATE ROLE payer});

my $src = PostgreSQL::Test::Cluster->new('source');
$src->init;
$src->start;
$src->safe_psql('postgres', q{CREATE ROLE payer});

sub as_payer { my ($node, $db, $sql) = @_; return $node->safe_psql($db, "SET ROLE payer; $sql"); }

# keys in flight on a source database of version $v
sub fill
{
	my ($db, $v) = @_;
	$src->safe_psql('postgres', "CREATE DATABASE $db");
	$src->safe_psql($db, "CREATE EXTENSION idempotency VERSION '$v'");
	is($src->safe_psql($db, q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
		$v, "$db: the source is version $v");
	as_payer($src, $db, q{
		BEGIN;
		SELECT outcome FROM idempotency.begin('done-1', '{"amount": 5}');
		SELECT idempotency.complete('done-1', '{"paid": "ch_done"}');
		COMMIT;
		SELECT outcome FROM idempotency.begin('held-1', lease => '1 hour');
		SELECT outcome FROM idempotency.begin('lapsed-1', lease => '1 millisecond');
	});
	as_payer($src, $db, q{SELECT idempotency.checkpoint('held-1', 'charged', '{"charge": "ch_held"}', 1)});
	my %k;
	$k{held} = as_payer($src, $db, q{SELECT idempotency.derive_key('held-1', 'charge')});
	$k{lapsed} = as_payer($src, $db, q{SELECT idempotency.derive_key('lapsed-1', 'charge')});
	like($k{held}, qr/^idk_[a-z2-7]{26}$/, "$db: the held lease derives a key");
	isnt($k{held}, $k{lapsed}, "$db: each key derives its own");
	return \%k;
}

my %derived = (
	'0.5.0' => fill('src5', '0.5.0'),
	'0.6.0' => fill('src6', '0.6.0'));
my %dump;
for my $v ('0.5.0', '0.6.0')
{
	my $db = $v eq '0.5.0' ? 'src5' : 'src6';
	$dump{$v} = $src->basedir . "/$db.sql";
	$src->command_ok([ 'pg_dump', '-d', $src->connstr($db), '-f', $dump{$v} ], "pg_dump of $v");
}

for my $v ('0.5.0', '0.6.0')
{
	for my $into ('empty', 'existing')
	{
		my $db = 'r' . ($v eq '0.5.0' ? '5' : '6') . "_$into";
		my $t = "$v dump into an $into database";
		my $local;
		if ($into eq 'empty')
		{
			$tgt->safe_psql('postgres', "CREATE DATABASE $db TEMPLATE template0");
		}
		else
		{
			$tgt->safe_psql('postgres', "CREATE DATABASE $db TEMPLATE template1");
			# a key of the target's own, in flight before the restore
			as_payer($tgt, $db, q{SELECT outcome FROM idempotency.begin('local-1', lease => '1 hour')});
			$local = as_payer($tgt, $db, q{SELECT idempotency.derive_key('local-1', 'charge')});
		}
		# as a user restores: errors (the schema that exists) reported, not fatal
		my ($out, $err) = ('', '');
		$tgt->psql($db, undef, extra_params => [ '-f', $dump{$v} ], on_error_stop => 0,
			stdout => \$out, stderr => \$err);
		my @errors = grep { /ERROR/ && !/schema "idempotency" already exists/ } split /\n/, $err;
		is("@errors", '', "$t: restored without other errors");
		is($tgt->safe_psql($db, q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
			'0.6.0', "$t: the extension is 0.6.0");

		is(as_payer($tgt, $db, q{SELECT outcome || ' ' || response::text FROM idempotency.begin('done-1', '{"amount": 5}')}),
			'replay {"paid": "ch_done"}', "$t: the completed key replays");
		is(as_payer($tgt, $db, q{SELECT idempotency.derive_key('held-1', 'charge')}),
			$derived{$v}{held}, "$t: the held lease derives the key it derived on the source");
		my ($rc, $o, $e) = $tgt->psql($db, q{SET ROLE payer; SET idempotency.lock_wait = 0;
			SELECT outcome FROM idempotency.begin('held-1', lease => '1 hour')}, on_error_die => 0);
		like($e, qr/IK002|in progress/, "$t: the held lease is still held");
		as_payer($tgt, $db, q{SELECT idempotency.complete('held-1', '"done by its holder"', attempt => 1)});
		is(as_payer($tgt, $db, q{SELECT status FROM idempotency.lookup('held-1')}),
			'completed', "$t: its holder completes it");

		$tgt->poll_query_until($db, q{SELECT locked_until < now() FROM idempotency.idempotency_key WHERE key = 'lapsed-1'})
		  or die 'the lapsed lease is not lapsed';
		is(as_payer($tgt, $db, q{SELECT outcome || ' ' || attempts FROM idempotency.begin('lapsed-1', lease => '1 hour')}),
			'retry 2', "$t: the lapsed lease is taken over");
		is(as_payer($tgt, $db, q{SELECT idempotency.derive_key('lapsed-1', 'charge')}),
			$derived{$v}{lapsed}, "$t: its retry derives the key the source derived");
		# the retry's write froze a seed into a row restored without one:
		# a rename from then on changes nothing
		$tgt->safe_psql($db, q{ALTER ROLE payer RENAME TO payer_renamed});
		is($tgt->safe_psql($db, q{SET ROLE payer_renamed; SELECT idempotency.derive_key('lapsed-1', 'charge')}),
			$derived{$v}{lapsed}, "$t: after a rename too");
		$tgt->safe_psql($db, q{ALTER ROLE payer_renamed RENAME TO payer});
		if (defined $local)
		{
			is(as_payer($tgt, $db, q{SELECT idempotency.derive_key('local-1', 'charge')}),
				$local, "$t: the target's own key in flight keeps its derived key");
		}
		# new keys after the restore derive keys of their own
		as_payer($tgt, $db, q{SELECT outcome FROM idempotency.begin('new-1', lease => '1 hour')});
		my $new = as_payer($tgt, $db, q{SELECT idempotency.derive_key('new-1', 'charge')});
		like($new, qr/^idk_[a-z2-7]{26}$/, "$t: a new key derives");
	}
}

$src->stop;
$tgt->stop;
done_testing();
