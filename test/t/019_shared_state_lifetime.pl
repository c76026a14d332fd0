# What the extension keeps in shared memory (outbox claims, acked counts,
# statistics) belongs to one database and one install of the extension, and
# is freed when that database or install goes: nothing of it passes to a
# database created again with the dropped one's oid from the same template
# (as its outbox and topics are the template's, the message, topic and
# sequence numbers are the same), and a full claim table is given back by
# DROP DATABASE and by DROP EXTENSION, not held until the claims lapse.
# A drop that does not commit frees nothing; DROP ROLE frees the role's
# statistics.  A claim that took over a lapsed claim, prepared and rolled
# back, leaves the lapsed attempt counted, as a plain rollback does.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('shared_lifetime');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0
idempotency.outbox_claims = 64
max_prepared_transactions = 10
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# a template with the extension, a topic and 70 messages
$node->safe_psql('postgres', 'CREATE DATABASE tpl');
$node->safe_psql('tpl', q{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('t', max_attempts => 1);
	SELECT count(idempotency.publish('t', jsonb_build_object('n', i))) FROM generate_series(1, 70) i;
});

# database s from it: message 1 claimed for an hour, message 2 acked (its
# count in shared memory), one guard call (a statistics entry)
$node->safe_psql('postgres', 'CREATE DATABASE s TEMPLATE tpl');
my $oid = $node->safe_psql('postgres', q{SELECT oid FROM pg_database WHERE datname = 's'});
$node->safe_psql('s', q{
	SELECT count(*) FROM idempotency.claim('t', 1, '1 hour');
	SELECT idempotency.ack(claim, ARRAY[id]) FROM idempotency.claim('t', 1, '1 hour');
	BEGIN;
	SELECT outcome FROM idempotency.begin('k', '{}', 'scope');
	SELECT idempotency.complete('k', '{}', 'scope');
	COMMIT;
});
is($node->safe_psql('s', q{SELECT string_agg(id::text, ',') FROM idempotency.outbox_in_flight}),
	'1', 'database s: message 1 in flight');
is($node->safe_psql('s', q{SELECT delivered FROM idempotency.outbox_stats WHERE topic = 't'}),
	'1', 'database s: one message delivered');
is($node->safe_psql('postgres', "SELECT count(*) FROM idempotency.stats() WHERE dbid = $oid"),
	'1', 'database s: one statistics entry');

$node->safe_psql('postgres', 'DROP DATABASE s');
is($node->safe_psql('postgres', "SELECT count(*) FROM idempotency.stats() WHERE dbid = $oid"),
	'0', 'DROP DATABASE frees its statistics entries');

# the same oid, the same template: the same sequence, topic and message ids
$node->safe_psql('postgres', "CREATE DATABASE s2 TEMPLATE tpl OID = $oid");
is($node->safe_psql('s2', q{SELECT count(*) FROM idempotency.outbox_in_flight}),
	'0', 'a database created again with its oid: nothing in flight');
is($node->safe_psql('s2', q{SELECT published || ' ' || delivered || ' ' || in_flight
		FROM idempotency.outbox_stats WHERE topic = 't'}),
	'70 0 0', 'its outbox_stats: 70 published, none delivered or in flight');
is($node->safe_psql('s2', q{SELECT string_agg(id || ':' || attempt, ',' ORDER BY id)
		FROM idempotency.claim('t', 2, '1 hour')}),
	'1:1,2:1', 'a claim hands out messages 1 and 2, each at attempt 1');
$node->safe_psql('postgres', 'DROP DATABASE s2');

# a full claim table: 64 claims in a scratch database
my ($stdout, $stderr);
$node->safe_psql('postgres', 'CREATE DATABASE scratch TEMPLATE tpl');
$node->safe_psql('postgres', 'CREATE DATABASE other TEMPLATE tpl');
is($node->safe_psql('scratch', q{SELECT count(*) FROM idempotency.claim('t', 64, '1 hour')}),
	'64', 'scratch: 64 claims, the table full');
