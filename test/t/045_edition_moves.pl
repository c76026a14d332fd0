# A database moves between the editions by pg_dump and pg_restore, in both
# directions, with keys in flight, the way docs/portable.md tells a user to
# move it: install the target edition first, then restore the dump through
# the list portable/move.pl makes (the application's objects and the rows
# of idempotency's tables, nothing else).
#
# Two clusters: one of the PostgreSQL that has the C library (preloaded),
# one of portable/server.sh's copy of it, which has no file of ours (and
# pg_tle, when portable/pg_tle.sh could build it).  The source database, on
# the C edition, has a completed key whose response is http_response()'s
# bytes, a completed text response, a lease taken over and renewed (attempt
# 2 holds it; attempt 1 is fenced), a lease held with a recovery point, a
# lease that lapsed, an unused and a used token, a seen message.  It moves
# to the portable edition installed by psql -f and through pg_tle; each of
# those moves back to the C edition.  In every target: the rows are the
# source's, the completed keys replay byte for byte, a different request is
# IK001, the lease stays held (IK002) and fenced (IK004) and its holder
# finishes it, the held lease's worker checkpoints and completes, the
# lapsed lease is taken over, every derived key is the source's, tokens and
# seen messages answer as before, and a commit with an unfinished key is
# refused (2D000).  Roles have other oids on the portable cluster.
#
# test/run (ONLY=tap) passes what the test needs: the copy's installation
# (IDEMPOTENCY_PORTABLE_INSTALL), the generated script and move.pl in
# portable/, and IDEMPOTENCY_PORTABLE_PGTLE=1 when the copy has pg_tle; it
# sets IDEMPOTENCY_PORTABLE_SKIP to the reason when the copy cannot be made.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $install = $ENV{IDEMPOTENCY_PORTABLE_INSTALL};
my $script = 'portable/idempotency--0.6.0.sql';
my $move = 'portable/move.pl';
plan skip_all => "no PostgreSQL without the C library: $ENV{IDEMPOTENCY_PORTABLE_SKIP}"
  if $ENV{IDEMPOTENCY_PORTABLE_SKIP};
plan skip_all => 'run through test/run (ONLY=tap), which makes the portable edition\'s server and script'
  unless $install && -f $script && -f $move;
