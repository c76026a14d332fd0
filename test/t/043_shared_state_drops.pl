# The outbox claims of an install are freed by every way the install can
# go, and by no drop that does not commit: DROP OWNED BY the extension's
# owner, DROP SCHEMA idempotency CASCADE, DROP DATABASE after a template
# clone; a DROP EXTENSION undone by ROLLBACK TO SAVEPOINT of an outer
# savepoint (its own released first) or by a PL/pgSQL exception block
# frees nothing.  A template clone of a database with claims starts with
# none in flight.  A topic's claims are freed by drop_topic(force) and by
# create_topic() taking over a dropped owner's topic, at their commit;
# REASSIGN OWNED then DROP OWNED BY the old owner frees nothing.
#
# The claim table has 64 places; database x holds all of them (claims of a
# day).  A probe in database other claims 64 messages for 1 ms: it gets 64
# when x's claims were freed (lapsed probe claims give their places back),
# none and a 53400 warning while x holds them.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('shared_drops');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0
idempotency.outbox_claims = 64
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE ROLE xowner SUPERUSER;
	CREATE DATABASE x;
	CREATE DATABASE other;
});
$node->safe_psql('other', q{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('o', max_attempts => 1000000);
	SELECT count(idempotency.publish('o', jsonb_build_object('n', i))) FROM generate_series(1, 64) i;
});

# the extension in x, made by xowner, with 64 messages claimed for a day
sub fill_x
{
	$node->safe_psql('x', q{
		SET ROLE xowner;
		CREATE EXTENSION idempotency;
		SELECT idempotency.create_topic('t');
		SELECT count(idempotency.publish('t', jsonb_build_object('n', i))) FROM generate_series(1, 64) i;
		SELECT count(*) FROM idempotency.claim('t', 64, '1 day');
	});
	is($node->safe_psql('x', q{SELECT count(*) FROM idempotency.outbox_in_flight}),
		'64', "$_[0]: database x holds 64 claims");
}

# how many messages a claim in database other gets, and whether it is warned
sub probe
{
	my ($rc, $out, $err) = $node->psql('other',
		q{SELECT count(*) FROM idempotency.claim('o', 64, '1 ms')});
	$node->safe_psql('other', q{SELECT pg_sleep(0.002)});	# the probe's claims lapse
	return $out . ($err =~ /WARNING/ ? ' warned' : '');
}

fill_x('start');
is(probe(), '0 warned', 'while x holds them, database other gets nothing');

$node->safe_psql('x', q{
	BEGIN;
	SAVEPOINT a;
	SAVEPOINT b;
	DROP EXTENSION idempotency CASCADE;
	RELEASE SAVEPOINT b;
	ROLLBACK TO SAVEPOINT a;
	COMMIT;
});
is($node->safe_psql('x', q{SELECT count(*) FROM idempotency.outbox_in_flight}),
	'64', 'a DROP EXTENSION released into a savepoint that is rolled back frees nothing');
$node->safe_psql('x', q{
	DO $$
	BEGIN
	  DROP EXTENSION idempotency CASCADE;
	  RAISE EXCEPTION 'undo';
	EXCEPTION WHEN raise_exception THEN
	  NULL;
	END $$;
});
is($node->safe_psql('x', q{SELECT count(*) FROM idempotency.outbox_in_flight}),
	'64', 'nor does one in a PL/pgSQL exception block that catches an error');
is(probe(), '0 warned', 'database other still gets nothing');

$node->safe_psql('x', q{DROP OWNED BY xowner});
is($node->safe_psql('x', q{SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'}),
	'0', 'DROP OWNED BY the extension\'s owner dropped it');
is(probe(), '64', 'and freed its claims: database other gets 64');

fill_x('again');
$node->safe_psql('x', q{DROP SCHEMA idempotency CASCADE});
is(probe(), '64', 'DROP SCHEMA idempotency CASCADE frees them');

fill_x('a third time');
$node->safe_psql('postgres', q{CREATE DATABASE xclone TEMPLATE x});
is($node->safe_psql('xclone', q{SELECT count(*) || ' ' || (SELECT count(*) FROM idempotency.outbox_message)
		FROM idempotency.outbox_in_flight}),
	'0 64', 'a template clone of x has its messages and none of x\'s claims');
is($node->safe_psql('x', q{SELECT count(*) FROM idempotency.outbox_in_flight}),
	'64', 'x keeps its claims');
$node->safe_psql('postgres', q{DROP DATABASE x});
is(probe(), '64', 'DROP DATABASE x frees them');
is($node->safe_psql('xclone', q{SET ROLE xowner; SELECT count(*) FROM idempotency.claim('t', 64, '1 ms')}),
	'64', 'and the clone\'s relay claims its 64 messages');

# a dropped topic's claims: freed at the commit of drop_topic(force), kept
# by one rolled back; and those of a topic taken over from a dropped owner
$node->safe_psql('xclone', q{
	SET ROLE xowner;
	SELECT count(*) FROM idempotency.claim('t', 64, '1 day');
	BEGIN;
	SELECT idempotency.drop_topic('t', force => true);
	ROLLBACK;
});
is(probe(), '0 warned', 'a drop_topic() rolled back frees no claim');
$node->safe_psql('xclone', q{SET ROLE xowner; SELECT idempotency.drop_topic('t', force => true)});
is(probe(), '64', 'drop_topic(force) frees its topic\'s claims: database other gets 64');

$node->safe_psql('xclone', q{
	CREATE ROLE gone SUPERUSER;	-- (a superuser: its topics fill the table, 046)
	SET ROLE gone;
	SELECT idempotency.create_topic('g');
	SELECT count(idempotency.publish('g', jsonb_build_object('n', i))) FROM generate_series(1, 64) i;
	SELECT count(*) FROM idempotency.claim('g', 64, '1 day');
	RESET ROLE;
	DROP ROLE gone;
});
is(probe(), '0 warned', 'the claims of a dropped owner\'s topic hold their places');
$node->safe_psql('xclone', q{SET ROLE xowner; SELECT idempotency.create_topic('g')});
is(probe(), '64', 'create_topic() taking its name over frees them');

# REASSIGN OWNED moves the extension to another role; a DROP OWNED BY the
# old owner then drops nothing and frees nothing
$node->safe_psql('xclone', q{
	SET ROLE xowner;
	SELECT count(idempotency.publish('g', jsonb_build_object('n', i))) FROM generate_series(1, 64) i;
	SELECT count(*) FROM idempotency.claim('g', 64, '1 day');
	RESET ROLE;
	REASSIGN OWNED BY xowner TO postgres;
	DROP OWNED BY xowner;
});
is($node->safe_psql('xclone', q{SELECT count(*) FROM idempotency.outbox_in_flight}),
	'64', 'after REASSIGN OWNED and DROP OWNED BY the old owner the claims are held');
is(probe(), '0 warned', 'and hold their places');

$node->stop;
done_testing();
