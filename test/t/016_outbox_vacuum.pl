# The outbox's table vacuumed as soon as enough messages were acked (issue
# 26, target (e)).  ack() deletes the message, so each delivered message is
# a dead row until a vacuum; autovacuum comes once a minute.  With the
# library preloaded the commit that takes a database's count of acked
# messages to idempotency.outbox_vacuum_after wakes the purge launcher,
# which starts a worker that runs VACUUM of idempotency.outbox_message.
#
# Here, with autovacuum off and a threshold of 100: 150 messages acked are
# vacuumed away within seconds, in that database only; with the setting 0
# nothing is vacuumed (the acks stay counted); a DROP EXTENSION while acks
# are counted costs one DEBUG1 line of the worker, no error and no loop;
# after CREATE EXTENSION again the new table is vacuumed; while another
# vacuum holds the table's lock the worker skips it without waiting.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('outbox_vacuum');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
autovacuum = off
idempotency.purge_interval = 0
idempotency.outbox_vacuum_after = 100
log_min_messages = debug1
max_prepared_transactions = 2
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE EXTENSION pgstattuple;
	SELECT idempotency.create_topic('t');
	CREATE DATABASE plain;
});
# a database without the extension, with dead rows of its own
$node->safe_psql('plain', q{
	CREATE TABLE junk (i int) WITH (autovacuum_enabled = false);
	INSERT INTO junk SELECT generate_series(1, 1000);
	DELETE FROM junk;
});

# publish n messages, then claim and ack them all; returns how many were acked
sub deliver
{
	my ($n) = @_;
	$node->safe_psql('postgres',
		qq{SELECT count(idempotency.publish('t', jsonb_build_object('i', i))) FROM generate_series(1, $n) i});
	return $node->safe_psql('postgres', qq{
		SELECT sum(n) FROM (SELECT idempotency.ack(c.claim, array_agg(c.id)) AS n
		                      FROM idempotency.claim('t', $n) AS c GROUP BY c.claim) AS a});
}
my $vacuums = q{SELECT vacuum_count FROM pg_stat_user_tables
	WHERE relid = 'idempotency.outbox_message'::regclass};
my $dead = q{SELECT dead_tuple_count FROM pgstattuple('idempotency.outbox_message')};

# --- 150 acks over a threshold of 100: vacuumed within seconds -------------
is($node->safe_psql('postgres', $vacuums), '0', 'outbox_message has not been vacuumed yet');
is(deliver(150), '150', '150 messages published, claimed and acked');
my $t0 = time;
ok($node->poll_query_until('postgres', "SELECT ($vacuums) >= 1"),
	'the outbox vacuum worker vacuums outbox_message (pg_stat_user_tables.vacuum_count)');
my $took = time - $t0;
ok($took <= 10, "within seconds ($took s), with autovacuum off");
is($node->safe_psql('postgres', $dead), '0', 'no dead row is left in outbox_message (pgstattuple)');
ok($node->wait_for_log(qr/DEBUG:  idempotency outbox vacuum worker ran VACUUM of idempotency\.outbox_message in database "postgres"/),
	'the worker says so at DEBUG1');
is($node->safe_psql('plain', q{SELECT vacuum_count || ' ' || (last_vacuum IS NULL)
		FROM pg_stat_user_tables WHERE relname = 'junk'}),
	'0 true', 'a database without the extension is not vacuumed');
unlike(slurp_file($node->logfile), qr/outbox vacuum[^\n]*"plain"/,
	'and no outbox vacuum worker went there');

