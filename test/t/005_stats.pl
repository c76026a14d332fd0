# idempotency.stats across the server's life: waits and their LOG line
# (idempotency.log_waits), forget()'s LOG line, rows the worker purged,
# eviction at idempotency.stats_max, counters kept across a clean restart
# and lost in a crash; and without shared_preload_libraries a clear error.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use CPAN::Meta::YAML;

my $node = PostgreSQL::Test::Cluster->new('stats');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.stats_max = 10
idempotency.log_waits = '1s'
idempotency.purge_interval = '1s'
restart_after_crash = on
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE ROLE app;
	SELECT idempotency.stats_reset();
});

my $counters = q{SELECT begin_new, begin_replay, completed, ik002_in_progress, waits
	FROM idempotency.stats WHERE scope = 'waits'};

# --- waits -----------------------------------------------------------------
# a holder; a duplicate that gives up after 100 ms (below log_waits); one
# that waits over 1.2 s and then replays
my $holder = $node->background_psql('postgres');
$holder->query_safe(q{BEGIN; SELECT outcome FROM idempotency.begin('w', scope => 'waits')});
my ($ret, $out, $err) = $node->psql('postgres', q{
	SET idempotency.lock_wait = '100ms';
	\set VERBOSITY verbose
	SELECT outcome FROM idempotency.begin('w', scope => 'waits')});
like($err, qr/ERROR:  IK002/, 'a duplicate gives up after lock_wait with IK002');

my $waiter = $node->background_psql('postgres');
$waiter->query_until(qr/waiting/, q{
	\echo waiting
	SELECT outcome FROM idempotency.begin('w', scope => 'waits');
});
ok( $node->poll_query_until('postgres', q{
		SELECT count(*) = 1 FROM pg_stat_activity
		 WHERE wait_event = 'advisory' AND now() - query_start > interval '1200 ms'}),
	'the second duplicate has waited 1.2 s for the key lock');
$holder->query_safe(q{SELECT idempotency.complete('w', '"done"', 'waits'); COMMIT});
ok( $node->wait_for_log(
		qr/LOG:  process \d+ waited \d+\.\d{3} ms for idempotency key "w" in scope "waits" of role "\w+"\n.*DETAIL:  It then took the key\./
	),
	'the long wait is logged with role, scope, key and duration');
$waiter->quit;
$holder->quit;
my $log = slurp_file($node->logfile);
is(scalar(() = $log =~ /waited [\d.]+ ms for idempotency key/g), 1,
	'the wait shorter than idempotency.log_waits is not logged');
is($node->safe_psql('postgres', $counters), '1|1|1|1|2',
	'counted: new, replay, complete, IK002 and two waits');
is( $node->safe_psql('postgres', q{
		SELECT wait_max_ms >= 1200 AND wait_max_ms < wait_total_ms AND wait_total_ms >= 1300
		  FROM idempotency.stats WHERE scope = 'waits'}),
	't', 'wait_max_ms is the long wait, wait_total_ms both');

# --- forget() is logged; the worker's purges are counted ---------------------
$node->safe_psql('postgres', q{
	SET ROLE app;
	BEGIN;
	SELECT outcome FROM idempotency.begin('f1', scope => 'support');
	SELECT idempotency.fail('f1', '{"e": "declined"}', 'support', retryable => false);
	COMMIT;
	SELECT idempotency.forget('f1', 'support');
});
ok( $node->wait_for_log(
		qr/LOG:  role "app" forgot idempotency key "f1" in scope "support" \(status failed, attempt 1\)/),
	'forget() logs role, scope, key and what it deleted');
$node->safe_psql('postgres', q{
	SET ROLE app;
	BEGIN;
	SELECT count(*) FROM generate_series(1, 3) i, idempotency.begin('old-' || i, ttl => '1 ms');
	SELECT count(idempotency.complete('old-' || i, '{}')) FROM generate_series(1, 3) i;
	COMMIT;
});
ok( $node->poll_query_until('postgres', q{
		SELECT purged = 3 FROM idempotency.stats
		 WHERE role = current_user AND scope = '' AND database = 'postgres'}),
	'rows the worker purged are counted under its role, scope empty');
is( $node->safe_psql('postgres', q{SELECT forgotten FROM idempotency.stats WHERE role = 'app' AND scope = 'support'}),
	'1', 'and forget() under the key owner');

