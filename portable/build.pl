#!/usr/bin/perl
# portable/build.pl — generate the portable edition's install script from the
# C edition's (one source of truth for the shared text).
#
#   perl portable/build.pl [--check] C-INSTALL-SCRIPT PORTABLE-SRC-DIR > OUT.sql
#
# The C edition's install script (idempotency--X.Y.Z.sql at the top of the
# repository) is read statement by statement.  Tables, indexes, types,
# views, policies, grants and comments pass through unchanged.  Each C
# function (AS 'MODULE_PATHNAME', 'symbol' LANGUAGE C) keeps its CREATE
# FUNCTION head (name, arguments, defaults, result, volatility, PARALLEL,
# STRICT) and gets its body from the portable sources instead: a block
#
#   -- @body symbol
#   LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
#   AS $fn$ ... $fn$
#   -- @end
#
# in portable/src/*.sql replaces "AS 'MODULE_PATHNAME', 'symbol' LANGUAGE C".
# A C function without a portable body is left out, with every statement
# that names it (its COMMENT, GRANT, REVOKE, a view or trigger over it);
# the list of what was left out is written at the head of the output and to
# stderr, so the script says what it does not have yet.  Statements that
# belong to the C edition only are matched by the rules in @c_only below;
# each rule must match at least one statement (so a rule that stopped
# matching after an edit of the C script is noticed: the build fails).
# pg_extension_config_dump() runs only under CREATE EXTENSION (pg_tle); a
# plain psql -f install has no extension to mark.
#
# Statements in @rewrite below are passed through with a part replaced
# (each must match, or the build fails).
#
# Blocks "-- @head" and "-- @tail" of the portable sources are emitted
# before and after the shared statements (schema creation and checks, and
# a table a rewritten statement reads; the portable edition's internal
# functions and triggers).
#
# --check: exit 1 when a portable body names a symbol the C script does not
# have (a renamed C function), instead of only warning.
#
# Upgrade scripts, for installs by psql -f (and, the same file, for
# pgtle.install_update_path):
#
#   perl portable/build.pl --upgrade C-UPGRADE-SCRIPT C-INSTALL-SCRIPT PORTABLE-SRC-DIR > OUT.sql
#
# reads the C edition's idempotency--A--B.sql the same way (each C function
# its portable body, statements naming a function the portable edition
# does not have left out; which functions it has is decided from B's
# install script, the second argument), and wraps it: first a check that a
# plain install records version A in the schema's comment ("idempotency A
# (portable edition)", which the install wrote) and an error 55000 naming
# the version it found otherwise, so the script cannot run on a database of
# another version or without the portable edition; then the C edition's
# statements; then portable/src/upgrade/idempotency--A--B.sql, the portable
# edition's own changes between A and B (its internal functions and
# triggers), if that file exists; last the comment set to B.  Under ALTER
# EXTENSION ... UPDATE (pg_tle) the extension's version is the record and
# PostgreSQL picks the script by it, so neither the check nor the comment
# applies there.  The C-only rules need not match in an upgrade script.
use strict;
use warnings;

my $check = 0;
my $upgrade;
if (@ARGV && $ARGV[0] eq '--check') { $check = 1; shift @ARGV; }
if (@ARGV && $ARGV[0] eq '--upgrade') { shift @ARGV; $upgrade = shift @ARGV; }
die "usage: $0 [--check] C-INSTALL-SCRIPT PORTABLE-SRC-DIR\n"
  . "       $0 --upgrade C-UPGRADE-SCRIPT C-INSTALL-SCRIPT PORTABLE-SRC-DIR\n" unless @ARGV == 2;
my ($cscript, $srcdir) = @ARGV;

# ---------------------------------------------------------------------
# Statements of the C edition only, each with the reason
# ---------------------------------------------------------------------
my @c_only = (
	# the schema check of the C edition wants a superuser-owned schema; the
	# portable one is installed by the database owner (src/head.sql checks)
	[qr/schema idempotency is not safe for the extension/, 'C: refuses a schema not owned by a superuser; the portable head checks its own'],
	# the Citus set-up step: no Citus path in the portable edition
	[qr/idempotency\.distribute\(\)/, 'C: Citus set-up (no Citus path in the portable edition)'],
	# idempotency.roleref is a base type (C output function; CREATE TYPE of
	# a base type needs a superuser): Citus, and the ALTERs that make the
	# owner and grantee columns roleref
	[qr/idempotency\.roleref\b/, 'C: base type idempotency.roleref (needs a superuser and C); the owner columns stay regrole'],
	# GRANT SET ON PARAMETER needs a superuser (or the grant option), which a
	# managed service's admin role does not have; without the library the
	# settings stay placeholders that any role may SET in its session
	[qr/^GRANT\s+SET\s+ON\s+PARAMETER\b/i, 'C: GRANT SET ON PARAMETER (needs a superuser)'],
);