$node->psql('other', q{SELECT count(*) FROM idempotency.claim('t', 1, '1 hour')},
	stdout => \$stdout, stderr => \$stderr);
is($stdout, '0', 'another database gets none while they are held');
like($stderr, qr/outbox_claims/, 'and a warning');
$node->safe_psql('postgres', 'DROP DATABASE scratch');
$node->psql('other', q{SELECT count(*) FROM idempotency.claim('t', 5, '1 hour')},
	stdout => \$stdout, stderr => \$stderr);
is($stdout, '5', 'DROP DATABASE scratch: another database claims again');
is($stderr, '', 'without a warning');

# the same with DROP EXTENSION: 59 more claims in other fill the table
is($node->safe_psql('other', q{SELECT count(*) FROM idempotency.claim('t', 64, '1 hour')}),
	'59', 'other: the table full again');
$node->safe_psql('other', q{
	DROP EXTENSION idempotency CASCADE;
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('t');
	SELECT count(idempotency.publish('t', jsonb_build_object('n', i))) FROM generate_series(1, 3) i;
});
$node->psql('other', q{SELECT string_agg(id || ':' || attempt, ',' ORDER BY id) FROM idempotency.claim('t', 5, '1 hour')},
	stdout => \$stdout, stderr => \$stderr);
is($stdout, '1:1,2:1,3:1', 'DROP and CREATE EXTENSION: the new install claims its messages');
is($stderr, '', 'without a warning');
$node->safe_psql('other', q{
	BEGIN;
	SELECT outcome FROM idempotency.begin('k', '{}', 'scope');
	SELECT idempotency.complete('k', '{}', 'scope');
	COMMIT;
	DROP EXTENSION idempotency CASCADE;
	CREATE EXTENSION idempotency;
});
my $other = $node->safe_psql('postgres', q{SELECT oid FROM pg_database WHERE datname = 'other'});
is($node->safe_psql('other', "SELECT count(*) FROM idempotency.stats() WHERE dbid = $other"),
	'0', 'DROP EXTENSION frees its statistics entries');

# a drop that does not commit frees nothing: other's install has 3 claims
$node->safe_psql('other', q{
	SELECT idempotency.create_topic('t');
	SELECT count(idempotency.publish('t', jsonb_build_object('n', i))) FROM generate_series(1, 3) i;
	SELECT count(*) FROM idempotency.claim('t', 3, '1 hour');
});
$node->safe_psql('other', q{
	BEGIN;
	SAVEPOINT s;
	DROP EXTENSION idempotency CASCADE;
	ROLLBACK TO SAVEPOINT s;
	COMMIT;
});
is($node->safe_psql('other', q{SELECT count(*) FROM idempotency.outbox_in_flight}),
	'3', 'DROP EXTENSION rolled back to a savepoint: the 3 claims are kept');