my $pgtle = ($ENV{IDEMPOTENCY_PORTABLE_PGTLE} // '') eq '1';

my $dir = PostgreSQL::Test::Utils::tempdir;

my $c = PostgreSQL::Test::Cluster->new('c_edition');
$c->init;
$c->append_conf('postgresql.conf', q{shared_preload_libraries = 'idempotency'
idempotency.purge_interval = 0});
$c->start;

my $p = PostgreSQL::Test::Cluster->new('portable', install_path => $install);
$p->init;
$p->append_conf('postgresql.conf', q{shared_preload_libraries = 'pg_tle'}) if $pgtle;
$p->start;
is($p->safe_psql('postgres', q{SELECT count(*) FROM pg_available_extensions WHERE name = 'idempotency'}),
	'0', 'the portable cluster has no idempotency extension to create');

# the roles: what a managed service gives its admin (a database owner with
# CREATEROLE), and the application's role; other oids on the portable side
$c->safe_psql('postgres', q{CREATE ROLE owner LOGIN CREATEROLE; CREATE ROLE app LOGIN});
$p->safe_psql('postgres', q{CREATE ROLE filler_1; CREATE ROLE filler_2;
	CREATE ROLE owner LOGIN CREATEROLE; CREATE ROLE app LOGIN});

# --- the source, on the C edition -----------------------------------------
$c->safe_psql('postgres', q{CREATE DATABASE src OWNER owner});
$c->safe_psql('src', q{
	CREATE EXTENSION idempotency;
	CREATE TABLE public.payment (id int PRIMARY KEY, amount numeric);
	GRANT ALL ON public.payment TO app;
});
sub as_app { my ($node, $db, $sql) = @_; return $node->safe_psql($db, "SET ROLE app; $sql"); }
as_app($c, 'src', q{
	BEGIN;
	SELECT outcome FROM idempotency.begin('paid-1', '{"amount": 10}');
	INSERT INTO payment VALUES (1, 10);
	SELECT idempotency.complete('paid-1',
		idempotency.http_response(201, '\x00ff0a'::bytea, '{"Location": "/payments/1"}'));
	COMMIT;
	BEGIN;
	SELECT outcome FROM idempotency.begin('text-1', '{"amount": 20}');
	SELECT idempotency.complete('text-1', idempotency.http_response(200, 'héllo "world"'));
	COMMIT;
	SELECT outcome FROM idempotency.begin('lease-1', '{"n": 1}', lease => '1 millisecond');
	SELECT outcome FROM idempotency.begin('mid-1', '{"n": 2}', lease => '1 hour');
	SELECT outcome FROM idempotency.begin('lapsed-1', '{"n": 3}', lease => '1 millisecond');
});
as_app($c, 'src', q{SELECT idempotency.checkpoint('mid-1', 'charged', '{"charge": "ch_1"}', 1)});
is(as_app($c, 'src', q{SELECT outcome || ' ' || attempts FROM idempotency.begin('lease-1', '{"n": 1}', lease => '1 hour')}),
	'retry 2', 'source: attempt 2 takes the lapsed lease over');
is(as_app($c, 'src', q{SELECT idempotency.renew('lease-1', '2 hours', 2) > now() + interval '90 minutes'}),
	't', 'source: attempt 2 renews its lease');
# a state machine and the outbox: a topic, its grant, a keyed message
$c->safe_psql('src', q{
	SELECT idempotency.create_machine('order', '{"pending": ["paid"], "paid": []}');
	SELECT idempotency.create_topic('payments');
	SELECT idempotency.grant_topic('payments', 'app');
});
as_app($c, 'src', q{SELECT idempotency.publish('payments', '{"amount": 10}', message_key => 'order-1')});
my $t_unused = as_app($c, 'src', q{SELECT idempotency.issue_token()});
my $t_used = as_app($c, 'src', q{SELECT idempotency.issue_token()});
is(as_app($c, 'src', qq{SELECT idempotency.consume_token('$t_used')}), 't', 'source: a token used');
is(as_app($c, 'src', q{SELECT idempotency.first_seen('inbox', 'm-1')}), 't', 'source: a message seen');

# what must survive every move: the rows (every column, as text, in the
# order of their names; roles by name) and the derived keys
sub rows
{
	my ($node, $db) = @_;
	my $out = '';
	for my $t (qw(idempotency_key token seen_message state_machine outbox_topic outbox_grant outbox_message))
	{
		my $cols = $node->safe_psql($db, qq{SELECT string_agg(format('%I::text', attname), ', ' ORDER BY attname)
			FROM pg_attribute WHERE attrelid = 'idempotency.$t'::regclass AND attnum > 0 AND NOT attisdropped});
		$out .= "$t: $cols\n" . $node->safe_psql($db, "SELECT $cols FROM idempotency.$t ORDER BY 1, 2, 3") . "\n";
	}
	return $out;
}
my $derive = q{SELECT string_agg(k || '/' || s || ' ' || idempotency.derive_key(k, s), ', ' ORDER BY k, s)
	FROM unnest(ARRAY['paid-1', 'text-1', 'lease-1', 'mid-1', 'lapsed-1']) AS k, unnest(ARRAY['charge', 'refund']) AS s};
my $rows = rows($c, 'src');
my $derived = as_app($c, 'src', $derive);
is(scalar(() = $derived =~ / idk_[a-z2-7]{26}(?:, |$)/g), 10, 'source: the keys derive');
my $response = as_app($c, 'src', q{SELECT response::text FROM idempotency.idempotency_key WHERE key = 'paid-1'});
# the tables move.pl moves the rows of are the ones the C edition dumps
my $extconfig = $c->safe_psql('src', q{SELECT string_agg(c.relname, ' ' ORDER BY c.relname)
	FROM pg_extension AS e, unnest(e.extconfig) AS t(oid) JOIN pg_class AS c ON c.oid = t.oid
	WHERE e.extname = 'idempotency'});
my $tables;
IPC::Run::run([ 'perl', $move, '--tables' ], '>', \$tables) or die "move.pl --tables failed";
is(join(' ', sort split /\n/, $tables), $extconfig, 'move.pl moves the rows of the tables the C edition dumps');

# --- the moves --------------------------------------------------------------
# pg_dump of a database; the list of what to restore (portable/move.pl)
sub dump_db
{
	my ($node, $db, $name, @as) = @_;
	$node->command_ok([ 'pg_dump', @as, '-Fc', '-f', "$dir/$name.dump", '-d', $node->connstr($db) ],
		"pg_dump of $name");
	my ($list, $err);
	IPC::Run::run([ $node->installed_command('pg_restore'), '-l', "$dir/$name.dump" ], '>', \$list, '2>', \$err)
	  or die "pg_restore -l: $err";
	IPC::Run::run([ 'perl', $move ], '<', \$list, '>', "$dir/$name.list") or die "move.pl failed";
	return $name;
}
sub restore
{
	my ($node, $db, $name, @as) = @_;
	$node->command_ok([ 'pg_restore', @as, '--no-owner', '--exit-on-error', '-L', "$dir/$name.list",
		'-d', $node->connstr($db), "$dir/$name.dump" ], "pg_restore of $name into $db");
}
# the portable edition installed into a new database of owner, the way a
# managed service's admin installs it (no superuser)
sub portable_db
{
	my ($db, $route) = @_;
	$p->safe_psql('postgres', "CREATE DATABASE $db OWNER owner");
	if ($route eq 'plain')
	{
		$p->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-1', '-U', 'owner',
			'-d', $p->connstr($db), '-f', $script ], "$db: psql -f of the portable edition as the database owner");
	}
	else
	{
		# pg_tle is the service's (rds_superuser on RDS; Supabase has it)
		$p->safe_psql($db, q{SET client_min_messages = warning; CREATE EXTENSION pg_tle; GRANT pgtle_admin TO owner});
		my ($ret, $out, $err) = $p->psql($db, qq{\\set script `cat $script`
SELECT pgtle.install_extension('idempotency', '0.6.0', 'portable edition', :'script', NULL, 'idempotency');
CREATE EXTENSION idempotency;}, extra_params => [ '-U', 'owner' ], on_error_stop => 1);
		is($ret, 0, "$db: pgtle.install_extension and CREATE EXTENSION as the database owner") or diag($err);
	}
}
sub c_db
{
	my ($db) = @_;
	$c->safe_psql('postgres', "CREATE DATABASE $db OWNER owner");
	$c->safe_psql($db, q{CREATE EXTENSION idempotency});
}