# ---------------------------------------------------------------------
# Shared statements the portable edition runs with a part replaced, each
# with the reason: [statement, text in it, replacement, reason].  Each
# must match in the install script (the build fails when an edit of the C
# script leaves one without its text).
# ---------------------------------------------------------------------
my @rewrite = (
	# outbox_stats adds the acked counts the C edition keeps in shared
	# memory (_outbox_counts()); the portable ack() writes them into
	# idempotency.outbox_acked (portable/src/outbox.sql), read here in the
	# view's own snapshot: a VOLATILE function called by the view would
	# read them in a newer one under READ COMMITTED, and count an ack or a
	# purge that commits meanwhile twice or not at all
	[qr/^CREATE\s+(?:OR\s+REPLACE\s+)?VIEW\s+idempotency\.outbox_stats\b/,
	 'CROSS JOIN LATERAL idempotency._outbox_counts(t.id) AS c',
	 "CROSS JOIN LATERAL (SELECT COALESCE(pg_catalog.sum(a.delivered), 0)::pg_catalog.int8 AS delivered,\n"
	 . "                                COALESCE(pg_catalog.sum(a.retried), 0)::pg_catalog.int8 AS retried\n"
	 . "                           FROM idempotency.outbox_acked AS a\n"
	 . "                          WHERE a.topic_id OPERATOR(pg_catalog.=) t.id) AS c",
	 'portable: outbox_stats reads the acked counts from idempotency.outbox_acked in its own snapshot'],
);

# ---------------------------------------------------------------------
# Split SQL into statements (quotes, dollar quotes, comments respected)
# ---------------------------------------------------------------------
sub split_sql {
	my ($text) = @_;
	my @stmts;
	my $cur = '';
	my $i = 0;
	my $n = length $text;
	while ($i < $n) {
		my $c = substr($text, $i, 1);
		my $rest = substr($text, $i, 2);
		if ($rest eq '--') {
			my $e = index($text, "\n", $i);
			$e = $n - 1 if $e < 0;
			$cur .= substr($text, $i, $e - $i + 1);
			$i = $e + 1;
		} elsif ($rest eq '/*') {
			my $e = index($text, '*/', $i + 2);
			die "unterminated comment\n" if $e < 0;
			$cur .= substr($text, $i, $e + 2 - $i);
			$i = $e + 2;
		} elsif ($c eq "'" || $c eq '"') {
			my $j = $i + 1;
			while (1) {
				my $e = index($text, $c, $j);
				die "unterminated quote\n" if $e < 0;
				if (substr($text, $e + 1, 1) eq $c) { $j = $e + 2; next; }
				$cur .= substr($text, $i, $e + 1 - $i);
				$i = $e + 1;
				last;
			}
		} elsif ($c eq '$' && substr($text, $i) =~ /^(\$[A-Za-z_]*\$)/) {
			my $tag = $1;
			my $e = index($text, $tag, $i + length $tag);
			die "unterminated dollar quote $tag\n" if $e < 0;
			$cur .= substr($text, $i, $e + length($tag) - $i);
			$i = $e + length $tag;
		} elsif ($c eq ';') {
			$cur .= ';';
			push @stmts, $cur;
			$cur = '';
			$i++;
		} else {
			$cur .= $c;
			$i++;
		}
	}
	push @stmts, $cur if $cur =~ /\S/;
	return @stmts;
}

# the statement without its leading comments and blank lines
sub code_of {
	my ($s) = @_;
	my $t = $s;
	1 while $t =~ s/\A\s*--[^\n]*\n//;
	$t =~ s/\A\s+//;
	return $t;
}

