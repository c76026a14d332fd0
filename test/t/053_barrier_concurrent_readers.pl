# The acked counts' barriers (src/outbox_counts.c) under concurrency, with a
# transaction open in another database so that every fold of topic t goes
# through a barrier.  Clients ack t in many ways (commit, rollback, a
# savepoint rolled back or released, PREPARE then COMMIT/ROLLBACK PREPARED),
# purge (also inside REPEATABLE READ), and read.  Every acking transaction
# logs what ack() returned into ack_log in the same transaction, so for any
# snapshot outbox_stats.delivered of t must equal sum(ack_log.n):
#  - a REPEATABLE READ reader checks it twice, 20 ms apart (same snapshot);
#  - a READ COMMITTED reader checks it through a cursor declared, then
#    fetched after 20 ms (the cursor's snapshot);
#  - a READ COMMITTED reader checks it in one statement.
# Each observation goes into obs; none may differ.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('barrier_concurrent');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.outbox_count_deltas = 16
idempotency.purge_interval = 0
max_prepared_transactions = 20
max_connections = 40
});
$node->start;
$node->safe_psql('postgres', q{CREATE DATABASE elsewhere});
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('t', max_attempts => 1000000);
	SELECT count(idempotency.publish('t', '{}')) FROM generate_series(1, 60000);
	CREATE TABLE ack_log (n int8 NOT NULL);
	CREATE TABLE obs (kind text, delivered int8, logged int8, at timestamptz DEFAULT clock_timestamp());
});

my $open = $node->background_psql('elsewhere', on_error_stop => 1);
$open->query_safe(q{BEGIN; SELECT pg_catalog.txid_current()});

my $ack = q{WITH c AS (SELECT c.claim, c.id FROM idempotency.claim('t', 2) AS c),
 a AS (SELECT idempotency.ack(c.claim, ARRAY[c.id]) AS n FROM c)
 INSERT INTO ack_log SELECT n FROM a WHERE n > 0;};
my $check = q{(SELECT delivered FROM idempotency.outbox_stats WHERE topic = 't'),
 (SELECT coalesce(sum(n), 0) FROM ack_log)};

$node->pgbench(
	'--no-vacuum -c 16 -j 16 -T 8 --max-tries=1000',
	0,
	[qr{processed}],
	[qr{.*}],
	'acks, purges and readers run without error',
	{
		'ack_commit@6' => "BEGIN;\n$ack\nCOMMIT;\n",
		'ack_rollback@1' => "BEGIN;\n$ack\nROLLBACK;\n",
		'ack_savepoint@2' => "BEGIN;\nSAVEPOINT s;\n$ack\nROLLBACK TO SAVEPOINT s;\n$ack\nSAVEPOINT r;\n$ack\nRELEASE SAVEPOINT r;\nCOMMIT;\n",
		'ack_2pc_commit@1' => "BEGIN;\n$ack\nPREPARE TRANSACTION 'c:client_id';\nSELECT pg_sleep(0.005);\nCOMMIT PREPARED 'c:client_id';\n",
		'ack_2pc_rollback@1' => "BEGIN;\n$ack\nPREPARE TRANSACTION 'r:client_id';\nROLLBACK PREPARED 'r:client_id';\n",
		'purge@1' => "SELECT idempotency.purge();\n",
		'purge_rr@1' => "BEGIN ISOLATION LEVEL REPEATABLE READ;\nSELECT count(*) FROM idempotency.outbox_stats;\nSELECT pg_sleep(0.01);\nSELECT idempotency.purge();\nCOMMIT;\n",
		'read_rr@2' => "BEGIN ISOLATION LEVEL REPEATABLE READ;\nINSERT INTO obs (kind, delivered, logged) SELECT 'rr1', $check;\nSELECT pg_sleep(0.02);\nINSERT INTO obs (kind, delivered, logged) SELECT 'rr2', $check;\nCOMMIT;\n",
		'read_cursor@2' => "BEGIN;\nDECLARE cur CURSOR FOR SELECT $check;\nSELECT pg_sleep(0.02);\nFETCH 1 FROM cur \\gset d_\nINSERT INTO obs (kind, delivered, logged) VALUES ('cursor', :d_delivered, :d_coalesce);\nCOMMIT;\n",
		'read_rc@2' => "INSERT INTO obs (kind, delivered, logged) SELECT 'rc', $check;\n",
	},
	'postgres');

my $bad = $node->safe_psql('postgres',
	q{SELECT count(*) || ' of ' || (SELECT count(*) FROM obs) || coalesce(': ' || string_agg(kind || ' ' || delivered || '<>' || logged, ', '), '')
	    FROM (SELECT * FROM obs WHERE delivered <> logged ORDER BY at LIMIT 10) o});
like($bad, qr/^0 of [1-9]/, "every snapshot's delivered count equals the acks it sees ($bad)");
my $rows = $node->safe_psql('postgres', q{SELECT count(*) FROM obs});
note "observations: $rows";
note "acked: " . $node->safe_psql('postgres', q{SELECT sum(n) FROM ack_log});
note "row: " . $node->safe_psql('postgres', q{SELECT purged_delivered FROM idempotency.outbox_topic});
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_prepared_xacts}), '0', 'no prepared transaction left');

$open->query_safe(q{COMMIT});
$open->quit;
$node->safe_psql('postgres', q{SELECT idempotency.purge()});
is($node->safe_psql('postgres', "SELECT $check"), $node->safe_psql('postgres', q{SELECT sum(n) || '|' || sum(n) FROM ack_log}),
	'after the other database ended and a purge, the count is exact');
$node->safe_psql('postgres', q{SELECT idempotency.purge()});
is($node->safe_psql('postgres', "SELECT $check"), $node->safe_psql('postgres', q{SELECT sum(n) || '|' || sum(n) FROM ack_log}),
	'a second purge writes nothing twice');

my $log = slurp_file($node->logfile);
my @bad = grep { /WARNING|PANIC|TRAP|terminated by signal|ERROR/ && !/could not serialize|deadlock detected|canceling statement/ } split /\n/, $log;
is(scalar(@bad), 0, 'no WARNING or ERROR in the server log') or diag join("\n", @bad[0 .. ($#bad < 20 ? $#bad : 19)]);

$node->stop;
done_testing();
