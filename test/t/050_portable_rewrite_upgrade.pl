# build.pl's rewrite of outbox_stats (the portable edition reads the acked
# counts from idempotency.outbox_acked in the view's own snapshot, where
# the C edition calls _outbox_counts()) must hold in an upgrade script too.
# A C upgrade script changes a view in place with CREATE OR REPLACE VIEW;
# the rule names only CREATE VIEW, and in --upgrade mode a rule that
# matches nothing does not fail the build, so the portable upgrade script
# would put back the call of _outbox_counts(), VOLATILE, which reads the
# counts in a newer snapshot under READ COMMITTED.  No server needed.
use strict;
use warnings;
use File::Temp qw(tempdir);
use IPC::Run;
use Test::More;

# the C edition's install script of the newest version: in the checkout,
# or in portable/c/ of the copy test/run makes for the TAP scripts
my ($cscript) = sort { my @x = $a =~ /--(\d+)\.(\d+)\.(\d+)\.sql$/; my @y = $b =~ /--(\d+)\.(\d+)\.(\d+)\.sql$/;
	$y[0] <=> $x[0] || $y[1] <=> $x[1] || $y[2] <=> $x[2] }
  grep { m{(?:^|/)idempotency--\d+\.\d+\.\d+\.sql$} } (glob('idempotency--*.sql'), glob('portable/c/idempotency--*.sql'));
plan skip_all => 'needs portable/build.pl, portable/src and the C install script'
  unless $cscript && -f 'portable/build.pl' && -d 'portable/src';
my ($version) = $cscript =~ /--(\d+\.\d+\.\d+)\.sql$/;
my $next = join('.', (split /\./, $version)[0, 1], (split /\./, $version)[2] + 1);

my $dir = tempdir(CLEANUP => 1);
open(my $in, '<', $cscript) or die "$cscript: $!";
my $c = do { local $/; <$in> };
close $in;
my ($view) = $c =~ /^(CREATE VIEW idempotency\.outbox_stats AS.*?;)\n/ms
  or die "no outbox_stats in $cscript";
like($view, qr/idempotency\._outbox_counts\(t\.id\)/, 'the C view calls _outbox_counts()');

# the next release's C install script is this one; its upgrade script
# replaces the view in place, and drops and creates it (both forms)
for my $form ('CREATE OR REPLACE VIEW', 'DROP VIEW idempotency.outbox_stats; CREATE VIEW')
{
	(my $stmt = $view) =~ s/^CREATE VIEW/$form/;
	open(my $o, '>', "$dir/idempotency--$next.sql") or die $!;
	print $o $c;
	close $o;
	open($o, '>', "$dir/idempotency--$version--$next.sql") or die $!;
	print $o "\\echo Use \"ALTER EXTENSION idempotency UPDATE\" to load this file. \\quit\n$stmt\n";
	close $o;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'perl', 'portable/build.pl', '--upgrade', "$dir/idempotency--$version--$next.sql",
			"$dir/idempotency--$next.sql", 'portable/src' ], '>', \$out, '2>', \$err)
	  or die "build.pl --upgrade failed: $err";
	like($out, qr/VIEW idempotency\.outbox_stats/, "$form: the upgrade script has the view");
	unlike($out, qr/idempotency\._outbox_counts\(t\.id\)/,
		"$form: the portable view does not call _outbox_counts()");
	like($out, qr/FROM idempotency\.outbox_acked AS a/,
		"$form: the portable view reads outbox_acked");
}

done_testing();
