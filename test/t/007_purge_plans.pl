# purge() is linear in its batch.  0.5.0 matched each
# batch by (tableoid, ctid) = ANY (ARRAY(SELECT ...)): a linear search of
# the batch's array for every row it deleted, so the default batch of 10000
# took seconds.  The plans of the DELETEs a purge runs are captured with
# auto_explain (nested statements, at NOTICE) on a plain key table, a
# hash-partitioned one (the README's recipe, sql/partitioned.sql) and for
# delivered outbox messages: each must find its rows by TID (a Tid Scan),
# and no plan node may search an array per row (a Filter with "= ANY").
# (20000 rows a table: on a table of a few pages a Seq Scan is cheaper.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('plans');
$node->init;
$node->append_conf('postgresql.conf', q{idempotency.purge_interval = 0});
$node->start;

open(my $fh, '<', 'sql/partitioned.sql') or die "sql/partitioned.sql: $!";
my $sql = do { local $/; <$fh> };
close $fh;
my ($recipe) = $sql =~ /^-- the recipe \(README\), in one transaction\n(.*?^COMMIT;)/ms
  or die 'recipe not found in sql/partitioned.sql';

$node->safe_psql('postgres', q{CREATE DATABASE plain; CREATE DATABASE parted});
$node->safe_psql($_, 'CREATE EXTENSION idempotency') for ('plain', 'parted');
$node->safe_psql('parted', $recipe);

# 20000 expired rows in each table, delivered outbox messages included, so
# that a DELETE by TID is the plan of choice on every table and partition
my $load = q{
	INSERT INTO idempotency.idempotency_key (owner, scope, key, status, response, attempts, created_at, updated_at, expires_at)
	SELECT 'postgres', '', 'expired-' || i, 'completed', '{}', 1,
	       now() - interval '2 days', now() - interval '2 days', now() - interval '1 day'
	  FROM generate_series(1, 20000) i;
	INSERT INTO idempotency.token (token, owner, scope, created_at, expires_at)
	SELECT gen_random_uuid(), 'postgres', '', now() - interval '2 days', now() - interval '1 day'
	  FROM generate_series(1, 20000) i;
	INSERT INTO idempotency.seen_message (owner, scope, message_id, first_seen_at, expires_at)
	SELECT 'postgres', 'q', 'm-' || i, now() - interval '2 days', now() - interval '1 day'
	  FROM generate_series(1, 20000) i;
	SELECT idempotency.create_topic('t', retention => '0');
	INSERT INTO idempotency.outbox_message (id, topic_id, owner, message_id, payload, headers, state,
	       attempts, available_at, published_at, published_by, delivered_at, expires_at)
	SELECT nextval('idempotency.outbox_message_id_seq'), t.id, 'postgres', gen_random_uuid(),
	       jsonb_build_object('i', i), '{}', 'delivered', 2, now() - interval '2 days',
	       now() - interval '2 days', 'postgres', now() - interval '1 day', now() - interval '1 day'
	  FROM generate_series(1, 20000) i, idempotency.outbox_topic t;
	ANALYZE;
};
$node->safe_psql($_, $load) for ('plain', 'parted');

# the plans of every statement purge() runs, as NOTICEs
sub purge_plans
{
	my ($db, $batch) = @_;
	my ($stdout, $stderr);
	$node->psql(
		$db, qq{
		LOAD 'auto_explain';
		SET auto_explain.log_min_duration = 0;
		SET auto_explain.log_nested_statements = on;
		SET auto_explain.log_level = notice;
		SET client_min_messages = notice;
		SELECT idempotency.purge($batch);},
		stdout => \$stdout,
		stderr => \$stderr,
		on_error_die => 1);
	return ($stdout, $stderr);
}

for my $db ('plain', 'parted')
{
	# two batches: the first plans, the second runs the kept plans
	for my $round (1, 2)
	{
		my ($purged, $plans) = purge_plans($db, 1000);
		my @deletes = grep { /Delete on / } split /(?=NOTICE:  duration)/, $plans;
		ok(scalar(@deletes) >= 4, "$db, batch $round: the DELETEs of the purge are logged (" . scalar(@deletes) . ')')
		  or diag($plans);
		my @searching = grep { /Filter:[^\n]*= ANY/ } @deletes;
		is(scalar(@searching), 0, "$db, batch $round: no DELETE searches an array per row")
		  or diag(join("\n", @searching));
		# the scans of the DELETE's target (alias t, or t_1 ... per partition)
		my @by_tid = grep { /Tid Scan on \w+ t(_\d+)?\s/ && !/(Seq|Index|Bitmap Heap) Scan on \w+ t(_\d+)?\s/ } @deletes;
		is(scalar(@by_tid), scalar(@deletes), "$db, batch $round: every DELETE finds its rows by TID")
		  or diag($plans);
	}
	is( $node->safe_psql($db, q{SELECT (SELECT count(*) FROM idempotency.idempotency_key) || ' '
		|| (SELECT count(*) FROM idempotency.token) || ' ' || (SELECT count(*) FROM idempotency.seen_message)
		|| ' ' || (SELECT count(*) FROM idempotency.outbox_message)}),
		'18000 18000 18000 18000', "$db: the two batches deleted 2000 rows of each table");
	is( $node->safe_psql($db, q{SELECT published || ' ' || delivered || ' ' || retried FROM idempotency.outbox_stats}),
		'20000 20000 20000', "$db: outbox_stats counts the purged messages (and their retries) once");
}
$node->stop;

done_testing();
