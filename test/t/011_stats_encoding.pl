# idempotency.stats in a cluster whose databases have different encodings:
# the shared table is read from every database, so an
# entry keeps the encoding its scope was written in and the scope is
# converted to the reading database's encoding (as pg_stat_statements does
# with its query texts).  A scope the reader's encoding cannot hold is cut
# before the first character it cannot convert, with "...".  The encoding
# survives a clean restart (the stats file).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('stats_encoding');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0
});
$node->start;
for my $db (['utf8db', 'UTF8'], ['latin1db', 'LATIN1'], ['asciidb', 'SQL_ASCII'])
{
	$node->safe_psql('postgres',
		"CREATE DATABASE $db->[0] ENCODING '$db->[1]' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
	$node->safe_psql($db->[0], 'CREATE EXTENSION idempotency');
}
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency; SELECT idempotency.stats_reset()');

# a key in scope $hex (UTF-8 bytes, converted by the server to the database's
# encoding)
sub count_key
{
	my ($db, $hex) = @_;
	$node->safe_psql($db, qq{
		SELECT outcome FROM idempotency.begin('k',
			scope => pg_catalog.convert_from('\\x$hex'::bytea, 'UTF8'), lease => '1 hour')});
}
count_key('latin1db', '636166c3a9');      # café
count_key('utf8db', '6e61c3af7665');      # naïve
count_key('utf8db', '707269636520e282ac'); # price € (no € in LATIN1)
# SQL_ASCII takes any bytes and converts to nothing: a reader keeps what is
# valid in its own encoding
$node->safe_psql('asciidb', q{
	SELECT outcome FROM idempotency.begin('k',
		scope => pg_catalog.convert_from('\x6e6fe9', 'SQL_ASCII'), lease => '1 hour')});

# the bytes of each scope as a database reads it
sub scopes
{
	my ($db) = @_;
	return $node->safe_psql($db, q{
		SELECT string_agg(d.datname || ' ' || encode(textsend(s.scope), 'hex'), ',' ORDER BY d.datname, s.scope)
		  FROM idempotency.stats AS s JOIN pg_database AS d ON d.oid = s.dbid
		 WHERE d.datname IN ('utf8db', 'latin1db', 'asciidb')});
}

sub check_scopes
{
	my ($when) = @_;
	is(scopes('utf8db'), 'asciidb 6e6f2e2e2e,latin1db 636166c3a9,utf8db 6e61c3af7665,utf8db 707269636520e282ac',
		"$when: a UTF8 database reads the LATIN1 database's scope in UTF-8, the SQL_ASCII one's up to its invalid byte");
	is(scopes('latin1db'), 'asciidb 6e6fe9,latin1db 636166e9,utf8db 6e61ef7665,utf8db 7072696365202e2e2e',
		"$when: a LATIN1 database reads the UTF8 database's scopes in LATIN1, one cut before the character LATIN1 lacks");
	is(scopes('asciidb'), 'asciidb 6e6fe9,latin1db 636166e9,utf8db 6e61c3af7665,utf8db 707269636520e282ac',
		"$when: a SQL_ASCII database reads every scope's bytes as they are");
}
check_scopes('before a restart');

$node->restart;
check_scopes('after a clean restart');

$node->stop;
done_testing();
