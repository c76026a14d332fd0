# The settings a database or a role gives its sessions (ALTER DATABASE /
# ALTER ROLE ... SET) do not reach the purge worker: it runs with the
# server's settings, as the bootstrap superuser, with search_path pinned.
# A database's owner (no superuser) could otherwise stop the purge of her
# database (default_transaction_read_only: "cannot execute SELECT FOR UPDATE
# in a read-only transaction" every cycle, the expired rows stay), make it
# run as another role (role, session_authorization: permission denied),
# or change how it plans, waits and resolves names.
#
# Here the owner of database owned sets every such setting she may; a
# superuser adds role settings of the worker's own role in that database
# (session_replication_role, which only a superuser may set).  The purge
# worker purges owned's expired keys, tokens, seen messages and delivered
# outbox messages anyway, logs no error, and says (DEBUG1) which settings
# it did not take.  The outbox vacuum worker does the same.  A worker
# names itself in pg_stat_activity (application_name) whatever the
# database's setting.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('purge_settings');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0
idempotency.purge_batch = 100
idempotency.outbox_vacuum_after = 5
log_min_messages = debug1
});
$node->start;

$node->safe_psql('postgres', q{
	CREATE ROLE app LOGIN;
	CREATE ROLE dbo LOGIN CREATEDB;
	GRANT app TO dbo;
	SET ROLE dbo;
	CREATE DATABASE owned;
});
$node->safe_psql('owned', q{CREATE EXTENSION idempotency});

# what the database's owner may set for every session of her database
my @owner_settings = (
	[ default_transaction_read_only => 'on' ],
	[ default_transaction_isolation => 'serializable' ],
	[ default_transaction_deferrable => 'on' ],
	[ role => 'app' ],
	[ session_authorization => 'app' ],
	[ search_path => 'evil, pg_catalog' ],
	[ statement_timeout => '1' ],
	[ lock_timeout => '1' ],
	[ idle_in_transaction_session_timeout => '1' ],
	[ row_security => 'off' ],
	[ enable_tidscan => 'off' ],
	[ enable_indexscan => 'off' ],
	[ enable_bitmapscan => 'off' ],
	[ plan_cache_mode => 'force_custom_plan' ],
	[ work_mem => '64' ],
	[ exit_on_error => 'on' ],
	[ application_name => 'not the worker' ],
	[ DateStyle => 'SQL, DMY' ],
	[ TimeZone => 'Pacific/Kiritimati' ],
	[ IntervalStyle => 'sql_standard' ],
	[ standard_conforming_strings => 'off' ],
	[ temp_tablespaces => 'pg_default' ],
	[ vacuum_freeze_min_age => '0' ],
	[ maintenance_work_mem => '1MB' ],
	[ 'idempotency.default_ttl' => '1s' ],
	[ 'idempotency.max_key_length' => '1' ],
	[ 'idempotency.lock_wait' => '1' ],);
# accepted too, and reset by every transaction's start: no effect to put back
my @owner_inert = (
	[ transaction_read_only => 'on' ],);
$node->safe_psql('owned', join("\n", 'SET ROLE dbo;', 'CREATE SCHEMA evil;',
	map { "ALTER DATABASE owned SET $_->[0] = '$_->[1]';" } @owner_settings, @owner_inert));
# a superuser's settings for the role the workers run as, in that database
my @role_settings = (
	[ session_replication_role => 'replica' ],
	[ jit => 'on' ],
	[ jit_above_cost => '0' ],);
$node->safe_psql('postgres', join("\n",
	map { "ALTER ROLE CURRENT_USER IN DATABASE owned SET $_->[0] = '$_->[1]';" } @role_settings));
$ENV{PGOPTIONS} = '-c statement_timeout=0 -c exit_on_error=off';
is( $node->safe_psql('owned', q{
		SELECT session_user || ' ' || current_user || ' ' || current_setting('default_transaction_read_only')
		    || ' ' || current_setting('session_replication_role')}),
	'postgres app on replica', 'a session of database owned gets them (here: app, read-only, replica)');
