# Keys of both kinds through a second dump: a 0.6.0 database that holds a
# key restored from a dump of 0.5.0 (no derive_seed: it derives with the
# secret restored from that dump) beside a key of its own (a seed that
# names its secret) is dumped with pg_dump -Fc and restored with
# pg_restore, into an empty database and into one that already has the
# extension (from template1, so its own secret is another, older row).
# Each key derives the downstream key it derived before, in both; the
# application role reads no secret but derives.  Without the secret
# restored from 0.5.0 (a row deleted, which the docs forbid), a key that
# derives with it is 55000 and writes nothing: never another derived key.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('restore_twice');
$node->init;
$node->start;
$node->safe_psql('postgres', q{CREATE ROLE payer});
sub as_payer { my ($db, $sql) = @_; return $node->safe_psql($db, "SET ROLE payer; $sql"); }

# the extension in template1 first: the existing target's secret is the oldest
$node->safe_psql('template1', q{CREATE EXTENSION idempotency});

# a: 0.5.0 with a lease in flight
$node->safe_psql('postgres', q{CREATE DATABASE a TEMPLATE template0});
$node->safe_psql('a', q{CREATE EXTENSION idempotency VERSION '0.5.0'});
as_payer('a', q{SELECT outcome FROM idempotency.begin('old-1', lease => '1 hour')});
my $old = as_payer('a', q{SELECT idempotency.derive_key('old-1', 'charge')});
like($old, qr/^idk_[a-z2-7]{26}$/, '0.5.0: the lease derives a key');

# b: a's dump restored onto 0.6.0, then a key of b's own
my $dir = $node->basedir;
$node->command_ok([ 'pg_dump', '-d', $node->connstr('a'), '-f', "$dir/a.sql" ], 'pg_dump of 0.5.0');
$node->safe_psql('postgres', q{CREATE DATABASE b TEMPLATE template0});
$node->psql('b', undef, extra_params => [ '-f', "$dir/a.sql" ], on_error_stop => 0);
as_payer('b', q{SELECT outcome FROM idempotency.begin('new-1', lease => '1 hour')});
my $new = as_payer('b', q{SELECT idempotency.derive_key('new-1', 'charge')});
is($node->safe_psql('b', q{
		SELECT string_agg(key || ':' || COALESCE(pg_catalog.get_byte(derive_seed, 0)::text, 'none'), ',' ORDER BY key)
		  FROM idempotency.idempotency_key}),
	'new-1:2,old-1:none', 'b holds a seedless key restored from 0.5.0 and a key with a seed');
is(as_payer('b', q{SELECT idempotency.derive_key('old-1', 'charge')}), $old,
	'b: the restored key derives what 0.5.0 derived');

# b dumped with pg_dump -Fc, restored with pg_restore
$node->command_ok([ 'pg_dump', '-Fc', '-d', $node->connstr('b'), '-f', "$dir/b.dump" ], 'pg_dump -Fc of b');
for my $into ('empty', 'existing')
{
	my $db = "c_$into";
	my $local;
	$node->safe_psql('postgres', "CREATE DATABASE $db TEMPLATE " . ($into eq 'empty' ? 'template0' : 'template1'));
	if ($into eq 'existing')
	{
		as_payer($db, q{SELECT outcome FROM idempotency.begin('local-1', lease => '1 hour')});
		$local = as_payer($db, q{SELECT idempotency.derive_key('local-1', 'charge')});
	}
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'pg_restore', '-d', $node->connstr($db), "$dir/b.dump" ], '>', \$out, '2>', \$err);
	my @errors = grep { /error:/ && !/schema "idempotency" already exists/ && !/errors ignored on restore/ }
	  split /\n/, $err;
	is("@errors", '', "into an $into database: pg_restore reports no other error");
	is(as_payer($db, q{SELECT idempotency.derive_key('old-1', 'charge')}), $old,
		"into an $into database: the key restored twice derives what 0.5.0 derived");
	is(as_payer($db, q{SELECT idempotency.derive_key('new-1', 'charge')}), $new,
		"into an $into database: b's own key derives what it derived in b");
	is(as_payer($db, q{SELECT idempotency.derive_key('local-1', 'charge')}), $local,
		"into an $into database: its own key in flight keeps its derived key") if defined $local;
	my (undef, undef, $denied) = $node->psql($db, q{SET ROLE payer; SELECT count(*) FROM idempotency.derive_secret});
	like($denied, qr/permission denied for table derive_secret/,
		"into an $into database: the application role reads no secret");
}

# without the secret restored from 0.5.0: 55000, nothing written
$node->safe_psql('c_empty', q{DELETE FROM idempotency.derive_secret WHERE restored_050});
my $before = $node->safe_psql('c_empty', q{SELECT xmin || ' ' || updated_at FROM idempotency.idempotency_key WHERE key = 'old-1'});
my ($rc, $out, $err) = $node->psql('c_empty', q{SET ROLE payer; SELECT idempotency.derive_key('old-1', 'charge')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/55000/, 'without the secret restored from 0.5.0 the seedless key is 55000');
is($node->safe_psql('c_empty', q{SELECT xmin || ' ' || updated_at FROM idempotency.idempotency_key WHERE key = 'old-1'}),
	$before, 'and its row is unchanged');
# b's own key took the oldest secret of b when it was begun, which was the
# one restored from 0.5.0: it is 55000 too, never another derived key
($rc, $out, $err) = $node->psql('c_empty', q{SET ROLE payer; SELECT idempotency.derive_key('new-1', 'charge')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/55000.*derive secret of idempotency key "new-1" is not in table/,
	'and so is the key whose seed names that secret');

$node->stop;
done_testing();