# --- eviction at stats_max ----------------------------------------------------
$node->safe_psql('postgres', q{
	SELECT idempotency.stats_reset();
	BEGIN;
	SELECT outcome FROM idempotency.begin('hot', scope => 'hot');
	SELECT idempotency.complete('hot', '{}', 'hot');
	COMMIT;
	SELECT count((idempotency.begin('hot', scope => 'hot')).outcome) FROM generate_series(1, 20);
	DO $$ BEGIN
	  FOR i IN 1..30 LOOP
	    BEGIN
	      PERFORM idempotency.complete('x', '{}', 'cold-' || i);
	    EXCEPTION WHEN SQLSTATE 'IK004' THEN NULL;
	    END;
	  END LOOP;
	END $$;
});
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.stats}), '10',
	'31 scopes, stats_max 10: 10 entries are kept');
is( $node->safe_psql('postgres', q{
		SELECT begin_new || ' ' || begin_replay || ' ' || completed FROM idempotency.stats WHERE scope = 'hot'}),
	'1 20 1', 'the most used entry is kept, its counters whole');
is( $node->safe_psql('postgres', q{SELECT ik004_not_held FROM idempotency.stats WHERE scope = 'cold-30'}),
	'1', 'the newest entry is there');

# --- the postgres_exporter recipe: every query runs for a pg_monitor role -------
# (prove runs in the repository's top directory)
my $yaml = CPAN::Meta::YAML->read_string(slurp_file('contrib/postgres_exporter/queries.yaml'))
  or die CPAN::Meta::YAML->errstr;
$node->safe_psql('postgres', q{CREATE ROLE exporter LOGIN IN ROLE pg_monitor});
$node->safe_psql('postgres', q{SELECT idempotency.create_topic('exporter-check')});	# a row for idempotency_outbox
my %queries = %{ $yaml->[0] };
ok(scalar(keys %queries) >= 4, 'queries.yaml has the stats, waiting, worker and table queries');
for my $name (sort keys %queries)
{
	my @declared = map { keys %$_ } @{ $queries{$name}{metrics} };
	my $csv = $node->safe_psql('postgres',
		"COPY ($queries{$name}{query}) TO STDOUT WITH (FORMAT csv, HEADER)",
		extra_params => [ '-U', 'exporter' ]);
	my ($header, @rows) = split /\n/, $csv;
	is($header, join(',', @declared), "$name: the columns are the declared metrics");
	ok(@rows >= 1, "$name: returns rows");
}
is( $node->safe_psql('postgres', $queries{idempotency_purge_worker}{query}), '1',
	'the worker query sees the purge launcher');

# the series stay bounded whatever scopes an application picks: a role with
# keys in 30 scopes (idempotency.stats_max is 10 here) gives no query more
# than stats_max rows, so no application can swell the monitoring's series
$node->safe_psql('postgres', q{
	SET ROLE app;
	BEGIN;
	SELECT count(idempotency.complete('many', '{}', 'many-' || i))
	  FROM generate_series(1, 30) AS i, LATERAL idempotency.begin('many', NULL, 'many-' || i) AS b;
	COMMIT;
});
for my $name (sort keys %queries)
{
	my $rows = $node->safe_psql('postgres', "SELECT count(*) FROM ($queries{$name}{query}) AS q",
		extra_params => [ '-U', 'exporter' ]);
	cmp_ok($rows, '<=', 10, "$name: at most stats_max rows with one role's keys in 30 scopes");
}
$node->safe_psql('postgres', q{DELETE FROM idempotency.idempotency_key WHERE key = 'many'});

