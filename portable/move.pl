#!/usr/bin/perl
# portable/move.pl — the restore list that moves a database between the
# editions of idempotency (the C extension and the portable edition, by
# psql -f or through pg_tle), in either direction.
#
#   pg_restore -l app.dump | perl move.pl > app.list
#   pg_restore --no-owner -L app.list -d TARGET app.dump
#
# The target database has the edition it is to run installed already
# (CREATE EXTENSION idempotency, psql -f idempotency--X.Y.Z.sql, or
# pgtle.install_extension and CREATE EXTENSION).  The list keeps everything
# of the application and, of idempotency, only the rows of the tables the C
# edition dumps (its pg_extension_config_dump() calls: @dumped below) and
# its sequences' positions: the keys, tokens, seen messages, state
# machines, the outbox and the derive secret (the restored secret is older
# than the one the install made, and the oldest is the one derive_key()
# uses, so derived keys stay the same).  It leaves out what the installed
# edition has already made: the extension or the schema, every object in
# it, the rows of the tables that are one edition's own or not state
# (lock_secret, which each install makes anew; the portable edition's
# outbox_key_lock, filled again on demand; the Citus route tables), the
# pg_tle functions that hold a pg_tle install's script, and pg_tle itself
# (the service's admin makes it).
#
#   perl move.pl --tables    prints @dumped, one a line
#
# Reads pg_restore -l's list: "ID; CATALOG OID DESC NAMESPACE TAG OWNER",
# comment lines start with ";".
use strict;
use warnings;

# the tables and sequences whose rows move (test/t/045_edition_moves.pl
# checks this is the C edition's pg_extension.extconfig), in the order
# they are restored: a topic before its grants and messages (foreign
# keys).  pg_restore -L restores in the list's order; pg_dump orders the
# rows of an extension's tables by their foreign keys, but those of a plain
# install by name (outbox_grant before outbox_topic), so they are written
# here in this order, where the first of them was.
my @dumped = qw(derive_secret idempotency_key outbox_topic outbox_topic_id_seq
  outbox_grant outbox_message outbox_message_id_seq seen_message
  state_machine token);
if (@ARGV && $ARGV[0] eq '--tables')
{
	print "$_\n" for @dumped;
	exit 0;
}
my %rank = map { $dumped[$_] => $_ } 0 .. $#dumped;
my $moved = join('|', map { quotemeta } @dumped);

my $tag = qr/^\d+; \d+ \d+ /;
my @lines = <STDIN>;
# the rows that move, in @dumped's order
my @rows = sort { $a->[0] <=> $b->[0] }
  map { /${tag}(?:TABLE DATA|SEQUENCE SET) idempotency ($moved) / ? [ $rank{$1}, $_ ] : () } @lines;
for my $line (@lines)
{
	if ($line =~ /^;/ || $line !~ $tag)
	{
		print $line;
		next;
	}
	if ($line =~ /${tag}(?:TABLE DATA|SEQUENCE SET) idempotency (?:$moved) /)
	{
		print map { $_->[1] } @rows;
		@rows = ();
		next;
	}
	next if $line =~ /${tag}[A-Z ]+? idempotency /;    # an object in the schema
	next if $line =~ /${tag}[A-Z ]+ - (?:[A-Z]+ )?idempotency /;    # the schema, the extension
	next if $line =~ /${tag}FUNCTION pgtle idempotency[-.]/;    # pg_tle's copy of the script
	next if $line =~ /${tag}[A-Z ]+ - (?:[A-Z]+ )?(?:pg_tle|pgtle) /;    # pg_tle, its schema
	next if $line =~ /${tag}TABLE DATA pgtle /;
	print $line;
}
