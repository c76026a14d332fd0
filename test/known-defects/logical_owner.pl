# Logical replication of the key table to another cluster (a blue/green
# switch, a major upgrade by replication; issue 25, attack-id).  Roles have
# other oids on the subscriber.  On a single server the owner column is a
# regrole, which has binary send/receive functions: a subscription with
# binary = true carries each row's owner as the publisher's oid, and the
# subscriber reads it as whatever role has that oid there, which then
# replays another role's stored answers (and could complete or fail its
# keys in progress).  A role dropped on the publisher leaves its rows,
# which travel as its bare oid even as text.  Each key must stay with its
# role, as a dump and restore keeps it (002_dump.pl): the row of a role
# that does not exist on the subscriber belongs to nobody there.
#
# Fails on 0.6.0 as of this commit; a roleref owner column (no binary I/O,
# as on Citus) would carry the name.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pub = PostgreSQL::Test::Cluster->new('publisher');
$pub->init(allows_streaming => 'logical');
$pub->append_conf('postgresql.conf', q{shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0});
$pub->start;
my $sub = PostgreSQL::Test::Cluster->new('subscriber');
$sub->init;
$sub->append_conf('postgresql.conf', q{shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0});
$sub->start;

$pub->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE ROLE filler_1; CREATE ROLE filler_2; CREATE ROLE filler_3;
	CREATE ROLE payer;
	SET ROLE payer;
	BEGIN;
	SELECT outcome FROM idempotency.begin('paid-1');
	SELECT idempotency.complete('paid-1', '"payer: card 4242, charged"');
	COMMIT;
	RESET ROLE;
	CREATE ROLE gone;
	SET ROLE gone;
	BEGIN;
	SELECT outcome FROM idempotency.begin('gone-1');
	SELECT idempotency.complete('gone-1', '"gone: card 5555"');
	COMMIT;
	RESET ROLE;
	DROP ROLE gone;
	CREATE PUBLICATION keys FOR TABLE idempotency.idempotency_key;
});
my $payer_oid = $pub->safe_psql('postgres', q{SELECT oid FROM pg_roles WHERE rolname = 'payer'});
my $gone_oid = $pub->safe_psql('postgres', q{SELECT owner::oid FROM idempotency.idempotency_key WHERE key = 'gone-1'});

# on the subscriber: payer (another oid) and an unrelated role that has
# the publisher's oid of payer
$sub->safe_psql('postgres', qq{
	CREATE EXTENSION idempotency;
	CREATE ROLE payer;
	DO \$\$
	DECLARE o oid;
	BEGIN
		LOOP
			CREATE ROLE bystander;
			SELECT oid INTO o FROM pg_roles WHERE rolname = 'bystander';
			EXIT WHEN o >= $payer_oid;
			DROP ROLE bystander;
		END LOOP;
		IF o <> $payer_oid THEN
			RAISE EXCEPTION 'bystander got oid %, not $payer_oid', o;
		END IF;
	END \$\$});
# and another with the oid of a role dropped on the publisher, whose row
# stays there (DROP ROLE does not see it): even as text, a regrole prints
# it as a bare oid, read there as this role's
$sub->safe_psql('postgres', qq{DO \$\$
	DECLARE o oid;
	BEGIN
		LOOP
			CREATE ROLE heir;
			SELECT oid INTO o FROM pg_roles WHERE rolname = 'heir';
			EXIT WHEN o >= $gone_oid;
			DROP ROLE heir;
		END LOOP;
		IF o <> $gone_oid THEN
			RAISE EXCEPTION 'heir got oid %, not $gone_oid', o;
		END IF;
	END \$\$});
isnt($sub->safe_psql('postgres', q{SELECT oid FROM pg_roles WHERE rolname = 'payer'}), $payer_oid,
	'payer has another oid on the subscriber');
is($sub->safe_psql('postgres', q{SELECT oid FROM pg_roles WHERE rolname = 'bystander'}), $payer_oid,
	'an unrelated role, bystander, has the publisher\'s oid of payer there');

(my $connstr = $pub->connstr('postgres')) =~ s/'/''/g;
$sub->safe_psql('postgres', qq{CREATE SUBSCRIPTION keys CONNECTION '$connstr' PUBLICATION keys WITH (binary = true)});
$sub->poll_query_until('postgres', q{SELECT count(*) = 2 FROM idempotency.idempotency_key WHERE key IN ('paid-1', 'gone-1')})
  or die 'the initial copy did not arrive';

# a key completed after the initial copy: streamed (binary = true sends a
# regrole as its oid)
$pub->safe_psql('postgres', q{
	SET ROLE payer;
	BEGIN;
	SELECT outcome FROM idempotency.begin('paid-2');
	SELECT idempotency.complete('paid-2', '"payer: card 4242, charged again"');
	COMMIT;
});
$sub->poll_query_until('postgres', q{SELECT count(*) = 1 FROM idempotency.idempotency_key WHERE key = 'paid-2'})
  or die 'the streamed row did not arrive';

is( $sub->safe_psql('postgres', q{SET ROLE bystander; SELECT count(*) FROM idempotency.idempotency_key}),
	'0', 'bystander (payer\'s publisher oid) sees none of payer\'s replicated keys');
is( $sub->safe_psql('postgres', q{SET ROLE bystander;
		SELECT outcome || ' ' || coalesce(response::text, 'no response') FROM idempotency.begin('paid-2', lease => '1 minute')}),
	'new no response', 'bystander\'s begin() of payer\'s streamed key is new: no stored answer of payer\'s replayed');
is( $sub->safe_psql('postgres', q{SET ROLE payer;
		SELECT string_agg(key || ' ' || response::text, ', ' ORDER BY key) FROM idempotency.idempotency_key}),
	'paid-1 "payer: card 4242, charged", paid-2 "payer: card 4242, charged again"',
	'payer owns both of its keys on the subscriber');

is( $sub->safe_psql('postgres', q{SET ROLE heir; SELECT count(*) FROM idempotency.idempotency_key}),
	'0', 'heir (the dropped role\'s publisher oid) sees none of the dropped role\'s keys');

$sub->safe_psql('postgres', q{DROP SUBSCRIPTION keys});
$sub->stop;
$pub->stop;
done_testing();