dump_db($c, 'src', 'from_c');
my @targets;
# C -> portable by psql -f, and back
portable_db('plain', 'plain');
restore($p, 'plain', 'from_c', '-U', 'owner');
push @targets, [ $p, 'plain' ];
dump_db($p, 'plain', 'from_plain', '-U', 'owner');
c_db('back');
restore($c, 'back', 'from_plain');
push @targets, [ $c, 'back' ];
# C -> portable through pg_tle, and back
SKIP:
{
	skip 'the pg_tle route: portable/pg_tle.sh could not build pg_tle into the portable server', 6
	  unless $pgtle;
	portable_db('tle', 'pgtle');
	restore($p, 'tle', 'from_c', '-U', 'owner');
	push @targets, [ $p, 'tle' ];
	dump_db($p, 'tle', 'from_tle', '-U', 'owner');
	c_db('back_tle');
	restore($c, 'back_tle', 'from_tle');
	push @targets, [ $c, 'back_tle' ];
}

# --- after each move --------------------------------------------------------
# the SQLSTATE of a statement's error, or 'ok'
sub sqlstate
{
	my ($node, $db, $sql) = @_;
	my ($ret, $out, $err) = $node->psql($db, "\\set VERBOSITY verbose\nSET ROLE app;\n$sql");
	return $ret == 0 ? 'ok' : ($err =~ /ERROR:  ([0-9A-Z]{5}):/ ? $1 : "failed: $err");
}

