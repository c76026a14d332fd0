# The claim table in shared memory (idempotency.outbox_claims entries for
# the whole cluster) gives each role a share, as the acked counts do
# (outbox_counts.c): once half the table is in use, the topics of a role
# that hold an eighth of it take no more.  Without it, any role could
# create a topic, publish to it and claim its own messages with a long
# visibility, and so fill the table for every role of every database:
# until those claims lapsed (a visibility of a year: until a restart) every
# other relay got nothing and a 53400 warning.
#
# Here, with a 64-entry table: role hog, in database one, claims 64 of its
# messages for a year and gets 32 (half the table); a second hostile role
# gets 8 more; role victim, in database two, still claims its message with
# no warning; hog's next claim gets none and is warned, naming hog; an ack
# gives hog room again; a superuser's topic is not limited (no tenant).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('claims_share');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0
idempotency.outbox_claims = 64
});
$node->start;
$node->safe_psql('postgres', q{CREATE ROLE hog; CREATE ROLE victim});
for my $db ('one', 'two')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
}

$node->safe_psql('postgres', q{CREATE ROLE hog2});
$node->safe_psql('one', q{
	SET ROLE hog;
	SELECT idempotency.create_topic('hog');
	SELECT count(idempotency.publish('hog', jsonb_build_object('n', i))) FROM generate_series(1, 64) i;
	SET ROLE hog2;
	SELECT idempotency.create_topic('hog2');
	SELECT count(idempotency.publish('hog2', jsonb_build_object('n', i))) FROM generate_series(1, 64) i;
});
my ($rc, $out, $err) = $node->psql('one',
	q{SET ROLE hog; SELECT count(*) FROM idempotency.claim('hog', 64, '1 year')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
is($out, '32', 'role hog claims 64 for a year and gets 32: half the table');
like($err, qr/WARNING:  53400: the topics of role "hog" hold an eighth of idempotency.outbox_claims \(64\): claim\(\) hands out fewer/,
	'and is warned, naming its role');
($rc, $out, $err) = $node->psql('one',
	q{SET ROLE hog2; SELECT count(*) FROM idempotency.claim('hog2', 64, '1 year')});
is($out, '8', 'a second role gets an eighth, 8');
is($node->safe_psql('one', q{SELECT count(*) FROM idempotency.outbox_in_flight}),
	'40', '40 claims are held in database one');

$node->safe_psql('two', q{
	SET ROLE victim;
	SELECT idempotency.create_topic('work');
	SELECT idempotency.publish('work', '{"n": 1}');
});
($rc, $out, $err) = $node->psql('two',
	q{SET ROLE victim; SELECT count(*) FROM idempotency.claim('work', 10, '30 seconds')});
is($out, '1', 'role victim in database two claims its one message');
unlike($err, qr/WARNING/, 'and is not warned of a full table');
note("victim's claim said: $err") if $err ne '';

($rc, $out, $err) = $node->psql('one',
	q{SET ROLE hog; SELECT count(*) FROM idempotency.claim('hog', 64, '1 year')});
is($out, '0', "hog's next claim gets none");
like($err, qr/the topics of role "hog" hold an eighth/, 'and is warned again');

# an ack frees hog's places: its next claim gets as many again
$node->safe_psql('one', q{
	SET ROLE hog;
	SELECT idempotency.ack(c.claim, array_agg(c.id))
	  FROM idempotency.outbox_in_flight AS c GROUP BY c.claim;
});
($rc, $out, $err) = $node->psql('one',
	q{SET ROLE hog; SELECT count(*) FROM idempotency.claim('hog', 64, '1 year')});
is($out, '23', "after hog's ack its next claim gets messages again, up to half the table (8 + 1 + 23)");

# a superuser's topics are not limited: they take the rest of the table
$node->safe_psql('one', q{
	SELECT idempotency.create_topic('admin');
	SELECT count(idempotency.publish('admin', jsonb_build_object('n', i))) FROM generate_series(1, 64) i;
});
($rc, $out, $err) = $node->psql('one', q{SELECT count(*) FROM idempotency.claim('admin', 64, '1 hour')});
is($out, '32', "a superuser's topic takes the other half of the table");
like($err, qr/idempotency.outbox_claims \(64\) messages are claimed/, 'and is warned that the table is full');

$node->stop;
done_testing();