# a function signature as "name(type,type)" with argument names, modes,
# defaults and the pg_catalog qualification removed, lower case
sub norm_sig {
	my ($name, $args) = @_;
	my @types;
	# split on top-level commas
	my $depth = 0;
	my $cur = '';
	for my $ch (split //, $args) {
		if ($ch eq '(') { $depth++; }
		elsif ($ch eq ')') { $depth--; }
		if ($ch eq ',' && $depth == 0) { push @types, $cur; $cur = ''; next; }
		$cur .= $ch;
	}
	push @types, $cur if $cur =~ /\S/;
	my @out;
	for my $t (@types) {
		$t =~ s/\bDEFAULT\b.*//si;
		$t =~ s/^\s+|\s+$//g;
		next if $t =~ /^OUT\s/i;
		$t =~ s/^(IN|INOUT|VARIADIC)\s+//i;
		$t =~ s/^VARIADIC\s+//i;
		# "name type" -> type (a lone type stays)
		if ($t =~ /^("[^"]*"|[a-z_][a-z0-9_]*)\s+(.+)$/i && $1 !~ /^pg_catalog\./i) {
			my ($first, $second) = ($1, $2);
			$t = $second unless $first =~ /^(double|character|bit|time|timestamp)$/i;
		}
		$t =~ s/pg_catalog\.//gi;
		$t =~ s/\s+/ /g;
		push @out, lc $t;
	}
	return lc($name) . '(' . join(',', @out) . ')';
}

# ---------------------------------------------------------------------
# The portable sources
# ---------------------------------------------------------------------
my (%body, %body_used, @head, @tail);
opendir(my $dh, $srcdir) or die "$srcdir: $!\n";
for my $f (sort grep { /\.sql$/ } readdir $dh) {
	open(my $fh, '<', "$srcdir/$f") or die "$srcdir/$f: $!\n";
	my ($kind, $sym, $buf) = (undef, undef, '');
	while (my $line = <$fh>) {
		if ($line =~ /^-- \@(body|head|tail)\b\s*(\S*)/) {
			die "$f: nested block at line $.\n" if defined $kind;
			($kind, $sym, $buf) = ($1, $2, '');
			next;
		}
		if ($line =~ /^-- \@end\b/) {
			die "$f: \@end without a block at line $.\n" unless defined $kind;
			if ($kind eq 'body') {
				die "$f: second body of $sym\n" if exists $body{$sym};
				$buf =~ s/\s+\z//;
				$body{$sym} = $buf;
			} elsif ($kind eq 'head') {
				push @head, "-- from portable/src/$f\n$buf";
			} else {
				push @tail, "-- from portable/src/$f\n$buf";
			}
			$kind = undef;
			next;
		}
		$buf .= $line if defined $kind;
	}
	die "$f: block not ended\n" if defined $kind;
	close $fh;
}
closedir $dh;

# ---------------------------------------------------------------------
# Read the C edition's script
# ---------------------------------------------------------------------
open(my $cf, '<', $cscript) or die "$cscript: $!\n";
my $ctext = do { local $/; <$cf> };
close $cf;
my ($version) = $cscript =~ /idempotency--([0-9.]+)\.sql$/
	or die "$cscript: no version in the file name\n";
s/\@VERSION\@/$version/g for @head, @tail, values %body;
# psql's guard against running an extension script by hand: the portable
# script is meant to be run by psql
$ctext =~ s/^\\echo .*\\quit\s*$//m;
my @stmts = split_sql($ctext);

# an upgrade script: its statements are the ones written out; the install
# script of its target version says which functions the edition has
my ($from, $upgrade_text);
if (defined $upgrade) {
	($from, my $to) = $upgrade =~ /idempotency--([0-9.]+)--([0-9.]+)\.sql$/
	  or die "$upgrade: no versions in the file name (idempotency--A--B.sql)\n";
	die "$upgrade upgrades to $to, but $cscript is the install script of $version\n" unless $to eq $version;
	open(my $uf, '<', $upgrade) or die "$upgrade: $!\n";
	$upgrade_text = do { local $/; <$uf> };
	close $uf;
	$upgrade_text =~ s/^\\echo .*\\quit\s*$//m;
}