# --- the setting 0: counted, not vacuumed; the purge cycle marks time -------
$node->append_conf('postgresql.conf', q{
idempotency.outbox_vacuum_after = 0
idempotency.purge_interval = '1s'
});
$node->restart;
my $before = $node->safe_psql('postgres', $vacuums);
ok($before >= 1, "the count of vacuums survives the restart ($before)");
is(deliver(150), '150', 'with outbox_vacuum_after = 0: 150 more acked');
# the launcher looks at the counts each time it wakes: after a purge worker
# ends, before it starts the next; so once a second purge worker has ended
# since the acks, the launcher has looked at them
my $purged = qr/DEBUG:  idempotency purge worker purged 0 expired keys[^\n]*database "postgres"/;
my $offset = -s $node->logfile;
ok($node->wait_for_log($purged, $offset), 'a purge cycle has passed since the acks');
$offset = -s $node->logfile;
ok($node->wait_for_log($purged, $offset), 'and another');
is($node->safe_psql('postgres', $vacuums), $before, 'no vacuum: the setting 0 leaves the table to autovacuum');

# --- DROP EXTENSION while 150 acks are counted, then the threshold back -----
$node->safe_psql('postgres', q{DROP EXTENSION idempotency});
$offset = -s $node->logfile;
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.outbox_vacuum_after = 100});
$node->safe_psql('postgres', q{SELECT pg_reload_conf()});
ok($node->wait_for_log(qr/DEBUG:  idempotency outbox vacuum worker found no extension idempotency in database "postgres"/, $offset),
	'the counted acks start the worker, which finds no extension (DEBUG1)');
# two purge cycles later the worker has not come back
my $mark = -s $node->logfile;
ok($node->wait_for_log(qr/idempotency purge worker found no extension idempotency in database "postgres"/, $mark),
	'a purge cycle passes');
$mark = -s $node->logfile;
ok($node->wait_for_log(qr/idempotency purge worker found no extension idempotency in database "postgres"/, $mark),
	'and another');
my $log = substr(slurp_file($node->logfile), $offset);
my @starts = $log =~ /outbox vacuum worker found no extension/g;
is(scalar @starts, 1, 'the worker ran once: the count was spent, no loop');
unlike($log, qr/^[^\n]*(ERROR|FATAL|WARNING):|outbox vacuum worker[^\n]*(failed|exited with exit code [1-9])/m,
	'no error, warning or failed exit in the log');

# --- CREATE EXTENSION again: its table is vacuumed after 150 acks ----------
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('t');
});
is($node->safe_psql('postgres', $vacuums), '0', 'the new outbox_message has not been vacuumed');
is(deliver(150), '150', '150 messages acked in the new install');
ok($node->poll_query_until('postgres', "SELECT ($vacuums) >= 1"),
	'the new table is vacuumed');

# --- another vacuum in progress (its lock held by a prepared transaction):
# the worker skips the table at once, without a warning, and publishers and
# relays go on meanwhile (lazy VACUUM's lock does not conflict with them)
$node->safe_psql('postgres', q{
	BEGIN;
	LOCK TABLE idempotency.outbox_message IN SHARE UPDATE EXCLUSIVE MODE;
	PREPARE TRANSACTION 'vacuum_lock';
});
$before = $node->safe_psql('postgres', $vacuums);
$mark = -s $node->logfile;
is(deliver(150), '150', 'with the table\'s SHARE UPDATE EXCLUSIVE lock held, 150 are published, claimed and acked');
# (the prepared transaction has an xid, so the removal horizon may be
# where the last vacuum left it: then the worker skips before VACUUM,
# test/t/017)
ok($node->wait_for_log(qr/outbox vacuum worker (ran VACUUM|skipped the vacuum) of idempotency\.outbox_message in database "postgres"/, $mark),
	'the worker runs and ends without waiting for the lock');
is($node->safe_psql('postgres', $vacuums), $before, 'the table was skipped (SKIP_LOCKED)');
unlike(substr(slurp_file($node->logfile), $mark), qr/skipping vacuum|lock not available/,
	'without a warning');
$node->safe_psql('postgres', q{COMMIT PREPARED 'vacuum_lock'});
is(deliver(150), '150', 'the lock released, 150 more acked');
ok($node->poll_query_until('postgres', "SELECT ($vacuums) > $before"),
	'and the table is vacuumed again');
unlike(substr(slurp_file($node->logfile), $offset), qr/outbox vacuum worker[^\n]*failed/,
	'no vacuum failed');

$node->stop;
done_testing();
