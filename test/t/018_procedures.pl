# docs/procedures.md as printed: its SQL blocks run in order as an
# application role, the answers its "Calling it" block shows are the ones the
# procedure gives, and the procedure keeps its promises: two calls at once
# with one key write one ledger row and the second replays; the same key
# with another request is IK001 and writes nothing; a shipped order gets a
# stored 409 and no ledger row; a new key for a paid order writes no second
# row; a stale version is refused; a duplicate held past the procedure's own
# lock_wait gets IK002 after that wait; under REPEATABLE READ a second key at
# once gets 40001, stores nothing, and its retry answers already_paid; the
# application's schema dumped and restored as the application role keeps the
# procedure with its lock_wait.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('procedures');
$node->init;
$node->start;
$node->safe_psql('postgres', q{
	CREATE ROLE shop LOGIN;
	CREATE DATABASE shop OWNER shop;
});
$node->safe_psql('shop', q{CREATE EXTENSION idempotency});

# psql as the application role, in database shop
my @shop = (extra_params => [ '-U', 'shop' ]);
sub shop_sql { return $node->safe_psql('shop', $_[0], @shop); }
# (stdout, stderr) of SQL that may fail, with the SQLSTATE in the message
sub shop_try
{
	my ($rc, $out, $err) = $node->psql('shop', "\\set VERBOSITY verbose\n$_[0]", @shop);
	return ($out, $err);
}

# --- the page's blocks, in order (prove runs in the top directory) -----------
my @blocks = slurp_file('docs/procedures.md') =~ /^```sql\n(.*?)^```$/gms;
is(scalar(@blocks), 4, 'docs/procedures.md: four SQL blocks (tables, procedure, lock wait, calls)');
my $calls = pop @blocks;
for my $i (0 .. $#blocks)
{
	my ($rc, $out, $err) = $node->psql('shop', $blocks[$i], @shop, on_error_stop => 1);
	is($rc . $err, '0', "block " . ($i + 1) . " runs: " . substr($blocks[$i] =~ s/\s+/ /gr, 0, 50));
}
# what the page says: the application role sets it in a session that has
# not loaded the library (psql's fresh session), with no superuser's help
my ($unknown, $denied) = shop_try(q{
	SELECT count(*) FROM pg_settings WHERE name = 'idempotency.lock_wait';
	ALTER PROCEDURE pay_order SET idempotency.lock_wait = '2s'});
is($unknown . $denied, '0',
	'the application role sets it in a session where the parameter is not known yet (no 42501)');
is(shop_sql(q{SELECT proconfig FROM pg_proc WHERE proname = 'pay_order'}),
	'{idempotency.lock_wait=2s}', 'the procedure carries its own lock_wait');

# "Calling it": each statement runs; a CALL's answer is the comment under it
# ("..." stands for what the page leaves out)
my ($stmt, $answer) = ('', undef);
my @shown;
for my $line (split /\n/, $calls)
{
	if ($line =~ /^--  (\{.*\})$/)
	{
		push @shown, [ $stmt, $1 ];
		$stmt = '';
		next;
	}
	next if $line =~ /^--/;
	$stmt .= "$line\n";
}
ok(@shown >= 3, 'the calls block shows the answers of its calls');
for my $case (@shown)
{
	my ($sql, $want) = @$case;
	my $got = shop_sql($sql);
	my $re = join '.*', map { quotemeta } split /\.\.\./, $want;
	like($got, qr/^$re$/, 'as printed: ' . substr($sql =~ s/\s+/ /gr, 0, 60));
}

my $ledger = q{SELECT count(*) FROM ledger WHERE order_id = %d};

# --- twice at once, one key: one session holds it, the other waits, replays ---
shop_sql(q{INSERT INTO orders (id, total) VALUES (10, 10.00), (11, 11.00), (12, 12.00), (13, 13.00)});
my $first = $node->background_psql('shop', @shop);
my $second = $node->background_psql('shop', @shop);
my $one = $first->query_safe(q{BEGIN; CALL pay_order('same-key', 10, 10.00, 1);});
like($one, qr/"status": 201/, 'first call: 201 (not committed yet)');
$second->query_until(qr/calling\n/, "\\echo calling\nCALL pay_order('same-key', 10, 10.00, 1);\n\\echo called\n");
ok( $node->poll_query_until('shop', q{
		SELECT count(*) = 1 FROM pg_locks
		 WHERE locktype = 'advisory' AND objsubid = 18756 AND NOT granted}),
	'second call waits for the key the first holds');
$first->query_safe('COMMIT');
my $two = $second->query_until(qr/called\n/, '');
$two =~ s/called\n//;
chomp $two;
is($two, $one =~ s/\}$/, "replayed": true}/r, 'second call replays the first answer');
is(shop_sql(sprintf($ledger, 10)), '1', 'one ledger row for the order');
is(shop_sql(q{SELECT status || ' ' || version FROM orders WHERE id = 10}), 'paid 2', 'the order paid once');

