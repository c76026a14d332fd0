# A role's share of the claim table in shared memory (046) counts the
# claims that hold messages: not the role's lapsed claims, nor those whose
# prepared transaction rolled back.  Those hold places only until the
# table, once full, sweeps them; counted against the role, a relay that
# crashed (or a claim prepared and rolled back) left the role's other
# topics unable to claim anything until the table filled with other
# roles' claims.
#
# With a 64-entry table: role lag claims 40 of topic old for 10 ms and gets
# 32 (half the table); once they lapse, it still claims its topic new, and
# takes its lapsed claims of old over up to its share.  Role prep claims 32
# in a prepared transaction that rolls back; its other topic still claims.
# Lapsed claims taken over are live again: they count (role many).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('claims_share_lapsed');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0
idempotency.outbox_claims = 64
max_prepared_transactions = 2
});
$node->start;
$node->safe_psql('postgres', q{CREATE ROLE lag; CREATE ROLE prep});
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$node->safe_psql('postgres', q{
	SET ROLE lag;
	SELECT idempotency.create_topic('old');
	SELECT idempotency.create_topic('new');
	SELECT count(idempotency.publish('old', jsonb_build_object('n', i))) FROM generate_series(1, 40) i;
	SELECT idempotency.publish('new', '{"n": 1}');
	SET ROLE prep;
	SELECT idempotency.create_topic('p1');
	SELECT idempotency.create_topic('p2');
	SELECT count(idempotency.publish('p1', jsonb_build_object('n', i))) FROM generate_series(1, 40) i;
	SELECT idempotency.publish('p2', '{"n": 1}');
});

my ($rc, $out, $err) = $node->psql('postgres',
	q{SET ROLE lag; SELECT count(*) FROM idempotency.claim('old', 40, '10 milliseconds')});
is($out, '32', 'role lag claims 40 for 10 ms and gets 32: half the table');
like($err, qr/the topics of role "lag" hold an eighth/, 'and is warned');
$node->poll_query_until('postgres', q{
	SELECT count(*) = 0 FROM idempotency.outbox_in_flight WHERE claimed_until > now()})
  or die 'the claims did not lapse';

($rc, $out, $err) = $node->psql('postgres',
	q{SET ROLE lag; SELECT count(*) FROM idempotency.claim('new', 1, '1 minute')});
is($out, '1', 'once its claims lapsed, role lag claims its other topic');
is($err, '', 'and is not warned');
($rc, $out, $err) = $node->psql('postgres',
	q{SET ROLE lag; SELECT count(*) FROM idempotency.claim('old', 40, '1 minute')});
is($out, '7', 'and takes 7 of its 32 lapsed claims over: 8 live claims, its eighth');
like($err, qr/the topics of role "lag" hold an eighth/, 'warned at its share');

# lag's claims end: the table is empty again
$node->safe_psql('postgres', q{
	SET ROLE lag;
	SELECT idempotency.ack(c.claim, array_agg(c.id))
	  FROM idempotency.outbox_in_flight AS c GROUP BY c.claim;
});
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.outbox_in_flight}),
	'0', 'no claim is held');

# a claim prepared and rolled back holds no share
$node->safe_psql('postgres', q{
	BEGIN;
	SET LOCAL ROLE prep;
	SELECT count(*) FROM idempotency.claim('p1', 40, '1 hour');
	PREPARE TRANSACTION 'claims';
});
$node->safe_psql('postgres', q{ROLLBACK PREPARED 'claims'});
($rc, $out, $err) = $node->psql('postgres',
	q{SET ROLE prep; SELECT count(*) FROM idempotency.claim('p2', 1, '1 hour')});
is($out, '1', 'after a prepared claim of 32 rolled back, role prep claims its other topic');
is($err, '', 'and is not warned');

# nor can lapsed claims be taken over past the share: role many's claims
# of three topics, 8 each (each call counts none of the others, lapsed),
# lapse; taken over for an hour, they are live claims again, and hold no
# more than an eighth (the 32 places of prep's rolled back claims keep the
# table half full)
$node->safe_psql('postgres', q{SET ROLE prep; SELECT idempotency.ack(c.claim, array_agg(c.id))
	  FROM idempotency.outbox_in_flight AS c GROUP BY c.claim});
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.outbox_in_flight}),
	'0', 'no claim is held');
$node->safe_psql('postgres', q{CREATE ROLE many});
for my $i (1 .. 3)
{
	$node->safe_psql('postgres', qq{
		SET ROLE many;
		SELECT idempotency.create_topic('c$i');
		SELECT count(idempotency.publish('c$i', jsonb_build_object('n', i))) FROM generate_series(1, 8) i;
	});
	is($node->safe_psql('postgres',
			qq{SET ROLE many; SELECT count(*) FROM idempotency.claim('c$i', 8, '10 milliseconds')}),
		'8', "role many claims 8 of topic c$i for 10 ms");
}
$node->poll_query_until('postgres', q{
	SELECT count(*) = 0 FROM idempotency.outbox_in_flight
	 WHERE topic LIKE 'c_' AND claimed_until > now()})
  or die 'the claims did not lapse';
for my $i (1 .. 3)
{
	$node->psql('postgres',
		qq{SET ROLE many; SELECT count(*) FROM idempotency.claim('c$i', 8, '1 hour')});
}
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.outbox_in_flight
	WHERE claimed_until > now()}),
	'8', 'its lapsed claims taken over for an hour: role many holds its eighth, no more');

$node->stop;
done_testing();
