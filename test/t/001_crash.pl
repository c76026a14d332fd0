# Crash and restart: a key and its business effect commit or vanish together.
# A transaction in flight when the server crashes leaves neither its key nor
# its effect, and its key lock is gone, so the retry after restart is new;
# a committed key survives and replays.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('crash');
$node->init;
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE TABLE payment (key text PRIMARY KEY, amount int);
	CREATE FUNCTION pay(k text, amount int) RETURNS text LANGUAGE plpgsql AS $$
	DECLARE b record;
	BEGIN
	  SELECT * INTO b FROM idempotency.begin(k, jsonb_build_object('amount', amount));
	  IF b.outcome <> 'replay' THEN
	    INSERT INTO payment VALUES (k, amount);
	    PERFORM idempotency.complete(k, jsonb_build_object('paid', k));
	  END IF;
	  RETURN b.outcome || ' ' || coalesce(b.response::text, '');
	END $$;
});

is($node->safe_psql('postgres', q{SELECT pay('committed', 10)}),
	'new ', 'first request before the crash is new');

# in flight at the crash: work done and complete() called, not committed
my $inflight = $node->background_psql('postgres');
$inflight->query_safe(q{BEGIN; SELECT pay('inflight', 5)});
# begun only: holds the key lock
my $holder = $node->background_psql('postgres');
$holder->query_safe(q{BEGIN; SELECT outcome FROM idempotency.begin('held')});
is( $node->safe_psql('postgres', q{SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 18756}),
	'2', 'two key locks held before the crash');

$node->stop('immediate');
eval { $inflight->quit };
eval { $holder->quit };
$node->start;

is($node->safe_psql('postgres', q{SELECT pay('committed', 10)}),
	'replay {"paid": "committed"}', 'committed key replays after the crash');
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'inflight'}),
	'0', 'in-flight key is gone after the crash');
is($node->safe_psql('postgres', q{SELECT count(*) FROM payment WHERE key = 'inflight'}),
	'0', 'in-flight business effect is gone with it');
is( $node->safe_psql('postgres', q{SET idempotency.lock_wait = 0; SELECT pay('held', 1)}),
	'new ', 'a key held at the crash is free again (no wait, new)');
is($node->safe_psql('postgres', q{SELECT pay('inflight', 5)}),
	'new ', 'the retried in-flight request is new');
is($node->safe_psql('postgres', q{SELECT pay('inflight', 5)}),
	'replay {"paid": "inflight"}', 'and its duplicate replays');
is($node->safe_psql('postgres', q{SELECT count(*) FROM payment}),
	'3', 'one payment per key');

$node->stop;
done_testing();