# the SQL of docs/operations.md runs (blocks and alert table), and so does the
# README's "Operations" section
my ($ops) = slurp_file('docs/operations.md');
my ($readme_ops) = slurp_file('README.md') =~ /^## Operations\n(.*?)^## /ms;
my @ops_sql = ($ops =~ /```sql\n(.*?)```/gs, map { "$_;" } $ops =~ /\| `(SELECT [^`]*)`/g);
ok(@ops_sql >= 10, 'docs/operations.md has its queries');
my @readme_sql = ($readme_ops // '') =~ /```sql\n(.*?)```/gs;
ok(@readme_sql >= 1, "the README's Operations section has its query");
push @ops_sql, @readme_sql;
for my $sql (@ops_sql)
{
	my ($rc, $stdout, $stderr) = $node->psql('postgres', $sql, on_error_stop => 1);
	is($stderr, '', 'Operations query runs: ' . substr($sql =~ s/\s+/ /gr, 0, 60));
	($rc, $stdout, $stderr) = $node->psql('postgres', $sql, on_error_stop => 1,
		extra_params => [ '-U', 'exporter' ]);
	is($stderr, '', 'and as a pg_monitor role: ' . substr($sql =~ s/\s+/ /gr, 0, 60));
}

# the stuck-lease alert, as the page prints it, for the monitoring role: 0,
# then 1 once a lease of app's lapsed over an hour ago (set by hand)
my ($stuck) = $ops =~ /^\| stuck leases \| `(SELECT [^`]*)`/m;
ok(defined $stuck && $stuck =~ /idempotency\.key_health/, 'the stuck-lease alert reads key_health');
my @as_exporter = (extra_params => [ '-U', 'exporter' ]);
is($node->safe_psql('postgres', $stuck, @as_exporter), '0', 'stuck-lease alert: 0 with no lapsed lease');
$node->safe_psql('postgres', q{
	SET ROLE app;
	SELECT outcome FROM idempotency.begin('stuck-1', '{}', 'alerts', lease => '1 hour');
	RESET ROLE;
	UPDATE idempotency.idempotency_key SET locked_until = now() - interval '61 minutes'
	 WHERE key = 'stuck-1';
});
is($node->safe_psql('postgres', $stuck, @as_exporter), '1',
	'stuck-lease alert: 1 for the pg_monitor role once a lease lapsed over an hour ago');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'stuck-1'},
		@as_exporter), '0', 'and the role reads no key row');
is( $node->safe_psql('postgres', q{
		SELECT role || ' ' || scope || ' ' || in_progress || ' ' || lapsed_leases
		  FROM idempotency.key_health WHERE scope = 'alerts'}, @as_exporter),
	'app alerts 1 1', 'key_health names the role and scope of the stuck lease');
my ($rc, $stdout, $stderr) = $node->psql('postgres', "SET ROLE app; $stuck");
like($stderr, qr/permission denied for view key_health/, 'an application role may not read key_health');
$node->safe_psql('postgres', q{DELETE FROM idempotency.idempotency_key WHERE key = 'stuck-1'});

# --- a clean restart keeps the counters; a crash loses them -------------------
my $snapshot = q{SELECT string_agg(concat_ws(' ', role, scope, begin_new, begin_replay, completed,
	ik004_not_held, stats_since), ',' ORDER BY scope) FROM idempotency.stats};
my $before = $node->safe_psql('postgres', $snapshot);
$node->restart;
is($node->safe_psql('postgres', $snapshot), $before, 'the counters survive a clean restart');
ok(!-e $node->data_dir . '/pg_stat/idempotency.stat', 'the file is removed once read');

my $victim = $node->background_psql('postgres');
my $pid = $victim->query_safe('SELECT pg_backend_pid()');
kill 'KILL', $pid;
eval { $victim->quit };
ok($node->poll_query_until('postgres', 'SELECT count(*) = 0 FROM idempotency.stats'),
	'after a crash the counters start again from nothing');
$node->stop;

# --- without shared_preload_libraries ------------------------------------------
my $plain = PostgreSQL::Test::Cluster->new('plain');
$plain->init;
$plain->start;
$plain->safe_psql('postgres', q{CREATE EXTENSION idempotency});
($ret, $out, $err) = $plain->psql('postgres', q{\set VERBOSITY verbose
	SELECT * FROM idempotency.stats});
like($err, qr/ERROR:  55000: idempotency statistics are not being collected/,
	'without preloading the view raises 55000');
like($err, qr/HINT:  Add idempotency to shared_preload_libraries/, 'with a hint what to do');
($ret, $out, $err) = $plain->psql('postgres', q{\set VERBOSITY verbose
	SELECT idempotency.stats_reset()});
like($err, qr/ERROR:  55000/, 'and so does stats_reset()');
is( $plain->safe_psql('postgres', q{
		BEGIN;
		SELECT outcome FROM idempotency.begin('k');
		SELECT idempotency.complete('k', '{}');
		COMMIT;
		SELECT idempotency.forget('k')}),
	"new\n\nt", 'the guard and forget() work unpreloaded, counting nothing');
$plain->stop;

done_testing();
