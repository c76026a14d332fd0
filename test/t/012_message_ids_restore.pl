# Message ids after a restore that rewinds the outbox's sequence:
# a base backup restored without the WAL written after it gives
# the row ids it gave before (the sequence went back), but publish() draws
# new message ids, so a receiver deduplicating by Idempotency-Key never
# mistakes a new message for one it already handled.  0.5.0 derived the id
# from the row id and the database's secret: the same ids again.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->start;
$primary->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	SELECT idempotency.create_topic('refunds');
});
$primary->backup('before');

my $publish = q{
	SELECT count(*) FROM (SELECT idempotency.publish('refunds', jsonb_build_object('n', n))
	                        FROM generate_series(1, 5) AS n) AS p;
	SELECT string_agg(m.id || ' ' || m.message_id, ',' ORDER BY m.id)
	  FROM idempotency.outbox_message AS m};
sub published { my @l = split /\n/, shift; return split /,/, $l[-1]; }
my @first = published($primary->safe_psql('postgres', $publish));
is(scalar @first, 5, 'five messages published after the backup');
$primary->stop;

my $restored = PostgreSQL::Test::Cluster->new('restored');
$restored->init_from_backup($primary, 'before');
$restored->start;
my @second = published($restored->safe_psql('postgres', $publish));
is(scalar @second, 5, 'five messages published on the restored copy');

my @rows1 = map { (split / /)[0] } @first;
my @rows2 = map { (split / /)[0] } @second;
is("@rows2", "@rows1", 'the restore rewound the sequence: the same row ids again');
my %seen = map { (split / /)[1] => 1 } @first;
my @again = grep { $seen{(split / /)[1]} } @second;
is(scalar @again, 0, 'no message id of the lost timeline is issued again');

$restored->stop;
done_testing();