$node->safe_psql('other', q{BEGIN; SELECT 1; PREPARE TRANSACTION 'hold'});
my ($ret) = $node->psql('postgres', 'DROP DATABASE other', stderr => \$stderr,
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($stderr, qr/55006/, 'DROP DATABASE of a database with a prepared transaction fails (55006)');
is($node->safe_psql('other', q{SELECT count(*) FROM idempotency.outbox_in_flight}),
	'3', 'and its 3 claims are kept');
$node->safe_psql('other', q{ROLLBACK PREPARED 'hold'});

# DROP EXTENSION prepared, then COMMIT PREPARED (in a session without the
# dropping session's callbacks): a claim that finds the table full frees
# the earlier install's 3 claims
$node->safe_psql('other', q{
	BEGIN;
	DROP EXTENSION idempotency CASCADE;
	PREPARE TRANSACTION 'dropx';
	COMMIT PREPARED 'dropx';
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('t');
	SELECT count(idempotency.publish('t', jsonb_build_object('n', i))) FROM generate_series(1, 64) i;
});
$node->psql('other', q{SELECT count(*) FROM idempotency.claim('t', 64, '1 ms')},
	stdout => \$stdout, stderr => \$stderr);
is($stdout, '64', 'DROP EXTENSION committed prepared: a full table frees its claims, 64 claimed');
is($stderr, '', 'without a warning');

# DROP ROLE: the role's statistics
$node->safe_psql('postgres', q{
	CREATE ROLE gone;
	SET ROLE gone;
	BEGIN;
	SELECT outcome FROM idempotency.begin('g', '{}', 'scope');
	SELECT idempotency.complete('g', '{}', 'scope');
	COMMIT;
});
my $role = $node->safe_psql('postgres', q{SELECT oid FROM pg_roles WHERE rolname = 'gone'});
is($node->safe_psql('postgres', "SELECT count(*) FROM idempotency.stats() WHERE userid = $role"),
	'1', 'a role with a statistics entry');
$node->safe_psql('postgres', 'DROP ROLE gone');
is($node->safe_psql('postgres', "SELECT count(*) FROM idempotency.stats() WHERE userid = $role"),
	'0', 'DROP ROLE frees its statistics entries');

# a prepared takeover rolled back: the lapsed attempt still counts
$node->safe_psql('postgres', q{
	SELECT idempotency.create_topic('p', max_attempts => 2);
	SELECT idempotency.publish('p', '{}');
	SELECT idempotency.publish('p', '{}');
});
# message 1: claimed (attempt 1) until it lapses
$node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.claim('p', 1, '1 ms')});
$node->poll_query_until('postgres', q{SELECT claimed_until < clock_timestamp() FROM idempotency.outbox_in_flight WHERE id = 1})
  or die 'the claim did not lapse';
is($node->safe_psql('postgres', q{
	BEGIN;
	SELECT id || ':' || attempt FROM idempotency.claim('p', 1, '1 hour');
	PREPARE TRANSACTION 'takeover';
	ROLLBACK PREPARED 'takeover';
}), '1:2', 'a takeover of the lapsed claim: attempt 2, prepared, rolled back');
is($node->safe_psql('postgres', q{SELECT id || ':' || attempt FROM idempotency.outbox_in_flight WHERE id = 1}),
	'1:1', 'the lapsed claim is back, attempt 1');
is($node->safe_psql('postgres', q{SELECT id || ':' || attempt FROM idempotency.claim('p', 1, '1 ms')}),
	'1:2', 'the next claim is attempt 2, as after a plain rollback');
$node->poll_query_until('postgres', q{SELECT claimed_until < clock_timestamp() FROM idempotency.outbox_in_flight WHERE id = 1})
  or die 'the claim did not lapse';
is($node->safe_psql('postgres', q{SELECT string_agg(id || ':' || attempt, ',') FROM idempotency.claim('p', 1, '1 hour')}),
	'2:1', 'at max_attempts the lapsed message 1 is not handed out again: message 2 is');
is($node->safe_psql('postgres', q{SELECT state FROM idempotency.outbox_message WHERE id = 1}),
	'dead', 'message 1 is dead');

# a clean restart keeps the statistics (pg_stat/idempotency.stat) of the
# databases and roles that exist, none of those dropped
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT outcome FROM idempotency.begin('kept', '{}', 'scope');
	SELECT idempotency.complete('kept', '{}', 'scope');
	COMMIT;
});
$node->restart;
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.stats() AS s
		WHERE s.dbid NOT IN (SELECT oid FROM pg_database)
		   OR s.userid NOT IN (SELECT oid FROM pg_roles)}),
	'0', 'after a restart: no statistics of a dropped database or role');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.stats
		WHERE database = 'postgres' AND role = current_user}),
	'1', 'and those of the others are kept');
is($node->safe_psql('other', q{SELECT count(*) FROM idempotency.outbox_in_flight}),
	'0', 'and no claim');

$node->stop;
done_testing();