# pass 1: which C functions have no portable body
my (%missing_sig, %missing_name_all, %have_name, @missing_list);
for my $s (@stmts) {
	my $code = code_of($s);
	next unless $code =~ /^CREATE\s+FUNCTION\s+(idempotency\.\w+)\s*\((.*?)\)\s*(RETURNS|$)/si;
	my ($name, $args) = ($1, $2);
	# args may hold parentheses (OUT ... in stats()): take up to the
	# matching parenthesis
	if ($code =~ /^CREATE\s+FUNCTION\s+idempotency\.\w+\s*(\((?:[^()]++|(?1))*\))/si) {
		$args = substr($1, 1, -1);
	}
	my $sig = norm_sig($name, $args);
	if ($code =~ /AS\s+'MODULE_PATHNAME',\s*'(\w+)'\s+LANGUAGE\s+C\b/si) {
		my $sym = $1;
		if (exists $body{$sym}) {
			$have_name{lc $name} = 1;
		} else {
			$missing_sig{$sig} = $sym;
			$missing_name_all{lc $name} //= 1;
			push @missing_list, "$sig ($sym)";
		}
	} else {
		$have_name{lc $name} = 1;
	}
}
# a name is wholly missing when no overload of it is kept
for my $n (keys %missing_name_all) {
	delete $missing_name_all{$n} if $have_name{$n};
}

