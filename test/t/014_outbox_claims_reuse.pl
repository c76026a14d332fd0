# Claims and acked counts in shared memory belong to the messages and topics
# they were made for, not to whatever later takes the same numbers.  They were keyed by (database oid, message id)
# and (database oid, topic id); both ids restart at 1 when the extension is
# dropped and created again, and a database dropped and created again with
# CREATE DATABASE ... OID (PostgreSQL 15) has the same oid.  Then a new
# message inherited a lapsed claim of the old one and went dead on its first
# claim, never handed out, with "visibility timeout" as its error; another
# stayed invisible behind an old message's held claim; and outbox_stats
# counted the old topic's acked messages as the new topic's.
#
# Here: both cases, with the claims of the old messages still in shared
# memory (one lapsed, one held for an hour, one acked and counted).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('claims_reuse');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0
});
$node->start;

# messages 1, 2, 3 of topic 1: 1 claimed for an hour, 2 claimed and acked
# (counted delivered in shared memory), 3 claimed for 1 ms (lapses, at
# max_attempts, and no later claim takes it over)
my $old = q{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('old', max_attempts => 1);
	SELECT count(idempotency.publish('old', jsonb_build_object('n', i))) FROM generate_series(1, 3) i;
	SELECT count(*) FROM idempotency.claim('old', 1, '1 hour');
	SELECT idempotency.ack(claim, ARRAY[id]) FROM idempotency.claim('old', 1, '1 hour');
	SELECT count(*) FROM idempotency.claim('old', 1, '1 ms');
	SELECT pg_sleep(0.05);
};
# the same numbers again: topic 1, messages 1, 2, 3
my $new = q{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('new', max_attempts => 1);
	SELECT count(idempotency.publish('new', jsonb_build_object('n', i))) FROM generate_series(1, 3) i;
};
my $check = sub {
	my ($db, $what) = @_;
	is($node->safe_psql($db, q{SELECT published || ' ' || delivered || ' ' || in_flight
			FROM idempotency.outbox_stats WHERE topic = 'new'}),
		'3 0 0', "$what: outbox_stats of the new topic: 3 published, none delivered or in flight");
	is($node->safe_psql($db, q{SELECT string_agg(id || ':' || attempt, ',' ORDER BY id)
			FROM idempotency.claim('new', 10, '1 hour')}),
		'1:1,2:1,3:1', "$what: a claim hands out the 3 new messages, each at attempt 1");
	is($node->safe_psql($db, q{SELECT count(*) FROM idempotency.outbox_message
			WHERE state <> 'pending' OR attempts <> 0}),
		'0', "$what: no new message went dead or had an attempt written");
};

$node->safe_psql('postgres', 'CREATE DATABASE a');
$node->safe_psql('a', $old);
is($node->safe_psql('a', q{SELECT string_agg(id::text, ',' ORDER BY id) FROM idempotency.outbox_in_flight}),
	'1,3', 'claims of the old messages 1 (held) and 3 (lapsed) in shared memory');
$node->safe_psql('a', 'DROP EXTENSION idempotency CASCADE');
$node->safe_psql('a', $new);
$check->('a', 'DROP and CREATE EXTENSION');

$node->safe_psql('postgres', 'CREATE DATABASE b');
my $oid = $node->safe_psql('postgres', q{SELECT oid FROM pg_database WHERE datname = 'b'});
$node->safe_psql('b', $old);
$node->safe_psql('postgres', 'DROP DATABASE b');
$node->safe_psql('postgres', "CREATE DATABASE b2 OID = $oid");
$node->safe_psql('b2', $new);
$check->('b2', 'DROP DATABASE, CREATE DATABASE with its oid');

$node->stop;
done_testing();
