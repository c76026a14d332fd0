# The purge background workers: with the library preloaded a launcher,
# connected to no database, starts a short-lived worker per database per
# cycle; every database where the extension is installed is purged of
# exactly the expired rows of every role, the log says so, an error ends one
# cycle only, SIGHUP is followed, SIGTERM stops it and a restart brings it
# back.  No database is kept busy: DROP DATABASE, ALTER DATABASE RENAME and
# CREATE DATABASE ... TEMPLATE work while it runs (0.4.0's worker stayed
# connected to idempotency.database and made all three fail).  Without
# preload there is no worker and purge() still works.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('worker');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = '1s'
idempotency.purge_batch = 100
});
$node->start;

# expired and live rows of two roles: 250 expired keys (3 batches), tokens, messages
# (one transaction: all of them expire at the same moment)
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE ROLE app;
	CREATE DATABASE app;
	CREATE DATABASE plain;
});
$node->safe_psql('app', q{CREATE EXTENSION idempotency});
$node->safe_psql('postgres', q{
	BEGIN;
	SET LOCAL ROLE app;
	SELECT count(*) FROM generate_series(1, 250) i, idempotency.begin('old-' || i, ttl => '1 s');
	SELECT count(idempotency.complete('old-' || i, '{}')) FROM generate_series(1, 250) i;
	SELECT count(*) FROM generate_series(1, 5) i, idempotency.begin('live-' || i);
	SELECT count(idempotency.complete('live-' || i, '{}')) FROM generate_series(1, 5) i;
	SELECT idempotency.issue_token(ttl => '1 s');
	SELECT idempotency.issue_token(ttl => '1 day');
	SELECT idempotency.first_seen('q', 'old', ttl => '1 s');
	SELECT idempotency.first_seen('q', 'live');
	RESET ROLE;
	SELECT outcome FROM idempotency.begin('superuser-old', ttl => '1 s');
	SELECT idempotency.complete('superuser-old', '{}');
	COMMIT;
});
$node->safe_psql('app', q{
	BEGIN;
	SELECT count(*) FROM generate_series(1, 7) i, idempotency.begin('app-old-' || i, ttl => '1 s');
	SELECT count(idempotency.complete('app-old-' || i, '{}')) FROM generate_series(1, 7) i;
	SELECT outcome FROM idempotency.begin('app-live');
	SELECT idempotency.complete('app-live', '{}');
	COMMIT;
});

my $launcher_pid = q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency purge launcher'};
ok($node->poll_query_until('postgres', "SELECT count(*) = 1 FROM ($launcher_pid) w"),
	'the launcher shows in pg_stat_activity with its backend type');
is( $node->safe_psql('postgres',
		q{SELECT datid IS NULL FROM pg_stat_activity WHERE backend_type = 'idempotency purge launcher'}),
	't', 'the launcher is connected to no database');

ok( $node->poll_query_until('postgres', q{
		SELECT (SELECT count(*) FROM idempotency.idempotency_key WHERE key LIKE '%old%') = 0
		   AND (SELECT count(*) FROM idempotency.token) = 1
		   AND (SELECT count(*) FROM idempotency.seen_message) = 1}),
	'every expired key, token and message is purged');
is( $node->safe_psql('postgres', q{SELECT string_agg(key, ',' ORDER BY key) FROM idempotency.idempotency_key}),
	'live-1,live-2,live-3,live-4,live-5', 'the live keys are all still there');
ok( $node->wait_for_log(qr/idempotency purge worker purged 251 expired keys, 1 tokens and 1 messages in database "postgres" \(3 batches\)/),
	'the log says what was purged');
ok( $node->poll_query_until('app',
		q{SELECT string_agg(key, ',') = 'app-live' FROM idempotency.idempotency_key}),
	'a second database with the extension is purged too');
ok( $node->wait_for_log(qr/idempotency purge worker purged 7 expired keys, 0 tokens and 0 messages in database "app" \(1 batches\)/),
	'and the log says so');