# --- the same key, another request: IK001, nothing written --------------------
my $before = shop_sql(q{SELECT status, response FROM idempotency.idempotency_key WHERE key = 'same-key'});
my ($out, $err) = shop_try(q{CALL pay_order('same-key', 10, 9.00, 1)});
like($err, qr/ERROR:  IK001: idempotency key "same-key" in scope "pay_order" was already used with a different request/,
	'same key, another amount: IK001');
is(shop_sql(sprintf($ledger, 10)), '1', 'IK001: no ledger row written');
is(shop_sql(q{SELECT status, response FROM idempotency.idempotency_key WHERE key = 'same-key'}), $before,
	'IK001: the key unchanged');

# --- a shipped order: 409 stored (fail() in the handler), replayed, no row ----
shop_sql(q{UPDATE orders SET status = 'shipped' WHERE id = 11});
($out, $err) = shop_try(q{CALL pay_order('ship-key', 11, 11.00, 1)});
is($err, '', 'shipped order: the CALL commits (no 2D000)');
like($out, qr/^\{"error": "order_not_payable", "status": 409, "message": "invalid state transition of row id = 11 in table \\"orders\\" from \\"shipped\\" to \\"paid\\""\}$/,
	'shipped order: 409 order_not_payable');
is(shop_sql(q{SELECT status || ' ' || retryable FROM idempotency.idempotency_key WHERE key = 'ship-key'}),
	'failed false', 'shipped order: the refusal is stored, not retryable');
like(shop_sql(q{CALL pay_order('ship-key', 11, 11.00, 1)}), qr/"status": 409.*"replayed": true\}$/,
	'shipped order: the retry replays the 409');
is(shop_sql(sprintf($ledger, 11)) . ' ' . shop_sql(q{SELECT status FROM orders WHERE id = 11}),
	'0 shipped', 'shipped order: no ledger row, still shipped');

# --- a new key for a paid order: already_paid, no second row -----------------
like(shop_sql(q{CALL pay_order('other-tab', 10, 10.00, 1)}),
	qr/^\{"status": 200, "payment": \{"id": \d+, "kind": "payment", "amount": 10.00, "order_id": 10\}, "already_paid": true\}$/,
	'new key for a paid order: 200 already_paid with the first payment');
is(shop_sql(sprintf($ledger, 10)), '1', 'new key for a paid order: still one ledger row');
is(shop_sql(q{SELECT version FROM orders WHERE id = 10}), '2', 'new key for a paid order: version unchanged');

# --- two keys at once for one order: the second waits for the row, already_paid
shop_sql(q{INSERT INTO orders (id, total) VALUES (14, 14.00)});
my $tab1 = $first->query_safe(q{BEGIN; CALL pay_order('tab-1', 14, 14.00, 1);});
like($tab1, qr/"status": 201/, 'first key: 201 (not committed yet)');
$second->query_until(qr/calling\n/, "\\echo calling\nCALL pay_order('tab-2', 14, 14.00, 1);\n\\echo called\n");
ok( $node->poll_query_until('shop', q{
		SELECT count(*) = 1 FROM pg_stat_activity
		 WHERE wait_event_type = 'Lock' AND wait_event = 'transactionid'
		   AND query LIKE 'CALL pay_order(''tab-2''%'}),
	'second key waits for the order row the first has moved');
$first->query_safe('COMMIT');
my $tab2 = $second->query_until(qr/called\n/, '');
like($tab2, qr/^\{"status": 200, "payment": \{"id": \d+, "kind": "payment", "amount": 14.00, "order_id": 14\}, "already_paid": true\}\n/,
	'second key: 200 already_paid');
is(shop_sql(sprintf($ledger, 14)), '1', 'two keys at once: one ledger row');

# --- the same under REPEATABLE READ: the second key's snapshot predates the
# payment, so it gets 40001 and stores nothing; its retry with the same key
# answers already_paid (the page's table: 40001, retry with the same key)
shop_sql(q{INSERT INTO orders (id, total) VALUES (15, 15.00)});
$first->query_safe(q{SET default_transaction_isolation = 'repeatable read'});
$second->query_safe(q{SET default_transaction_isolation = 'repeatable read'});
$second->query_safe(q{\set ON_ERROR_STOP 0});
my $rr1 = $first->query_safe(q{BEGIN; CALL pay_order('rr-1', 15, 15.00, 1);});
like($rr1, qr/"status": 201/, 'repeatable read, first key: 201 (not committed yet)');
$second->query_until(qr/calling\n/,
	"\\echo calling\nCALL pay_order('rr-2', 15, 15.00, 1);\n\\echo sqlstate :LAST_ERROR_SQLSTATE\n\\echo called\n");
