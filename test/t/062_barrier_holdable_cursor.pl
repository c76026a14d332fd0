# The acked counts' barriers (src/outbox_counts.c): cursors whose rows outlive the
# snapshot's transaction.  A cursor WITH HOLD is read to its end at COMMIT
# with the snapshot of its DECLARE; barriers that start meanwhile must wait
# for it.  A procedure looping over outbox_stats with COMMIT inside the
# loop (its query is held at the first COMMIT) must read one snapshot.
# A transaction stays open in another database all along.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('barrier_holdable');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.outbox_count_deltas = 16
idempotency.purge_interval = 0
});
$node->start;
$node->safe_psql('postgres', q{CREATE DATABASE elsewhere});
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('busy');
	SELECT count(idempotency.publish('busy', '{}')) FROM generate_series(1, 200);
	CREATE TABLE seen (i int, delivered int8);
	CREATE PROCEDURE loop_stats() LANGUAGE plpgsql AS $$
	DECLARE r record;
	BEGIN
	  FOR r IN SELECT g, s.delivered FROM idempotency.outbox_stats AS s, generate_series(1, 3) AS g
	            WHERE s.topic = 'busy' ORDER BY g LOOP
	    INSERT INTO seen VALUES (r.g, r.delivered);
	    COMMIT;
	    PERFORM pg_sleep(1);
	  END LOOP;
	END $$;
});
my $open = $node->background_psql('elsewhere', on_error_stop => 1);
$open->query_safe(q{BEGIN; SELECT pg_catalog.txid_current()});

my $ack = q{SELECT idempotency.ack(c.claim, ARRAY[c.id]) FROM idempotency.claim('busy', 1) AS c};
sub acks { $node->safe_psql('postgres', $ack) for 1 .. $_[0]; }
my $read = q{SELECT s.delivered FROM idempotency.outbox_stats AS s, generate_series(1, 2) WHERE s.topic = 'busy'};

acks(3);
my $c = $node->background_psql('postgres', on_error_stop => 1);
$c->query_safe(qq{BEGIN; DECLARE cur CURSOR WITH HOLD FOR $read});
acks(20);
is($c->query_safe(q{FETCH 1 FROM cur}), '3', 'the held cursor reads as of its DECLARE');
acks(20);
$c->query_safe(q{COMMIT});
acks(20);
is($c->query_safe(q{FETCH 1 FROM cur}), '3', 'and so does its row materialized at COMMIT');
$c->query_safe(q{CLOSE cur});

# a procedure committing inside a loop over outbox_stats
my $p = $node->background_psql('postgres', on_error_stop => 1);
$p->query_until(qr/calling/, "\\echo calling\nCALL loop_stats();\n\\echo called\n");
$node->poll_query_until('postgres', q{SELECT count(*) > 0 FROM seen});
acks(30);
$p->query_until(qr/called/, '');
is($node->safe_psql('postgres', q{SELECT string_agg(delivered::text, ',' ORDER BY i) FROM seen}),
	'63,63,63', 'the procedure reads one snapshot through its COMMITs');
is($node->safe_psql('postgres', q{SELECT delivered FROM idempotency.outbox_stats}), '93', 'all counted');

$_->quit for ($c, $p, $open);
$node->stop;
done_testing();
