# State in shared memory of a database dropped where no backend's hook sees
# the drop: a hot standby replays DROP DATABASE from the WAL, so the
# statistics its sessions counted for that database stay in its shared
# memory.  When it is promoted, the purge launcher starts and frees the
# entries of every database that no longer exists, and only those.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('owners_primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0
});
$primary->start;
$primary->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	BEGIN;
	SELECT outcome FROM idempotency.begin('k', '{}', 'scope');
	SELECT idempotency.complete('k', '{}', 'scope');
	COMMIT;
});
$primary->safe_psql('postgres', 'CREATE DATABASE s');
$primary->safe_psql('s', q{
	CREATE EXTENSION idempotency;
	BEGIN;
	SELECT outcome FROM idempotency.begin('k', '{}', 'scope');
	SELECT idempotency.complete('k', '{}', 'scope');
	COMMIT;
});
my $oid = $primary->safe_psql('postgres', q{SELECT oid FROM pg_database WHERE datname = 's'});
$primary->backup('base');

my $standby = PostgreSQL::Test::Cluster->new('owners_standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;

# a replay on the standby: a statistics entry of s in its shared memory
is($standby->safe_psql('s', q{SELECT outcome FROM idempotency.begin('k', '{}', 'scope')}),
	'replay', 'a replay of s on the standby');
is($standby->safe_psql('postgres', "SELECT count(*) FROM idempotency.stats() WHERE dbid = $oid"),
	'1', 'the standby counted it for s');
is($standby->safe_psql('postgres', q{SELECT outcome FROM idempotency.begin('k', '{}', 'scope')}),
	'replay', 'and one of postgres');

$primary->safe_psql('postgres', 'DROP DATABASE s');
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', "SELECT count(*) FROM pg_database WHERE oid = $oid"),
	'0', 'the standby replayed DROP DATABASE s');

$standby->promote;
ok($standby->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM idempotency.stats() WHERE dbid = $oid"),
	'promoted, the launcher frees the statistics of the dropped database');
is($standby->safe_psql('postgres', q{SELECT begin_replay FROM idempotency.stats
		WHERE database = 'postgres' AND scope = 'scope'}),
	'1', 'and keeps those of a database that exists');

$standby->stop;
$primary->stop;
done_testing();