for my $t (@targets)
{
	my ($node, $db) = @$t;
	my $edition = $node == $p ? 'portable' : 'C';
	my $name = "$db ($edition edition)";
	if ($db eq 'plain')
	{
		is($p->safe_psql($db, q{SELECT obj_description('idempotency'::regnamespace, 'pg_namespace')}),
			'idempotency 0.6.0 (portable edition)', "$name: the install records its version");
	}
	is(rows($node, $db), $rows, "$name: the keys, tokens, seen messages, state machines and the outbox are the source's");
	is(as_app($node, $db, $derive), $derived, "$name: every key derives the source's downstream keys");
	is(as_app($node, $db, q{SELECT count(*) FROM payment}), '1', "$name: the application's rows came along");

	# completed keys replay, byte for byte
	is(as_app($node, $db, q{SELECT outcome || ' ' || response::text FROM idempotency.begin('paid-1', '{"amount": 10}')}),
		"replay $response", "$name: the completed key replays the stored response");
	is(as_app($node, $db, q{SELECT idempotency.http_response(201, '\x00ff0a'::bytea, '{"Location": "/payments/1"}')::text}),
		$response, "$name: http_response() gives the source's bytes");
	is(as_app($node, $db, q{SELECT decode(response->>'body_base64', 'base64') = '\x00ff0a'::bytea
		FROM idempotency.begin('paid-1', '{"amount": 10}')}), 't', "$name: the replayed body decodes to the bytes sent");
	is(as_app($node, $db, q{SELECT outcome || ' ' || (response->>'body') FROM idempotency.begin('text-1', '{"amount": 20}')}),
		'replay héllo "world"', "$name: the text response replays");
	is(sqlstate($node, $db, q{SELECT idempotency.begin('paid-1', '{"amount": 11}')}), 'IK001',
		"$name: a different request under the key is IK001");

	# the lease taken over and renewed stays held, attempt 1 stays fenced
	is(sqlstate($node, $db, q{SET idempotency.lock_wait = 0; SELECT idempotency.begin('lease-1', '{"n": 1}', lease => '1 hour')}),
		'IK002', "$name: the leased key stays held (IK002)");
	is(sqlstate($node, $db, q{SELECT idempotency.complete('lease-1', '"zombie"', attempt => 1)}), 'IK004',
		"$name: the taken-over attempt stays fenced (IK004)");
	is(as_app($node, $db, q{SELECT idempotency.renew('lease-1', '1 hour', 2) > now();
		SELECT idempotency.complete('lease-1', '"done by 2"', attempt => 2);
		SELECT outcome || ' ' || response::text || ' ' || attempts FROM idempotency.begin('lease-1', '{"n": 1}')}),
		"t\n\nreplay \"done by 2\" 2", "$name: its holder renews and completes it, then it replays");
	# the held lease's worker goes on from its recovery point
	is(sqlstate($node, $db, q{SET idempotency.lock_wait = 0; SELECT idempotency.begin('mid-1', '{"n": 2}', lease => '1 hour')}),
		'IK002', "$name: the key in flight is held");
	is(as_app($node, $db, q{SELECT recovery_point || ' ' || recovery_state::text FROM idempotency.idempotency_key WHERE key = 'mid-1'}),
		'charged {"charge": "ch_1"}', "$name: with its recovery point");
	is(as_app($node, $db, q{SELECT idempotency.checkpoint('mid-1', 'shipped', '{"ship": 1}', 1);
		SELECT idempotency.complete('mid-1', '"shipped"', attempt => 1);
		SELECT outcome || ' ' || response::text FROM idempotency.begin('mid-1', '{"n": 2}')}),
		"\n\nreplay \"shipped\"", "$name: its worker checkpoints and completes it");
	# the lapsed lease is taken over
	is(as_app($node, $db, q{SELECT outcome || ' ' || attempts FROM idempotency.begin('lapsed-1', '{"n": 3}', lease => '1 hour')}),
		'retry 2', "$name: the lapsed lease is taken over");
	is(as_app($node, $db, $derive), $derived, "$name: the keys derive the same after the writes");

	# tokens and seen messages
	is(as_app($node, $db, qq{SELECT idempotency.consume_token('$t_unused'), idempotency.consume_token('$t_unused'),
		idempotency.consume_token('$t_used')}), 't|f|f', "$name: the unused token is good once, the used one not");
	is(as_app($node, $db, q{SELECT idempotency.first_seen('inbox', 'm-1'), idempotency.first_seen('inbox', 'm-2')}),
		'f|t', "$name: the seen message is not first seen again");

	# the outbox goes on: the message is claimed, a new one follows it
	# (where the edition has the outbox's functions)
	if ($node->safe_psql($db, q{SELECT count(*) FROM pg_proc WHERE proname = 'claim' AND pronamespace = 'idempotency'::regnamespace}))
	{
		is(as_app($node, $db, q{SELECT string_agg(message_key || ' ' || payload::text, ', ') FROM idempotency.claim('payments')}),
			'order-1 {"amount": 10}', "$name: the message is claimed");
		is(as_app($node, $db, q{SELECT idempotency.publish('payments', '{"amount": 11}', message_key => 'order-2') IS NOT NULL;
			SELECT (SELECT id FROM idempotency.outbox_message WHERE message_key = 'order-2')
			     > (SELECT id FROM idempotency.outbox_message WHERE message_key = 'order-1')}),
			"t\nt", "$name: a message published after the move follows it (the sequence moved)");
	}

	# the commit check
	is(sqlstate($node, $db, q{BEGIN; SELECT idempotency.begin('fresh-1'); COMMIT;}), '2D000',
		"$name: a commit with an unfinished key is refused (2D000)");
	is(as_app($node, $db, q{SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'fresh-1'}), '0',
		"$name: and nothing of it was stored");
}

