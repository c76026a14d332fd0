# No role can stall the purge workers.  0.5.0: a role
# holding alter_topic() open on its own topic made the outbox purge of that
# database wait on the topic row (no SKIP LOCKED, no timeout), and the
# launcher waited for that database's worker with no bound, so no database
# after it was purged until the role's transaction ended.
#
# Here a plain role holds alter_topic() on its topic and an expired key of
# its own open in database a, which the launcher visits before database b:
# b is purged, so is everything of a that is not held, and once the role
# commits, the held rows go too, counted once.  Then something a worker
# cannot skip (a superuser's LOCK TABLE in a) is bounded by
# idempotency.purge_timeout: the launcher stops that worker, says so naming
# a, and b is purged in the same cycle.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('blocked');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0
idempotency.purge_batch = 100
idempotency.purge_timeout = '10min'
});
$node->start;

# a before b in pg_database, which is the order the launcher visits them
$node->safe_psql('postgres', q{
	CREATE ROLE alice LOGIN;
	CREATE DATABASE a;
	CREATE DATABASE b;
});
for my $db ('a', 'b')
{
	$node->safe_psql($db, q{CREATE EXTENSION idempotency});
}

# database a: alice's topics t1 and t2, 5 messages each delivered (ack
# deletes them and counts them in shared memory, for the purge to write into
# the topics' rows: 0.6.0), and 3 expired keys
$node->safe_psql('a', q{
	SET ROLE alice;
	SELECT idempotency.create_topic('t1', retention => '0');
	SELECT idempotency.create_topic('t2', retention => '0');
	SELECT count(idempotency.publish(t, jsonb_build_object('i', i)))
	  FROM generate_series(1, 5) i, (VALUES ('t1'), ('t2')) v(t);
	SELECT count(*) FROM (SELECT idempotency.ack(c.claim, array_agg(c.id))
	  FROM idempotency.claim('t1', 10) c GROUP BY c.claim) x;
	SELECT count(*) FROM (SELECT idempotency.ack(c.claim, array_agg(c.id))
	  FROM idempotency.claim('t2', 10) c GROUP BY c.claim) x;
	BEGIN;
	SELECT count(*) FROM generate_series(1, 3) i, idempotency.begin('old-' || i, ttl => '1 ms');
	SELECT count(idempotency.complete('old-' || i, '{}')) FROM generate_series(1, 3) i;
	COMMIT;
});
is( $node->safe_psql('a', q{SELECT (SELECT count(*) FROM idempotency.outbox_message)
		|| ' ' || (SELECT sum(c.delivered) FROM idempotency.outbox_topic AS t,
		                  idempotency._outbox_counts(t.id) AS c)}),
	'0 10', 'database a has 10 delivered messages, deleted and counted in shared memory');

# alice holds her topic t1 (alter_topic) and a key she has begun, in one
# open transaction
my $alice = $node->background_psql('a', on_error_stop => 1);
$alice->query_safe(q{SET ROLE alice});
$alice->query_safe(q{BEGIN});
$alice->query_safe(q{SELECT idempotency.alter_topic('t1', max_attempts => 5)});
$alice->query_safe(q{SELECT outcome FROM idempotency.begin('held')});

# database b: expired keys
$node->safe_psql('b', q{
	BEGIN;
	SELECT count(*) FROM generate_series(1, 7) i, idempotency.begin('b-old-' || i, ttl => '1 ms');
	SELECT count(idempotency.complete('b-old-' || i, '{}')) FROM generate_series(1, 7) i;
	COMMIT;
	SELECT pg_sleep(0.01);
});

my $offset = -s $node->logfile;
$node->append_conf('postgresql.conf', "idempotency.purge_interval = '1s'\n");
$node->reload;

ok( $node->poll_query_until('b', q{SELECT count(*) = 0 FROM idempotency.idempotency_key}),
	'database b is purged while a role holds its topic and a key open in database a');
ok( $node->poll_query_until('a', q{
		SELECT string_agg(name || ':' || purged_delivered, ',' ORDER BY name) = 't1:0,t2:5'
		  FROM idempotency.outbox_topic}),
	'in database a the counts of the topic nobody holds are written, the held topic\'s are left');
ok( $node->poll_query_until('a', q{SELECT count(*) = 0 FROM idempotency.idempotency_key}),
	'and the expired keys of database a are purged');
unlike(substr(slurp_file($node->logfile), $offset), qr/purge_timeout/,
	'no worker needed the timeout: nothing waited');

# the role commits: the held counts go at a later cycle, counted once
$alice->query_safe(q{SELECT idempotency.complete('held', '{}')});
$alice->query_safe(q{COMMIT});
ok( $node->poll_query_until('a', q{
		SELECT string_agg(name || ':' || purged_delivered, ',' ORDER BY name) = 't1:5,t2:5'
		  FROM idempotency.outbox_topic}),
	'after the role commits, the held topic\'s counts are written too');
is( $node->safe_psql('a', q{SELECT string_agg(topic || ':' || published || '/' || delivered, ',' ORDER BY topic)
		FROM idempotency.outbox_stats}),
	't1:5/5,t2:5/5', 'each purged message is counted once in outbox_stats');
is( $node->safe_psql('a', q{SELECT (SELECT max_attempts FROM idempotency.outbox_topic WHERE name = 't1')
		|| ' ' || (SELECT string_agg(key, ',') FROM idempotency.idempotency_key)}),
	'5 held', 'and the role\'s transaction took effect: alter_topic() and its key');

# a lock no batch can skip: a superuser's LOCK TABLE in database a.  The
# launcher gives up on a after purge_timeout, says so, and goes on to b.
$node->append_conf('postgresql.conf', "idempotency.purge_timeout = '2s'\n");
$node->reload;
$node->safe_psql('b', q{
	BEGIN;
	SELECT outcome FROM idempotency.begin('b-later', ttl => '1 ms');
	SELECT idempotency.complete('b-later', '{}');
	COMMIT;
});
my $dba = $node->background_psql('a', on_error_stop => 1);
$dba->query_safe(q{BEGIN});
$dba->query_safe(q{LOCK TABLE idempotency.idempotency_key IN ACCESS EXCLUSIVE MODE});
$offset = -s $node->logfile;
ok( $node->wait_for_log(
		qr/idempotency purge launcher: the purge of database "a" took longer than idempotency.purge_timeout \(2 s\)/,
		$offset),
	'the launcher says it stopped the purge of database a after purge_timeout');
ok( $node->poll_query_until('b', q{SELECT count(*) = 0 FROM idempotency.idempotency_key}),
	'and database b is purged while database a stays locked');
$dba->query_safe(q{COMMIT});
$dba->quit;
$alice->quit;

my $launcher = q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency purge launcher'};
ok($node->poll_query_until('postgres', $launcher), 'the launcher kept going');
$node->stop;

done_testing();
