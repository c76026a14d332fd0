# grant_topic() and alter_topic() racing drop_topic(): the C edition's grant
# locks the topic's row FOR KEY SHARE in its own statement and the alter
# checks it changed a row.  Under REPEATABLE READ the grant and the alter
# that wait for a drop_topic() that commits fail with a serialization
# failure (40001), under READ COMMITTED they find the topic gone (42704),
# never a foreign-key violation (23503) or silence; a drop that rolls back
# lets them through.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('grant_alter_drop_rr');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0
});
$node->start;
$node->safe_psql('postgres', q{CREATE EXTENSION idempotency; CREATE ROLE r});

# what $call gives in a $iso transaction that waits for a drop_topic() ending with $end
sub race
{
	my ($iso, $call, $end) = @_;
	$node->safe_psql('postgres', q{SELECT idempotency.create_topic('x')});
	my $d = $node->background_psql('postgres', on_error_stop => 1);
	$d->query_safe(q{BEGIN; SELECT idempotency.drop_topic('x', true)});
	my $g = $node->background_psql('postgres', on_error_stop => 0);
	$g->query_safe(qq{\\set VERBOSITY verbose
BEGIN ISOLATION LEVEL $iso; SELECT count(*) FROM idempotency.outbox_topic});
	$g->query_until(qr/sent/, "\\echo sent\nSELECT $call;\n\\echo done\n");
	$node->poll_query_until('postgres',
		q{SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock'});
	$d->query_safe($end);
	$g->query_until(qr/done/, '');
	my ($err) = $g->{stderr} =~ /ERROR:\s+(\w+)/;
	$g->query(q{ROLLBACK});
	$g->quit;
	$d->quit;
	$node->safe_psql('postgres', q{SELECT idempotency.drop_topic('x', true) FROM idempotency.outbox_topic WHERE name = 'x'});
	return $err // 'ok';
}

like(race('REPEATABLE READ', q{idempotency.grant_topic('x', 'r', true, true)}, 'COMMIT'),
	qr/^(40001|42704)$/, 'RR grant_topic() waiting for a committed drop: 40001 or 42704');
like(race('REPEATABLE READ', q{idempotency.alter_topic('x', max_attempts => 7)}, 'COMMIT'),
	qr/^(40001|42704)$/, 'RR alter_topic() waiting for a committed drop: 40001 or 42704');
is(race('REPEATABLE READ', q{idempotency.grant_topic('x', 'r', true, true)}, 'ROLLBACK'),
	'ok', 'RR grant_topic() waiting for a rolled-back drop goes through');
is(race('READ COMMITTED', q{idempotency.grant_topic('x', 'r', true, true)}, 'COMMIT'),
	'42704', 'RC grant_topic() waiting for a committed drop: 42704');
is(race('READ COMMITTED', q{idempotency.alter_topic('x', max_attempts => 7)}, 'COMMIT'),
	'42704', 'RC alter_topic() waiting for a committed drop: 42704');
is(race('READ COMMITTED', q{idempotency.alter_topic('x', max_attempts => 7)}, 'ROLLBACK'),
	'ok', 'RC alter_topic() waiting for a rolled-back drop goes through');

$node->stop;
done_testing();
