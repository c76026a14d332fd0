# The acked counts' barriers (src/outbox_counts.c) under 16 pgbench clients
# acking (plain, in savepoints, through 2PC) beside a transaction open in
# another database, with purges and readers; two runs:
#  - many topics: 48 topics, more crowded than there are barrier places (32),
#    REPEATABLE READ readers that read twice with a pause;
#  - read-heavy: 8 topics, so barriers start and pass all the time, while
#    most transactions are readers taking snapshots (REPEATABLE READ read
#    twice with no pause, SERIALIZABLE READ ONLY, READ COMMITTED): a reader
#    that takes its snapshot just before a barrier records the snapshot
#    holders must still be waited for.
# Every acking transaction logs (topic, acked) in ack_log; for any snapshot,
# each topic's outbox_stats.delivered must equal its logged sum.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $ack = q{WITH c AS (SELECT c.claim, c.id FROM idempotency.claim('t' || :t, 1) AS c),
 a AS (SELECT idempotency.ack(c.claim, ARRAY[c.id]) AS n FROM c)
 INSERT INTO ack_log SELECT 't' || :t, n FROM a WHERE n > 0;};

# hammer(NAME, TOPICS, MESSAGES PER TOPIC, pgbench scripts): one cluster, one run
sub hammer
{
	my ($name, $topics, $per_topic, $scripts) = @_;
	my $node = PostgreSQL::Test::Cluster->new("barrier_$name");
	$node->init;
	$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.outbox_count_deltas = 16
idempotency.purge_interval = 0
max_connections = 40
max_prepared_transactions = 20
});
	$node->start;
	$node->safe_psql('postgres', q{CREATE DATABASE elsewhere});
	$node->safe_psql('postgres', qq{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('t' || i) FROM generate_series(1, $topics) i;
	SELECT count(idempotency.publish('t' || i, '{}')) FROM generate_series(1, $topics) i, generate_series(1, $per_topic);
	CREATE TABLE ack_log (topic text NOT NULL, n int8 NOT NULL);
	CREATE TABLE obs (kind text, differ int8, total int8);
	CREATE VIEW differ AS
	  SELECT count(*) FILTER (WHERE s.delivered <> coalesce(l.n, 0)) AS differ, sum(s.delivered) AS total
	    FROM idempotency.outbox_stats AS s
	    LEFT JOIN (SELECT topic, sum(n) AS n FROM ack_log GROUP BY topic) AS l USING (topic);
});

	my $open = $node->background_psql('elsewhere', on_error_stop => 1);
	$open->query_safe(q{BEGIN; SELECT pg_catalog.txid_current()});

	$node->pgbench('--no-vacuum -c 16 -j 16 -T 8 --max-tries=1000',
		0, [qr{processed}], [qr{.*}],
		"$name: acks of $topics topics, purges and readers run without error",
		$scripts, 'postgres');

	is($node->safe_psql('postgres', q{SELECT count(*) FILTER (WHERE differ <> 0) || ' of ' || count(*) FROM obs}) =~ /^0 of [1-9]/ ? 'ok' : $node->safe_psql('postgres', q{SELECT count(*) FILTER (WHERE differ <> 0) || ' of ' || count(*) || ': ' || string_agg(kind || ' ' || differ, ', ') FILTER (WHERE differ <> 0) FROM obs}),
		'ok', "$name: every snapshot sees each topic delivered as its logged acks");
	is($node->safe_psql('postgres', q{SELECT differ FROM differ}), '0', "$name: a new snapshot too");
	$open->query_safe(q{COMMIT});
	$open->quit;
	$node->safe_psql('postgres', q{SELECT idempotency.purge()});
	is($node->safe_psql('postgres', q{SELECT differ FROM differ}), '0', "$name: after the other database ended and a purge");
	is($node->safe_psql('postgres', q{SELECT sum(purged_delivered) = (SELECT sum(n) FROM ack_log) FROM idempotency.outbox_topic}), 't',
		"$name: everything in the rows");
	my @bad = grep { /WARNING|PANIC|TRAP|terminated by signal|ERROR/ && !/could not serialize|deadlock detected/ } split /\n/, slurp_file($node->logfile);
	is(scalar(@bad), 0, "$name: no WARNING or ERROR in the server log") or diag join("\n", @bad[0 .. ($#bad < 20 ? $#bad : 19)]);
	$node->stop;
}

hammer('many_topics', 48, 400, {
	'ack@10' => "\\set t random(1, 48)\nBEGIN;\n$ack\nCOMMIT;\n",
	'ack_sp@2' => "\\set t random(1, 48)\nBEGIN;\nSAVEPOINT s;\n$ack\nROLLBACK TO SAVEPOINT s;\n$ack\nCOMMIT;\n",
	'ack_2pc@1' => "\\set t random(1, 48)\nBEGIN;\n$ack\nPREPARE TRANSACTION 'c:client_id';\nCOMMIT PREPARED 'c:client_id';\n",
	'purge@1' => "SELECT idempotency.purge();\n",
	'read_rr@2' => "BEGIN ISOLATION LEVEL REPEATABLE READ;\nINSERT INTO obs SELECT 'rr1', * FROM differ;\nSELECT pg_sleep(0.02);\nINSERT INTO obs SELECT 'rr2', * FROM differ;\nCOMMIT;\n",
	'read_rc@1' => "INSERT INTO obs SELECT 'rc', * FROM differ;\n",
});

hammer('read_heavy', 8, 2500, {
	'ack@6' => "\\set t random(1, 8)\nBEGIN;\n$ack\nCOMMIT;\n",
	'ack_sp@2' => "\\set t random(1, 8)\nBEGIN;\nSAVEPOINT s;\n$ack\nROLLBACK TO SAVEPOINT s;\n$ack\nCOMMIT;\n",
	'ack_2pc@1' => "\\set t random(1, 8)\nBEGIN;\n$ack\nPREPARE TRANSACTION 'c:client_id';\nCOMMIT PREPARED 'c:client_id';\n",
	'purge@1' => "SELECT idempotency.purge();\n",
	'read_rr@4' => "BEGIN ISOLATION LEVEL REPEATABLE READ;\nINSERT INTO obs SELECT 'rr1', * FROM differ;\nINSERT INTO obs SELECT 'rr2', * FROM differ;\nCOMMIT;\n",
	'read_ser@2' => "BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY;\nSELECT differ AS sdiffer FROM differ \\gset\nSELECT differ AS sdiffer2 FROM differ \\gset\nCOMMIT;\n\\if :sdiffer + :sdiffer2\nSELECT 'a serializable reader saw topics differ'::int;\n\\endif\n",
	'read_rc@4' => "INSERT INTO obs SELECT 'rc', * FROM differ;\n",
});

done_testing();
