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
# of the application and, of idempotency, only the rows of its tables and
# its sequences' positions: the keys, tokens, seen messages, the outbox and
# the derive secret (the restored secret is older than the one the install
# made, and the oldest is the one derive_key() uses, so derived keys stay
# the same).  It leaves out what the installed edition has already made:
# the extension or the schema, every object in it, the pg_tle functions
# that hold a pg_tle install's script, pg_tle itself (the service's admin
# makes it), and the rows of lock_secret (a plain install dumps them; the
# install made its own).
#
# Reads pg_restore -l's list: "ID; CATALOG OID DESC NAMESPACE TAG OWNER",
# comment lines start with ";".
use strict;
use warnings;

my $tag = qr/^\d+; \d+ \d+ /;
while (my $line = <STDIN>)
{
	if ($line =~ /^;/ || $line !~ $tag)
	{
		print $line;
		next;
	}
	# the rows of idempotency's tables and its sequences' positions stay
	if ($line =~ /${tag}(?:TABLE DATA|SEQUENCE SET) idempotency (?!lock_secret )/)
	{
		print $line;
		next;
	}
	next if $line =~ /${tag}[A-Z ]+? idempotency /;    # an object in the schema
	next if $line =~ /${tag}[A-Z ]+ - (?:[A-Z]+ )?idempotency /;    # the schema, the extension
	next if $line =~ /${tag}FUNCTION pgtle idempotency[-.]/;    # pg_tle's copy of the script
	next if $line =~ /${tag}[A-Z ]+ - (?:[A-Z]+ )?(?:pg_tle|pgtle) /;    # pg_tle, its schema
	next if $line =~ /${tag}TABLE DATA pgtle /;
	print $line;
}
