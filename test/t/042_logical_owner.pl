# Logical replication of the key table to another cluster (a blue/green
# switch, a major upgrade by replication).  Roles have other oids on the
# subscriber.  The owner column is an idempotency.roleref, which has no
# binary send/receive functions: a subscription with binary = true carries
# it by name (a regrole went as the publisher's oid, which the subscriber
# read as whatever role had that oid there, which then replayed another
# role's stored answers).  A role dropped on the publisher leaves its rows,
# which travel as "-", nobody (a regrole went as its bare oid even as
# text).  Each key stays with its role, as a dump and restore keeps it
# (002_dump.pl): the row of a role that does not exist on the subscriber
# belongs to nobody there.
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
if ($sub->pg_version >= 16)
{
	# PostgreSQL 16 and later copy the initial rows in binary too, which
	# a roleref refuses: the copy fails, clearly, and nothing arrives;
	# the initial copy goes as text, the streamed changes in binary
	my $log = -s $sub->logfile;
	$sub->safe_psql('postgres', qq{CREATE SUBSCRIPTION refused CONNECTION '$connstr' PUBLICATION keys
		WITH (binary = true, slot_name = refused)});
	# (the subscriber refuses it itself, "no binary input function", before
	# the publisher's COPY would say "no binary output function")
	$sub->wait_for_log(qr/no binary (?:input|output) function available for type idempotency\.roleref/, $log);
	is($sub->safe_psql('postgres', q{SELECT count(*) FROM idempotency.idempotency_key}), '0',
		'16 and later: a binary initial copy is refused, nothing copied');
	$sub->safe_psql('postgres', q{ALTER SUBSCRIPTION refused DISABLE;
		ALTER SUBSCRIPTION refused SET (slot_name = NONE); DROP SUBSCRIPTION refused});
	$pub->safe_psql('postgres', q{SELECT pg_drop_replication_slot('refused')});
	$sub->safe_psql('postgres', qq{CREATE SUBSCRIPTION keys CONNECTION '$connstr' PUBLICATION keys WITH (binary = false)});
	$sub->poll_query_until('postgres', q{SELECT count(*) = 2 FROM idempotency.idempotency_key WHERE key IN ('paid-1', 'gone-1')})
	  or die 'the initial copy did not arrive';
	$sub->safe_psql('postgres', q{ALTER SUBSCRIPTION keys SET (binary = true)});
}
else
{
	$sub->safe_psql('postgres', qq{CREATE SUBSCRIPTION keys CONNECTION '$connstr' PUBLICATION keys WITH (binary = true)});
	$sub->poll_query_until('postgres', q{SELECT count(*) = 2 FROM idempotency.idempotency_key WHERE key IN ('paid-1', 'gone-1')})
	  or die 'the initial copy did not arrive';
}

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