unlike(slurp_file($node->logfile), qr/database "plain"/,
	'a database without the extension is visited without a word');

# an error in a cycle is reported, and the next cycle purges
$node->safe_psql('postgres', q{
	CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS
	  $$ BEGIN RAISE EXCEPTION 'purge refused by trigger'; END $$;
	CREATE TRIGGER refuse BEFORE DELETE ON idempotency.idempotency_key
	  FOR EACH ROW EXECUTE FUNCTION refuse();
	BEGIN;
	SELECT outcome FROM idempotency.begin('after-error', ttl => '1 s');
	SELECT idempotency.complete('after-error', '{}');
	COMMIT;
});
my $pid_before = $node->safe_psql('postgres', $launcher_pid);
ok($node->wait_for_log(qr/ERROR:  purge refused by trigger/), 'the error is logged');
$node->safe_psql('postgres', q{DROP TRIGGER refuse ON idempotency.idempotency_key});
ok( $node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM idempotency.idempotency_key WHERE key = 'after-error'}),
	'after the error the next cycle purges');
is($node->safe_psql('postgres', $launcher_pid), $pid_before, 'the same launcher kept going');

# No database is held: rename, copy and drop purged databases while the
# launcher cycles every second.  Each waits at most 5 s for other sessions
# of the database (CountOtherDBBackends); a worker holds one for
# milliseconds, 0.4.0's worker held it for good.
for my $round (1 .. 3)
{
	$node->safe_psql('postgres', "CREATE DATABASE tmp$round");
	$node->safe_psql("tmp$round", q{CREATE EXTENSION idempotency});
}
my ($ret, $out, $err) = $node->psql('postgres', q{ALTER DATABASE tmp1 RENAME TO tmp1_renamed});
is($ret, 0, 'ALTER DATABASE RENAME of a purged database works') or diag($err);
($ret, $out, $err) = $node->psql('postgres', q{CREATE DATABASE tmp2_copy TEMPLATE tmp2});
is($ret, 0, 'CREATE DATABASE ... TEMPLATE of a purged database works') or diag($err);
($ret, $out, $err) = $node->psql('postgres', q{DROP DATABASE tmp3});
is($ret, 0, 'DROP DATABASE of a purged database works') or diag($err);
($ret, $out, $err) = $node->psql('postgres', q{DROP DATABASE tmp1_renamed});
is($ret, 0, 'DROP DATABASE of a renamed one too') or diag($err);

# idempotency.database limits the worker to one database; when that one is
# dropped (even WITH (FORCE)), the launcher says so once per cycle and
# nothing restarts
$node->append_conf('postgresql.conf', "idempotency.database = 'tmp2'\n");
$node->reload;
ok( $node->poll_query_until('tmp2', q{SELECT true}), 'the named database is there');
my $offset = -s $node->logfile;
($ret, $out, $err) = $node->psql('postgres', q{DROP DATABASE tmp2 WITH (FORCE)});
is($ret, 0, 'DROP DATABASE WITH (FORCE) of the named database works') or diag($err);
ok( $node->wait_for_log(qr/database "tmp2" \(idempotency.database\) does not exist/, $offset),
	'the launcher says the named database is missing');
# from the first such line on: one line per cycle, and nothing else
$offset = -s $node->logfile;
my $since = time;
my $cycles = 0;
for (my $waited = 0; $waited < 300 && $cycles < 3; $waited++)
{
	$cycles = () = substr(slurp_file($node->logfile), $offset) =~ /does not exist/g;
	select(undef, undef, undef, 0.1) if $cycles < 3;
}
my $log = substr(slurp_file($node->logfile), $offset);
my $elapsed = time - $since;
ok($cycles >= 3 && $cycles <= $elapsed + 2,
	"the missing database is reported once per cycle ($cycles lines in about $elapsed s)");
