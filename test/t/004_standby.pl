# Hot standby and promotion.
#
# - Keys completed on the primary (single-transaction and lease mode) replay
#   on a streaming hot standby, also under REPEATABLE READ; a pg_monitor role
#   reads the same idempotency.key_health there as on the primary.
# - Where nothing can be written (a hot standby, a READ ONLY transaction,
#   default_transaction_read_only) begin() of a new or retryable key raises
#   25006 naming the key at begin() itself, and writes nothing; replays still
#   work there.
# - Exactly-once across a promotion under synchronous replication: every
#   request acknowledged by the old primary replays on the new one with the
#   same response, and no request has a second business effect.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(usleep time);

my $start = time;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->start;
$primary->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE TABLE payment (id serial PRIMARY KEY, key text NOT NULL, amount int);
});

$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
# once promoted it has no standby of its own: never wait for one
$standby->append_conf('postgresql.conf', q{synchronous_standby_names = ''});
$standby->start;

# commits on the primary wait for the standby (walreceiver's
# application_name is the node name)
$primary->append_conf('postgresql.conf', q{
synchronous_standby_names = 'standby'
synchronous_commit = on
});
$primary->reload;
ok( $primary->poll_query_until('postgres', q{
		SELECT sync_state = 'sync' FROM pg_stat_replication
		WHERE application_name = 'standby'}),
	'the standby is a synchronous standby');

# --- keys stored on the primary ---------------------------------------------
$primary->safe_psql('postgres', q{
	BEGIN;
	SELECT outcome FROM idempotency.begin('done', '{"amount": 1}');
	SELECT idempotency.complete('done', '{"paid": "done"}');
	COMMIT;
	-- lease mode: the in_progress row commits, complete() in a later transaction
	SELECT outcome FROM idempotency.begin('ship-42', '{"order": 42}', lease => '5 minutes');
	SELECT idempotency.complete('ship-42', '{"tracking": "DHL-123"}', attempt => 1);
	-- a retryable failure: the next begin() is a retry
	BEGIN;
	SELECT outcome FROM idempotency.begin('flaky');
	SELECT idempotency.fail('flaky', '{"error": "timeout"}', retryable => true);
	COMMIT;
	-- a permanent failure: replayed
	BEGIN;
	SELECT outcome FROM idempotency.begin('declined');
	SELECT idempotency.fail('declined', '{"error": "declined"}', retryable => false);
	COMMIT;
	-- a lease that runs out at once: the next begin() takes it over (retry)
	SELECT outcome FROM idempotency.begin('lapsed', lease => '1 millisecond');
});

# expect_25006(node, name, sql, key): the script fails with SQLSTATE 25006,
# the error message names the key, and no query printed anything before it
# (so the error came from begin() itself, not from complete() or COMMIT)
sub expect_25006
{
	my ($node, $name, $sql, $key) = @_;
	my ($ret, $out, $err) =
	  $node->psql('postgres', "\\set VERBOSITY verbose\n$sql");
	my $ok = $ret != 0 && $err =~ /ERROR:\s+25006: [^\n]*\Q$key\E/ && $out eq '';
	ok($ok, $name)
	  or diag("exit $ret\nstdout: $out\nstderr: $err");
	return;
}

my $keycount = q{SELECT count(*) FROM idempotency.idempotency_key
	WHERE key IN ('ro-tx-1', 'ro-default-1', 'ro-lease-1', 'ro-default-2')};

# --- read-only transactions on the primary ------------------------------------
expect_25006($primary, 'primary, BEGIN READ ONLY: begin() of a new key raises 25006 naming the key',
	q{BEGIN READ ONLY;
	  SELECT outcome FROM idempotency.begin('ro-tx-1');
	  SELECT idempotency.complete('ro-tx-1', '{}');
	  COMMIT;}, 'ro-tx-1');
expect_25006($primary, 'primary, default_transaction_read_only (autocommit): 25006 naming the key',
	q{SET default_transaction_read_only = on;
	  SELECT outcome FROM idempotency.begin('ro-default-1');}, 'ro-default-1');
expect_25006($primary, 'primary, default_transaction_read_only (transaction): 25006 naming the key',
	q{SET default_transaction_read_only = on;
	  BEGIN;
	  SELECT outcome FROM idempotency.begin('ro-default-2');
	  SELECT idempotency.complete('ro-default-2', '{}');
	  COMMIT;}, 'ro-default-2');
expect_25006($primary, 'primary, BEGIN READ ONLY with lease => 1 minute: 25006 naming the key',
	q{BEGIN READ ONLY;
	  SELECT outcome FROM idempotency.begin('ro-lease-1', lease => '1 minute');
	  COMMIT;}, 'ro-lease-1');
expect_25006($primary, 'primary, BEGIN READ ONLY: begin() of a retryable key raises 25006 naming the key',
	q{BEGIN READ ONLY;
	  SELECT outcome FROM idempotency.begin('flaky');
	  SELECT idempotency.complete('flaky', '{}');
	  COMMIT;}, 'flaky');