ok( $node->poll_query_until('shop', q{
		SELECT count(*) = 1 FROM pg_stat_activity
		 WHERE wait_event_type = 'Lock' AND wait_event = 'transactionid'
		   AND query LIKE 'CALL pay_order(''rr-2''%'}),
	'repeatable read, second key waits for the order row');
$first->query_safe('COMMIT');
my $rr2 = $second->query_until(qr/called\n/, '');
like($rr2, qr/^sqlstate 40001\n/m, 'repeatable read, second key: 40001 once the first commits');
is( shop_sql(sprintf($ledger, 15)) . ' '
	  . shop_sql(q{SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'rr-2'}),
	'1 0', 'repeatable read, second key: one ledger row, its key not stored');
like(shop_sql(q{SET default_transaction_isolation = 'repeatable read'; CALL pay_order('rr-2', 15, 15.00, 1)}),
	qr/^\{"status": 200, .*"already_paid": true\}$/, 'repeatable read, its retry with the same key: already_paid');
$first->query_safe(q{RESET default_transaction_isolation});
$second->quit;	# (its error stays in its stderr) a fresh session for what follows
$second = $node->background_psql('shop', @shop);

# --- a stale version (the order changed since the client read it) -------------
shop_sql(q{SELECT idempotency.update_versioned('orders', 12, 1, '{"total": 14.00}')});
like(shop_sql(q{CALL pay_order('stale-key', 12, 12.00, 1)}),
	qr/^\{"error": "order_changed", "status": 409, "message": "stale version of row id = 12 in table \\"orders\\": expected 1, current 2"\}$/,
	'stale version: 409 order_changed');
is(shop_sql(sprintf($ledger, 12)) . ' ' . shop_sql(q{SELECT status || ' ' || version FROM orders WHERE id = 12}),
	'0 pending 2', 'stale version: nothing written (the transition undone with the block)');

# --- a duplicate held past the procedure's lock_wait: IK002 after 2000 ms ------
$first->query_safe(q{BEGIN; CALL pay_order('held-key', 13, 13.00, 1);});
($out, $err) = shop_try(q{CALL pay_order('held-key', 13, 13.00, 1)});
like($err, qr/ERROR:  IK002: .*\nDETAIL:  Another transaction holds it; this request waited 2000 ms \(idempotency.lock_wait\)/,
	'a duplicate past the wait: IK002 after the procedure\'s 2000 ms');
$first->query_safe('ROLLBACK');
is(shop_sql(sprintf($ledger, 13)) . ' ' . shop_sql(q{SELECT count(*) FROM idempotency.idempotency_key WHERE key = 'held-key'}),
	'0 0', 'the held call rolled back: no ledger row, no key');
is(shop_sql(q{SELECT octet_length(idempotency.fingerprint('{}')); SHOW idempotency.lock_wait}), "32\n5s",
	'outside the procedure the wait is the default');

# --- the application's dump restores as the application role ------------------
# pg_dump writes the procedure with its SET clause; the restore runs as the
# application role, into a database whose extension a superuser created (as
# on a managed server), in a session that has not loaded the library
$node->safe_psql('postgres', q{CREATE DATABASE shop_copy OWNER shop});
$node->safe_psql('shop_copy', q{CREATE EXTENSION idempotency});
my $dump = $node->basedir . '/shop.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-n', 'public', '-f', $dump, '-d', $node->connstr('shop') . ' user=shop' ],
	'pg_dump of the application schema as the application role');
# (schema public is there already: restore what is in it)
my $toc = $node->basedir . '/shop.list';
$node->command_ok([ 'pg_restore', '-l', '-f', $toc, $dump ], 'pg_restore -l');
my @entries = grep { !/ SCHEMA - public / } split /\n/, slurp_file($toc);
open my $fh, '>', $toc or die "$toc: $!";
print $fh join("\n", @entries), "\n";
close $fh;
$node->command_ok([ 'pg_restore', '--exit-on-error', '-L', $toc, '-d', $node->connstr('shop_copy') . ' user=shop', $dump ],
	'pg_restore of the application schema as the application role');
is( $node->safe_psql('shop_copy', q{SELECT proconfig FROM pg_proc WHERE proname = 'pay_order'}),
	'{idempotency.lock_wait=2s}', 'the restored procedure carries its lock_wait');
# (the machine is a row of the extension's table, in a dump of the whole
# database but not of the schema: the page's line again)
my ($machine) = $blocks[0] =~ /^(SELECT idempotency\.create_machine\(.*?\);)$/ms;
$node->safe_psql('shop_copy', $machine, @shop);
like($node->safe_psql('shop_copy', q{INSERT INTO orders (id, total) VALUES (99, 9.00); CALL pay_order('copy-1', 99, 9.00, 1)}, @shop),
	qr/^\{"status": 201, /, 'and pays in the restored database');

$first->quit;
$second->quit;
$node->stop;
done_testing();