# --- a plain install's dump and a dropped role ---------------------------
# DROP ROLE leaves a role's rows; a plain install's dump (no extension, so
# no pg_extension_config_dump() filter) writes their regrole owner as a bare
# oid, which a portable target reads as whatever role has that oid there.
# docs/portable.md has the DELETE statements to run before the dump: after
# them, a role that has the dropped role's oid on another cluster gets no
# row of it.
$p->safe_psql('plain', q{CREATE ROLE gone});
$p->safe_psql('plain', q{SET ROLE gone; BEGIN; SELECT idempotency.begin('gone-1');
	SELECT idempotency.complete('gone-1', '"gone: card 5555"'); COMMIT; RESET ROLE; DROP ROLE gone});
my $gone_oid = $p->safe_psql('plain', q{SELECT owner::oid FROM idempotency.idempotency_key WHERE key = 'gone-1'});
like($gone_oid, qr/^\d+$/, 'plain: the dropped role\'s row stays, its owner a bare oid');
my ($cleanup) = slurp_file('docs/portable.md') =~ /^```sql\n(DELETE FROM idempotency\.idempotency_key .*?)^```/ms;
ok($cleanup && $cleanup =~ /outbox_topic/, 'docs/portable.md has the statements that delete dropped roles\' rows');
$p->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-1', '-U', 'owner', '-d', $p->connstr('plain'), '-c', $cleanup ],
	'plain: the installing role deletes the rows of dropped roles');
is($p->safe_psql('plain', q{SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'gone-1'}), '0',
	'plain: the dropped role\'s row is gone');
dump_db($p, 'plain', 'from_plain_cleaned', '-U', 'owner');
# another portable cluster, where a role has the dropped role's oid
my $p2 = PostgreSQL::Test::Cluster->new('portable_2', install_path => $install);
$p2->init;
$p2->start;
$p2->safe_psql('postgres', qq{CREATE ROLE owner LOGIN CREATEROLE; CREATE ROLE app LOGIN;
	DO \$\$
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
	END \$\$;
	CREATE DATABASE plain2 OWNER owner});
$p2->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-1', '-U', 'owner',
	'-d', $p2->connstr('plain2'), '-f', $script ], 'plain2: psql -f of the portable edition');
restore($p2, 'plain2', 'from_plain_cleaned', '-U', 'owner');
is($p2->safe_psql('plain2', q{SET ROLE heir; SELECT count(*) FROM idempotency.idempotency_key}), '0',
	'plain2: the role with the dropped role\'s oid has no key');
is($p2->safe_psql('plain2', q{SET ROLE app; SELECT count(*) FROM idempotency.idempotency_key}),
	$p->safe_psql('plain', q{SET ROLE app; SELECT count(*) FROM idempotency.idempotency_key}),
	'plain2: the application\'s keys came along');

done_testing();