is($primary->safe_psql('postgres', $keycount),
	'0', 'primary: read-only transactions wrote no key row');
is( $primary->safe_psql('postgres',
		q{SELECT status || ' ' || attempts FROM idempotency.idempotency_key WHERE key = 'flaky'}),
	'failed 1', 'primary: the retryable key is unchanged');
is( $primary->safe_psql('postgres', q{
		BEGIN READ ONLY;
		SELECT outcome, response FROM idempotency.begin('done');
		COMMIT;}),
	'replay|{"paid": "done"}', 'primary: a replay works inside a READ ONLY transaction');
is( $primary->safe_psql('postgres', q{
		SET default_transaction_read_only = on;
		SELECT outcome, response FROM idempotency.begin('ship-42');}),
	'replay|{"tracking": "DHL-123"}',
	'primary: a lease-mode replay works under default_transaction_read_only');

# --- the hot standby -----------------------------------------------------------
$primary->safe_psql('postgres', q{CREATE ROLE watcher IN ROLE pg_monitor});
$primary->wait_for_catchup($standby, 'replay');
is($standby->safe_psql('postgres', q{SELECT pg_is_in_recovery()}), 't', 'standby is in recovery');

is($standby->safe_psql('postgres', q{SELECT outcome, response FROM idempotency.begin('done')}),
	'replay|{"paid": "done"}', 'standby: a single-transaction key replays');
is($standby->safe_psql('postgres', q{SELECT outcome, response FROM idempotency.begin('ship-42')}),
	'replay|{"tracking": "DHL-123"}', 'standby: a lease-mode key replays');
is( $standby->safe_psql('postgres',
		q{SELECT outcome, status, response FROM idempotency.begin('declined')}),
	'replay|failed|{"error": "declined"}', 'standby: a permanent failure replays');
is( $standby->safe_psql('postgres', q{
		BEGIN ISOLATION LEVEL REPEATABLE READ;
		SELECT outcome, response FROM idempotency.begin('done');
		SELECT outcome, response FROM idempotency.begin('ship-42', '{"order": 42}');
		COMMIT;}),
	qq{replay|{"paid": "done"}\nreplay|{"tracking": "DHL-123"}},
	'standby: replays inside BEGIN ISOLATION LEVEL REPEATABLE READ');

# key_health (SECURITY DEFINER) for a pg_monitor role reads on the standby
# what it reads on the primary
my $health = q{SET ROLE watcher;
	SELECT string_agg(concat_ws(' ', role, scope, in_progress, completed, failed_retryable, failed_final, expired),
	                  ',' ORDER BY role, scope) FROM idempotency.key_health};
my $health_primary = $primary->safe_psql('postgres', $health);
ok($health_primary ne '', 'key_health on the primary has rows');
is($standby->safe_psql('postgres', $health), $health_primary,
	'standby: key_health for a pg_monitor role, the same counts as on the primary');

expect_25006($standby, 'standby: begin() of a new key raises 25006 naming the key (autocommit)',
	q{SELECT outcome FROM idempotency.begin('fresh-on-standby');}, 'fresh-on-standby');
expect_25006($standby, 'standby: begin() of a new key raises 25006 naming the key (transaction)',
	q{BEGIN;
	  SELECT outcome FROM idempotency.begin('fresh-on-standby');
	  SELECT idempotency.complete('fresh-on-standby', '{}');
	  COMMIT;}, 'fresh-on-standby');
expect_25006($standby, 'standby: begin() of a new key under REPEATABLE READ raises 25006',
	q{BEGIN ISOLATION LEVEL REPEATABLE READ;
	  SELECT outcome FROM idempotency.begin('fresh-rr');
	  COMMIT;}, 'fresh-rr');
expect_25006($standby, 'standby: begin() with a lease raises 25006 naming the key',
	q{SELECT outcome FROM idempotency.begin('fresh-lease', lease => '1 minute');}, 'fresh-lease');
expect_25006($standby, 'standby: begin() of a retryable key raises 25006 naming the key',
	q{BEGIN;
	  SELECT outcome FROM idempotency.begin('flaky');
	  SELECT idempotency.complete('flaky', '{}');
	  COMMIT;}, 'flaky');
expect_25006($standby, 'standby: begin() of a lapsed lease (takeover) raises 25006 naming the key',
	q{SELECT outcome FROM idempotency.begin('lapsed');}, 'lapsed');
is($standby->safe_psql('postgres', q{SELECT outcome, response FROM idempotency.begin('done')}),
	'replay|{"paid": "done"}', 'standby: replays go on working after those errors');