# the test's own sessions take none of them (options on the command line
# come before a database's and a role's settings)
$ENV{PGOPTIONS} = join(' ', map { "-c $_" } 'session_authorization=postgres', 'role=none',
	'default_transaction_read_only=off', 'statement_timeout=0', 'lock_timeout=0',
	'idle_in_transaction_session_timeout=0', 'exit_on_error=off', 'session_replication_role=origin',
	'standard_conforming_strings=on', 'idempotency.max_key_length=255');

my $offset = -s $node->logfile;

# the expired rows, made after the settings: app's keys, tokens, seen
# messages and delivered messages (whose acks wake the outbox vacuum)
$node->safe_psql('owned', q{
	SET ROLE app;
	SELECT idempotency.create_topic('t', retention => '0');
	SELECT count(idempotency.publish('t', jsonb_build_object('i', i))) FROM generate_series(1, 6) i;
	SELECT count(*) FROM (SELECT idempotency.ack(c.claim, array_agg(c.id))
	  FROM idempotency.claim('t', 10) c GROUP BY c.claim) x;
	BEGIN;
	SELECT count(*) FROM generate_series(1, 150) i, idempotency.begin('old-' || i, ttl => '1 ms');
	SELECT count(idempotency.complete('old-' || i, '{}')) FROM generate_series(1, 150) i;
	SELECT idempotency.issue_token(ttl => '1 ms');
	SELECT idempotency.first_seen('q', 'old', ttl => '1 ms');
	COMMIT;
	SELECT pg_sleep(0.01);
});

$node->append_conf('postgresql.conf', "idempotency.purge_interval = '1s'\n");
$node->reload;

ok( $node->poll_query_until('owned', q{
		SELECT (SELECT count(*) FROM idempotency.idempotency_key)
		     + (SELECT count(*) FROM idempotency.token)
		     + (SELECT count(*) FROM idempotency.seen_message) = 0
		   AND (SELECT purged_delivered FROM idempotency.outbox_topic WHERE name = 't') = 6}),
	'the purge worker purges database owned whatever its owner and role settings say');
ok( $node->wait_for_log(qr/idempotency outbox vacuum worker ran VACUUM of idempotency\.outbox_message in database "owned"/, $offset),
	'the outbox vacuum worker visits database owned');
my $log = substr(slurp_file($node->logfile), $offset);
my @errors = grep { /ERROR|WARNING|FATAL/ } split /\n/, $log;
is_deeply(\@errors, [], 'no worker logged an error or a warning');
for my $s (@owner_settings, @role_settings)
{
	like($log, qr/purge worker did not take these settings of database "owned" or of its role: [^\n]*\b\Q$s->[0]\E\b/,
		"the purge worker did not take $s->[0] = $s->[1]");
}
like($log, qr/outbox vacuum worker did not take these settings of database "owned" or of its role: [^\n]*\bdefault_transaction_read_only\b/,
	'nor did the outbox vacuum worker');

# the worker names itself in pg_stat_activity whatever the database's
# application_name: caught waiting for a lock on the key table
my $dba = $node->background_psql('owned', on_error_stop => 1);
$dba->query_safe(q{BEGIN});
$dba->query_safe(q{LOCK TABLE idempotency.idempotency_key IN ACCESS EXCLUSIVE MODE});
ok( $node->poll_query_until('postgres', q{
		SELECT count(*) > 0 FROM pg_stat_activity
		 WHERE datname = 'owned' AND backend_type = 'idempotency purge worker'
		   AND wait_event_type = 'Lock'}),
	'a purge worker of database owned waits for the lock');
is( $node->safe_psql('postgres', q{
		SELECT string_agg(DISTINCT application_name, ',') FROM pg_stat_activity
		 WHERE datname = 'owned' AND backend_type = 'idempotency purge worker'}),
	'idempotency purge worker', 'its application_name is its own, not the database\'s');
$dba->query_safe(q{COMMIT});
$dba->quit;

$node->stop;
done_testing();
