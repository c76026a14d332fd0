# The purge background worker: runs with the library preloaded, removes
# exactly the expired rows of every role, says so in the log, keeps going
# after an error, follows SIGHUP, stops on SIGTERM and comes back after a
# restart.  Without preload there is no worker and purge() still works.
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
idempotency.database = 'postgres'
idempotency.purge_batch = 100
});
$node->start;

# expired and live rows of two roles: 250 expired keys (3 batches), tokens, messages
# (one transaction: all of them expire at the same moment)
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE ROLE app;
});
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

my $worker_pid = q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency purge worker'};
ok($node->poll_query_until('postgres', "SELECT count(*) = 1 FROM ($worker_pid) w"),
	'the worker shows in pg_stat_activity with its backend type');

ok( $node->poll_query_until('postgres', q{
		SELECT (SELECT count(*) FROM idempotency.idempotency_key WHERE key LIKE '%old%') = 0
		   AND (SELECT count(*) FROM idempotency.token) = 1
		   AND (SELECT count(*) FROM idempotency.seen_message) = 1}),
	'every expired key, token and message is purged');
is( $node->safe_psql('postgres', q{SELECT string_agg(key, ',' ORDER BY key) FROM idempotency.idempotency_key}),
	'live-1,live-2,live-3,live-4,live-5', 'the live keys are all still there');
ok( $node->wait_for_log(qr/idempotency purge worker purged 251 expired keys, 1 tokens and 1 messages in database "postgres" \(3 batches\)/),
	'the log says what was purged');

# an error in a cycle is reported, and the worker keeps going
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
my $pid_before = $node->safe_psql('postgres', $worker_pid);
ok($node->wait_for_log(qr/ERROR:  purge refused by trigger/), 'the error is logged');
ok($node->wait_for_log(qr/idempotency purge worker will try again in 1 s/), 'and the worker says it will retry');
$node->safe_psql('postgres', q{DROP TRIGGER refuse ON idempotency.idempotency_key});
ok( $node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM idempotency.idempotency_key WHERE key = 'after-error'}),
	'after the error the next cycle purges');
is($node->safe_psql('postgres', $worker_pid), $pid_before, 'the same worker process kept going');

# SIGHUP: purge_interval = 0 stops purging, a new value starts it again.
# No sleeping: the test waits for the worker's own word.  SIGHUP goes to the
# worker straight from here too (when kill returns its reload is pending; the
# postmaster passes pg_ctl reload's on in its own time).
# pg_log_backend_memory_contexts() makes the worker log "logging memory
# contexts" when it next checks for interrupts, at the top of its loop, just
# before it takes a pending reload and decides whether to purge: a second
# such line means the worker has been once round its loop since the first.
my $wpid = $node->safe_psql('postgres', $worker_pid);
sub worker_goes_round
{
	my $offset = -s $node->logfile;
	$node->safe_psql('postgres', "SELECT pg_log_backend_memory_contexts($wpid)");
	return $node->wait_for_log(qr/\[$wpid\] .*logging memory contexts of PID $wpid\b/, $offset);
}
$node->append_conf('postgresql.conf', "idempotency.purge_interval = 0\n");
$node->reload;
is(kill('HUP', $wpid), 1, 'SIGHUP for the worker with purge_interval = 0');
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT outcome FROM idempotency.begin('paused', ttl => '1 ms');
	SELECT idempotency.complete('paused', '{}');
	COMMIT;
	SELECT pg_sleep(0.01);});
# once round with 'paused' expired: a worker that went on purging, or that
# purged whenever it woke, would have purged it
ok(worker_goes_round() && worker_goes_round(), 'the paused worker wakes and goes round its loop');
is( $node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'paused'}),
	'1', 'with purge_interval = 0 nothing is purged');
$node->append_conf('postgresql.conf', "idempotency.purge_interval = '1s'\n");
$node->reload;
ok( $node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM idempotency.idempotency_key WHERE key = 'paused'}),
	'after a reload with an interval it purges again');

# SIGTERM stops it promptly; the postmaster starts it again later
my $pid = $node->safe_psql('postgres', $worker_pid);
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
ok( $node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid"),
	'SIGTERM stops the worker');

# a restart brings it back, and it purges again
$node->restart;
ok($node->poll_query_until('postgres', "SELECT count(*) = 1 FROM ($worker_pid) w"),
	'the worker is back after a restart');
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
# once the logical replication launcher runs, a purge worker would have started
ok( $plain->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_stat_activity
		WHERE backend_type = 'logical replication launcher'}),
	'the background workers have started');
is( $plain->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency purge worker'}),
	'0', 'without shared_preload_libraries there is no worker');
unlike(slurp_file($plain->logfile), qr/idempotency purge worker started/,
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