# --- exactly-once across a promotion (synchronous replication) -----------------
# One guarded request, as a client sends it: BEGIN; begin(); on new/retry the
# business row and complete(); COMMIT.  The line after COMMIT is the
# acknowledgement the client saw.
my $N = 200;
sub request_script
{
	my $s = '';
	for my $i (1 .. $N)
	{
		$s .= qq{BEGIN;
SELECT outcome AS o, outcome = 'replay' AS rep, coalesce(response::text, '') AS r
  FROM idempotency.begin('pay-$i', '{"amount": $i}') \\gset
\\if :rep
\\else
INSERT INTO payment (key, amount) VALUES ('pay-$i', $i)
  RETURNING jsonb_build_object('payment_id', id, 'amount', amount)::text AS r \\gset
SELECT idempotency.complete('pay-$i', :'r'::jsonb) \\gset
\\endif
COMMIT;
\\echo ack pay-$i :o :r
};
	}
	return $s;
}
my $script = "$PostgreSQL::Test::Utils::tmp_check/requests.sql";
my $acklog = "$PostgreSQL::Test::Utils::tmp_check/acks-primary.log";
open my $fh, '>', $script or die "$script: $!";
print $fh request_script();
close $fh;

sub acks
{
	my ($text) = @_;
	my %ack;
	for (split /\n/, $text)
	{
		$ack{$1} = [ $2, $3 ] if /^ack (pay-\d+) (\S+) (.*)$/;
	}
	return \%ack;
}

my $t0 = time;
my $client = IPC::Run::start(
	[ $primary->installed_command('psql'), '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $primary->connstr('postgres'),
	  '-f', $script ],
	'>', $acklog, '2>', "$acklog.err");
# stop the primary mid-stream: once about a third of the requests were acknowledged
for (1 .. 3000)
{
	my $n = () = (-e $acklog ? slurp_file($acklog) : '') =~ /^ack /mg;
	last if $n >= $N / 3 || !$client->pumpable;
	usleep(10_000);
}
$primary->stop('immediate');
eval { $client->finish };
my $acked = acks(slurp_file($acklog));
my $nacked = keys %$acked;
note "$nacked of $N requests acknowledged before the primary stopped";
ok($nacked > 0, "some requests were acknowledged ($nacked)");
ok(!grep({ $_->[0] ne 'new' } values %$acked), 'every acknowledged first request was new');

$standby->promote;
is($standby->safe_psql('postgres', q{SELECT pg_is_in_recovery()}), 'f', 'standby promoted');

# the client resends every request, acknowledged or not, to the new primary
my ($ret, $out, $err) = $standby->psql('postgres', request_script());
is($ret, 0, 'all requests resent to the new primary') or diag($err);
my $resent = acks($out);
is(scalar(keys %$resent), $N, 'every resent request was acknowledged');

my @wrong = grep {
	my $r = $resent->{$_};
	!$r || $r->[0] ne 'replay' || $r->[1] ne $acked->{$_}[1]
} sort keys %$acked;
is_deeply(\@wrong, [], 'every acknowledged request replays on the new primary with the same response')
  or diag(join "\n", map { "$_: first $acked->{$_}[1], resent @{$resent->{$_} || []}" } @wrong);

my @unacked = grep { !$acked->{$_} } map { "pay-$_" } 1 .. $N;
my %outc;
$outc{ $resent->{$_}[0] }++ for grep { $resent->{$_} } @unacked;
note scalar(@unacked) . ' unacknowledged: '
  . join(', ', map { "$_ $outc{$_}" } sort keys %outc);
ok(!grep({ !$resent->{$_} || $resent->{$_}[0] !~ /^(new|replay)$/ } @unacked),
	'unacknowledged requests are either new (lost with the old primary) or replay (committed)');

is( $standby->safe_psql('postgres', q{
		SELECT count(*) || ' ' || count(DISTINCT key) || ' '
		       || count(*) FILTER (WHERE key <> ALL (SELECT key FROM idempotency.idempotency_key))
		FROM payment}),
	"$N $N 0", 'one payment per key, each with its key row (no duplicate effect)');
is( $standby->safe_psql('postgres', q{
		SELECT count(*) FROM idempotency.idempotency_key k
		WHERE k.key LIKE 'pay-%' AND (k.status <> 'completed'
		   OR k.response <> (SELECT jsonb_build_object('payment_id', p.id, 'amount', p.amount)
		                     FROM payment p WHERE p.key = k.key))}),
	'0', 'every stored response is the one of its single payment');

# a second resend: everything replays now
($ret, $out, $err) = $standby->psql('postgres', request_script());
my $again = acks($out);
is(scalar(grep { $again->{$_}[0] eq 'replay' } keys %$again), $N, 'a second resend replays all');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM payment}), $N, 'still one payment per key');

# the promoted node takes new work
is( $standby->safe_psql('postgres', q{
		BEGIN;
		SELECT outcome FROM idempotency.begin('after-promotion');
		SELECT idempotency.complete('after-promotion', '{"ok": true}');
		COMMIT;
		SELECT outcome, response FROM idempotency.begin('after-promotion');}),
	"new\n\nreplay|{\"ok\": true}", 'the new primary takes new keys');
note sprintf('promotion part %.1f s, whole test %.1f s', time - $t0, time - $start);

$standby->stop;
done_testing();