@stmts = split_sql($upgrade_text) if defined $upgrade;
my (@out, @left_out, %rule_hits, %dropped_rel);
for my $s (@stmts) {
	my $code = code_of($s);
	next unless $code =~ /\S/;

	# C-only statements
	my $rule;
	for my $r (@c_only) {
		if ($code =~ $r->[0]) { $rule = $r; last; }
	}
	if ($rule) {
		$rule_hits{$rule->[1]}++;
		my ($first) = $code =~ /^([^\n]*)/;
		push @left_out, "$first  -- $rule->[1]";
		if ($code =~ /^CREATE\s+(?:VIEW|TABLE|TYPE)\s+(idempotency\.\w+)/i) { $dropped_rel{lc $1} = 1; }
		next;
	}

	# a shared statement with a part replaced
	for my $r (@rewrite) {
		next unless $code =~ $r->[0];
		my $at = index($s, $r->[1]);
		die "build.pl: rewrite finds no \"$r->[1]\" in its statement: $r->[3]\n" if $at < 0;
		substr($s, $at, length $r->[1]) = $r->[2];
		$code = code_of($s);
		$rule_hits{$r->[3]}++;
	}

	# a C function: its portable body, or left out
	if ($code =~ /AS\s+'MODULE_PATHNAME',\s*'(\w+)'\s+LANGUAGE\s+C\b/si) {
		my $sym = $1;
		if (exists $body{$sym}) {
			$body_used{$sym} = 1;
			(my $t = $s) =~ s/AS\s+'MODULE_PATHNAME',\s*'\w+'\s+LANGUAGE\s+C\b/$body{$sym}\n/si;
			push @out, $t;
		}
		next;
	}

	# statements naming a function left out: by signature where one is
	# written (COMMENT/GRANT/REVOKE ON FUNCTION), else by name
	my $drop;
	while ($code =~ /(idempotency\.\w+)\s*\(([^()]*(?:\([^()]*\)[^()]*)*)\)/g) {
		my ($name, $args) = ($1, $2);
		my $sig = norm_sig($name, $args);
		if (exists $missing_sig{$sig}) { $drop = $sig; last; }
		if ($missing_name_all{lc $name}) { $drop = lc $name; last; }
	}
	# statements on a view or table left out
	if (!$drop) {
		for my $rel (keys %dropped_rel) {
			if ($code =~ /\Q$rel\E\b(?!\()/i) { $drop = $rel; last; }
		}
	}
	if ($drop) {
		my ($first) = $code =~ /^([^\n]*)/;
		push @left_out, "$first  -- needs $drop";
		if ($code =~ /^CREATE\s+(?:VIEW)\s+(idempotency\.\w+)/i) { $dropped_rel{lc $1} = 1; }
		next;
	}

	# pg_extension_config_dump: only under CREATE EXTENSION
	if ($code =~ /^SELECT\s+pg_catalog\.pg_extension_config_dump\((.*)\);\s*\z/si) {
		my $argsx = $1;
		die "config_dump arguments hold \$cd\$\n" if $argsx =~ /\$cd\$/;
		(my $lead = $s) =~ s/\Q$code\E\z//;
		push @out, $lead . "DO \$cd\$ BEGIN\n"
			. "    IF EXISTS (SELECT FROM pg_catalog.pg_extension AS e\n"
			. "                WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency') THEN\n"
			. "        PERFORM pg_catalog.pg_extension_config_dump($argsx);\n    END IF;\nEND \$cd\$;";
		next;
	}
	push @out, $s;
}

my $fail = 0;
for my $r (@c_only) {
	next if $rule_hits{$r->[1]} || defined $upgrade;
	print STDERR "build.pl: rule matches nothing in $cscript: $r->[1]\n";
	$fail = 1;
}
for my $r (@rewrite) {
	next if $rule_hits{$r->[3]} || defined $upgrade;
	print STDERR "build.pl: rewrite matches nothing in $cscript: $r->[3]\n";
	$fail = 1;
}
for my $sym (sort keys %body) {
	next if $body_used{$sym} || defined $upgrade;
	print STDERR "build.pl: portable body $sym names no C function of $cscript\n";
	$fail = 1 if $check;
}
exit 1 if $fail;

if (defined $upgrade) {
	print_upgrade();
	exit 0;
}

print "-- Generated by portable/build.pl from $cscript and portable/src/*.sql: do not edit.\n";
print "-- The portable edition of idempotency (SQL and PL/pgSQL, no C library).\n";
print "-- Not yet in the portable edition (left out of this script):\n";
print "--   $_\n" for @missing_list;
print "-- Statements of the C edition left out:\n";
for my $l (@left_out) { (my $x = $l) =~ s/\n/ /g; print "--   $x\n"; }
print "\n";
print "$_\n" for @head;
print "$_\n" for @out;
print "\n";
print "$_\n" for @tail;
printf STDERR "build.pl: %d C functions have a portable body, %d are not yet portable, %d statements left out\n",
	scalar(keys %body_used), scalar(@missing_list), scalar(@left_out);

# the upgrade script: the check of the recorded version, the C edition's
# statements, the portable edition's own, the new record
sub print_upgrade
{
	my ($want, $new) = ("idempotency $from (portable edition)", "idempotency $version (portable edition)");
	my $own = "$srcdir/upgrade/idempotency--$from--$version.sql";
	print "-- Generated by portable/build.pl from $upgrade, $cscript and portable/src/*.sql: do not edit.\n";
	print "-- Upgrades the portable edition of idempotency from $from to $version.\n";
	print "-- Statements of the C edition left out:\n";
	for my $l (@left_out) { (my $x = $l) =~ s/\n/ /g; print "--   $x\n"; }
	print <<"SQL";

-- A plain install (psql -f) records its version in the comment of schema
-- idempotency; this script runs only on version $from.  Under ALTER
-- EXTENSION ... UPDATE (pg_tle) the extension's version is the record.
DO \$upgrade\$
DECLARE
    recorded pg_catalog.text;
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension AS e
                WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency') THEN
        RETURN;
    END IF;
    SELECT pg_catalog.obj_description(n.oid, 'pg_namespace') INTO recorded
      FROM pg_catalog.pg_namespace AS n
     WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'this script upgrades the portable edition of idempotency from $from to $version, but this database has no schema idempotency'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Install the portable edition with psql -f idempotency--$version.sql instead.';
    END IF;
    IF recorded IS DISTINCT FROM '$want' THEN
        RAISE EXCEPTION 'this script upgrades the portable edition of idempotency from $from to $version, but schema idempotency records %',
                        COALESCE(pg_catalog.quote_literal(recorded), 'no version')
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'A plain install records its version in the comment of schema idempotency: "$want" is expected.',
                  HINT = 'Run the upgrade scripts in order, from the version recorded, one release at a time; nothing was changed.';
    END IF;
END
\$upgrade\$;

SQL
	print "$_\n" for @out;
	if (-f $own) {
		open(my $fh, '<', $own) or die "$own: $!\n";
		print "\n-- from portable/src/upgrade/idempotency--$from--$version.sql\n", do { local $/; <$fh> };
		close $fh;
	}
	print <<"SQL";

DO \$upgrade\$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension AS e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency') THEN
        COMMENT ON SCHEMA idempotency IS '$new';
    END IF;
END
\$upgrade\$;
SQL
	printf STDERR "build.pl: upgrade %s to %s: %d statements, %d left out\n", $from, $version, scalar(@out), scalar(@left_out);
}