my $other = () = $log =~ /(FATAL|ERROR|exited with exit code)/g;
is($other, 0, 'and nothing else: no FATAL, no worker restart');
is($node->safe_psql('postgres', $launcher_pid), $pid_before, 'the launcher kept going');
$node->append_conf('postgresql.conf', "idempotency.database = ''\n");
$node->reload;

# SIGHUP: purge_interval = 0 stops purging, a new value starts it again.
# No sleeping: the test waits for the launcher's own word.  SIGHUP goes to
# the launcher straight from here too (when kill returns its reload is
# pending; the postmaster passes pg_ctl reload's on in its own time).
# pg_log_backend_memory_contexts() makes the launcher log "logging memory
# contexts" when it next checks for interrupts, at the top of its loop, just
# before it takes a pending reload and decides whether to purge: a second
# such line means the launcher has been once round its loop since the first.
my $wpid = $node->safe_psql('postgres', $launcher_pid);
sub launcher_goes_round
{
	my $offset = -s $node->logfile;
	$node->safe_psql('postgres', "SELECT pg_log_backend_memory_contexts($wpid)");
	return $node->wait_for_log(qr/\[$wpid\] .*logging memory contexts of PID $wpid\b/, $offset);
}
$node->append_conf('postgresql.conf', "idempotency.purge_interval = 0\n");
$node->reload;
is(kill('HUP', $wpid), 1, 'SIGHUP for the launcher with purge_interval = 0');
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT outcome FROM idempotency.begin('paused', ttl => '1 ms');
	SELECT idempotency.complete('paused', '{}');
	COMMIT;
	SELECT pg_sleep(0.01);});
# a worker cycle runs to its end before the launcher looks at its latch
# again: after two rounds any cycle begun before the reload is over
ok(launcher_goes_round() && launcher_goes_round(), 'the paused launcher wakes and goes round its loop');
is( $node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'paused'}),
	'1', 'with purge_interval = 0 nothing is purged');
$node->append_conf('postgresql.conf', "idempotency.purge_interval = '1s'\n");
$node->reload;
ok( $node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM idempotency.idempotency_key WHERE key = 'paused'}),
	'after a reload with an interval it purges again');

# SIGTERM stops it promptly; the postmaster starts it again later
my $pid = $node->safe_psql('postgres', $launcher_pid);
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
ok( $node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid"),
	'SIGTERM stops the launcher');

# a restart brings it back, and it purges again
$node->restart;
ok($node->poll_query_until('postgres', "SELECT count(*) = 1 FROM ($launcher_pid) w"),
	'the launcher is back after a restart');
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT outcome FROM idempotency.begin('after-restart', ttl => '1 ms');
	SELECT idempotency.complete('after-restart', '{}');
	COMMIT;
});
ok( $node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM idempotency.idempotency_key WHERE key = 'after-restart'}),
	'and purges after the restart');
$node->stop;

# without preload: no worker, everything else works
my $plain = PostgreSQL::Test::Cluster->new('plain');
$plain->init;
$plain->start;
$plain->safe_psql('postgres', q{CREATE EXTENSION idempotency});
# the postmaster starts the background workers registered at startup together:
# once the logical replication launcher runs, a purge launcher would have started
ok( $plain->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_stat_activity
		WHERE backend_type = 'logical replication launcher'}),
	'the background workers have started');
is( $plain->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency purge%'}),
	'0', 'without shared_preload_libraries there is no launcher');
unlike(slurp_file($plain->logfile), qr/idempotency purge launcher started/,
	'and none started');
$plain->safe_psql('postgres', q{
	BEGIN;
	SELECT outcome FROM idempotency.begin('k', ttl => '1 ms');
	SELECT idempotency.complete('k', '{}');
	COMMIT;
	SELECT pg_sleep(0.01);});
is($plain->safe_psql('postgres', q{SELECT idempotency.purge()}), '1',
	'purge() works without the worker');
$plain->stop;

done_testing();
