'use strict';
// test/conformance/scenarios.js: THE list of HTTP scenarios every example app
// must pass (test/conformance/README.md has the contract and this list in
// prose).  The harness (harness.js) runs them in this order against one app
// in one mode (direct / through PgBouncer) and prints one TAP line per
// check: "ok - [<app> <mode>] <id>: <check>".
//
// A scenario is { id, title, only?, run(t, check) }:
//   id      a short name, used by test/conformance/exceptions
//   title   what it proves, one line
//   only    a list of app labels: a feature only those apps have (today:
//           Express's raw-body route); every other scenario runs for every app
//   run     sends real HTTP requests to the app through t and checks the
//           answers and the database (t.rows: the business rows of a key,
//           t.keyRows: its stored idempotency keys) with check(description,
//           ok, diagnostics); every check must be able to fail.
//
// t (harness.js): t.post({key, body, user, path, fresh}) -> {status, headers,
// body (Buffer)}; t.postRetry(opts, tries): resends on 409 after its
// Retry-After (capped at 100 ms), counting conflicts and 409s without a
// Retry-After; t.key(name): a key unique to this run and scenario;
// t.rows(key), t.keyRows(key), t.sleeping(), t.waitFor(cond), t.query(sql,
// params); t.kill() / t.start(): the server process; t.exited(ms): it exited
// by itself; t.stderr(): what the
// server has written to stderr since it started; t.bouncer: the PgBouncer run.
// For POST /transfers (the phases, test/conformance/README.md): t.steps(key)
// -> {debit, finish, other}: its transfer_step rows; t.downstream.mark() /
// .since(mark): the calls the fake downstream received [{key, amount,
// charge_id, openTx (sessions idle in a transaction during the call)}]; t.post({..., headers: {'X-Crash': 'charge'}}).

const sleep = ms => new Promise(r => setTimeout(r, ms));
const same = (a, b) => a.status === b.status && a.body.equals(b.body) &&
	a.headers['content-type'] === b.headers['content-type'] && a.headers.location === b.headers.location;
const replayed = r => r.headers['idempotent-replayed'] === 'true';
const show = r => r && (r instanceof Error ? String(r) : { status: r.status, headers: r.headers, body: r.body && r.body.toString() });
const paid = /^\{"status":"paid","id":(\d+),"amount":"([0-9.]+)","note":"café ✓"\}$/;
const json = /^application\/json\b/;
const done = amount => new RegExp(`^\\{"status":"done","charge_id":"(ch_\\d+)","amount":"${amount.replace('.', '\\.')}"\\}$`);
const transfer = (t, key, body, extra = {}) => t.post({ key, body, path: '/transfers', ...extra });
// the Idempotency-Key the charge phase must send downstream: derive_key(key,
// 'charge', scope) of the key's one stored row (its scope is the app's)
async function chargeKey(t, key) {
	const r = (await t.query('SELECT idempotency.derive_key(key, \'charge\', scope) AS k FROM idempotency.idempotency_key ' +
		'WHERE key = $1', [key])).rows;
	return r.length === 1 ? r[0].k : `(${r.length} stored rows for the key)`;
}
// a crash in phase `where` (X-Crash), the server restarted, the request
// resent until the crashed attempt's 2 s lease lapsed (409s meanwhile)
async function crashed(t, check, where) {
	await t.waitFor(async () => await t.sleeping() === 0);
	const k = t.key(`crash-${where}`);
	const m = t.downstream.mark();
	const lost = await transfer(t, k, { amount: '21.00' }, { headers: { 'X-Crash': where }, fresh: true }).then(x => x, e => e);
	const died = await t.exited();
	const before = await t.steps(k);
	await t.kill();
	await t.start();
	const r = await t.postRetry({ key: k, body: { amount: '21.00' }, path: '/transfers' }, 200);
	const r2 = await transfer(t, k, { amount: '21.00' });
	const calls = t.downstream.since(m);
	const want = await chargeKey(t, k);
	const id = done('21.00').exec(r.body.toString('utf8'));
	const steps = await t.steps(k);
	const wantCalls = where === 'charge' ? 2 : 1;
	check(`a crash in "${where}" (the process exited: no answer), restarted, resent: 201 with the contract's body ` +
		`after ${r.conflicts} 409s, then a byte-identical replay`,
		lost instanceof Error && died && r.status === 201 && !replayed(r) && json.test(r.headers['content-type'] || '') &&
		id !== null && replayed(r2) && same(r, r2), [show(lost), died, show(r), show(r2)]);
	check(`after the crash in "${where}": one 'debit' and one 'finish' row (before the restart: ` +
		`debit ${before.debit}, finish ${before.finish})`,
		before.debit === 1 && before.finish === 0 && steps.debit === 1 && steps.finish === 1 && steps.other === 0, [before, steps]);
	check(`after the crash in "${where}": ${wantCalls} downstream call(s), all with the one derived key ` +
		'derive_key(key, \'charge\', scope), and the answer carries its charge_id',
		calls.length === wantCalls && calls.every(c => c.key === want && c.charge_id === calls[0].charge_id && c.amount === '21.00') &&
		id !== null && id[1] === calls[0].charge_id, [calls, want, id && id[1]]);
}

module.exports = [
	// --- the key header --------------------------------------------------------
	{
		id: 'key-missing', title: 'a request without Idempotency-Key is refused before the handler runs',
		async run(t, check) {
			const r = await t.post({ body: { amount: '1.00' } });
			check('missing Idempotency-Key -> 400', r.status === 400 && !replayed(r), show(r));
		},
	},
	{
		id: 'key-malformed', title: 'a header that is not a structured-field string or token is refused',
		async run(t, check) {
			const r = await t.post({ key: '"unterminated', body: { amount: '1.00' } });
			check('malformed structured-field key -> 400', r.status === 400, show(r));
		},
	},
	{
		id: 'key-oversized', title: 'a key longer than 255 characters is refused (IK003), nothing written',
		async run(t, check) {
			const k = 'x'.repeat(300);
			const r = await t.post({ key: k, body: { amount: '1.00' } });
			check('key longer than 255 characters -> 400 (IK003), nothing written',
				r.status === 400 && await t.rows(k) === 0 && await t.keyRows(k) === 0, show(r));
		},
	},
	{
		id: 'key-forms', title: '"k" (an sf-string) and bare k are one key',
		async run(t, check) {
			const k = t.key('sf');
			const sf = await t.post({ key: `"${k}"`, body: { amount: '2.00' } });
			const bare = await t.post({ key: k, body: { amount: '2.00' } });
			check('"k" (structured-field string) and bare k are one key: 201, then its replay',
				sf.status === 201 && !replayed(sf) && replayed(bare) && same(sf, bare) && await t.rows(k) === 1,
				[show(sf), show(bare)]);
		},
	},

	// --- one key, one effect -----------------------------------------------------
	{
		id: 'first-request', title: 'the first request runs the handler once and its answer is stored',
		async run(t, check) {
			const k = t.key('first');
			const r = await t.post({ key: k, body: { amount: '12.30' } });
			const m = paid.exec(r.body.toString('utf8'));
			const ids = (await t.query('SELECT id::text, amount::text FROM payment WHERE idem_key = $1', [k])).rows;
			check('201, application/json, Location /payments/<id>, the contract\'s body naming the one row inserted',
				r.status === 201 && !replayed(r) && json.test(r.headers['content-type'] || '') && m !== null &&
				m[2] === '12.30' && ids.length === 1 && ids[0].id === m[1] && ids[0].amount === '12.30' &&
				r.headers.location === `/payments/${m[1]}`, [show(r), ids]);
			const stored = (await t.query('SELECT (response->>\'status\')::int AS s FROM idempotency.idempotency_key ' +
				'WHERE key = $1', [k])).rows;
			check('the key is stored once, with status 201', stored.length === 1 && stored[0].s === 201, stored);
		},
	},
	{
		id: 'replay', title: 'a resend gets the stored answer byte for byte, marked Idempotent-Replayed',
		async run(t, check) {
			const k = t.key('replay');
			const a = await t.post({ key: k, body: { amount: '13.40' } });
			const b = await t.post({ key: k, body: { amount: '13.40' } });
			const c = await t.post({ key: k, body: { amount: '13.40' }, fresh: true });
			check('resent twice: status, body, Content-Type and Location byte-identical, Idempotent-Replayed: true, one row',
				a.status === 201 && !replayed(a) && replayed(b) && replayed(c) && same(a, b) && same(a, c) &&
				await t.rows(k) === 1, [show(a), show(b), show(c)]);
		},
	},
	{
		id: 'replay-declined', title: 'a 4xx answer (402 decline) is final: stored and replayed',
		async run(t, check) {
			const k = t.key('decline');
			const a = await t.post({ key: k, body: { amount: '14.00', decline: true } });
			const b = await t.post({ key: k, body: { amount: '14.00', decline: true } });
			check('402 {"error":"card_declined"}, stored; the resend replays it',
				a.status === 402 && !replayed(a) && /"error":\s*"card_declined"/.test(a.body.toString()) &&
				replayed(b) && same(a, b) && await t.keyRows(k) === 1 && await t.rows(k) === 0, [show(a), show(b)]);
		},
	},
	{
		id: 'replay-binary', title: 'a body that is not UTF-8 and has a NUL is stored and replayed exactly',
		async run(t, check) {
			const k = t.key('bin');
			const b1 = await t.post({ key: k, body: { amount: '8.00', binary: true } });
			const b2 = await t.post({ key: k, body: { amount: '8.00', binary: true } });
			const b64 = (await t.query("SELECT response ? 'body_base64' AS b FROM idempotency.idempotency_key WHERE key = $1",
				[k])).rows.map(x => x.b);
			check('a body that is not UTF-8 and has a NUL: stored as body_base64, replayed byte for byte',
				b1.status === 200 && b1.body.subarray(0, 3).equals(Buffer.from([0xff, 0, 0xfe])) && !replayed(b1) &&
				replayed(b2) && same(b1, b2) && b64.length === 1 && b64[0] === true, [show(b1), show(b2), b64]);
		},
	},
	{
		id: 'mismatch', title: 'the same key with a different body is refused (422) and nothing is written',
		async run(t, check) {
			const k = t.key('mismatch');
			const a = await t.post({ key: k, body: { amount: '15.00' } });
			const r = await t.post({ key: k, body: { amount: '15.01' } });
			const again = await t.post({ key: k, body: { amount: '15.00' } });
			check('same key, different body -> 422, nothing written; the first answer still replays',
				a.status === 201 && r.status === 422 && !replayed(r) && await t.rows(k) === 1 &&
				await t.keyRows(k) === 1 && replayed(again) && same(a, again), [show(a), show(r), show(again)]);
		},
	},

	// --- duplicates at the same time ------------------------------------------------
	{
		id: 'concurrent', title: '50 identical requests at once: one effect; the others wait or get 409 with Retry-After',
		async run(t, check) {
			const k = t.key('c50');
			const all = await Promise.all(Array.from({ length: 50 }, () => t.postRetry({ key: k, body: { amount: '49.90' } })));
			const n = await t.rows(k);
			check('50 concurrent identical POSTs: exactly one business row', n === 1, n);
			check('50 concurrent identical POSTs: 50 byte-identical 201 responses, 49 marked Idempotent-Replayed',
				all.every(x => x.status === 201 && same(x, all[0])) && all.filter(replayed).length === 49,
				all.filter(x => !same(x, all[0])).slice(0, 2).map(show));
			const conflicts = all.reduce((s, x) => s + x.conflicts, 0);
			const bare = all.reduce((s, x) => s + x.no_retry_after, 0);
			check(`every 409 on the way carried Retry-After (${conflicts} 409s)`, bare === 0, bare);
			check('stored body replayed byte for byte (not re-serialized by jsonb)',
				paid.test(all[0].body.toString('utf8')) && /^\/payments\/\d+$/.test(all[0].headers.location || ''),
				show(all[0]));
		},
	},
	{
		id: 'in-flight', title: 'a duplicate while the first is in flight: 409 with Retry-After, then the replay',
		async run(t, check) {
			await t.waitFor(async () => await t.sleeping() === 0);
			const k = t.key('busy');
			const first = t.post({ key: k, body: { amount: '3.00', sleep: 1.5 } });
			const inFlight = await t.waitFor(async () => await t.sleeping() > 0);
			const r = await t.post({ key: k, body: { amount: '3.00', sleep: 1.5 } });
			check('duplicate while the first is in flight -> 409 with Retry-After',
				inFlight && r.status === 409 && /^[1-9][0-9]*$/.test(r.headers['retry-after'] || ''), show(r));
			const f = await first;
			const again = await t.post({ key: k, body: { amount: '3.00', sleep: 1.5 } });
			check('after it finished: the duplicate replays the first answer',
				f.status === 201 && replayed(again) && same(f, again) && await t.rows(k) === 1, [show(f), show(again)]);
		},
	},

	// --- answers that are not stored ---------------------------------------------------
	{
		id: 'error-resend', title: 'a handler error (500) is rolled back and not stored; the resend runs once',
		async run(t, check) {
			const k = t.key('boom');
			let r = await t.post({ key: k, body: { amount: '4.00', boom: true }, fresh: true });
			check('handler error -> 500, its insert rolled back, no key stored',
				r.status === 500 && await t.rows(k) === 0 && await t.keyRows(k) === 0, show(r));
			r = await t.post({ key: k, body: { amount: '4.00' } });
			const r2 = await t.post({ key: k, body: { amount: '4.00' } });
			check('after a 500 the key is free: a resend runs the handler (201, one row), then replays',
				r.status === 201 && !replayed(r) && replayed(r2) && same(r, r2) && await t.rows(k) === 1, [show(r), show(r2)]);
		},
	},
	{
		id: 'error-no-leak', title: 'a handler that throws more often than the pool has connections leaks none',
		async run(t, check) {
			const k = t.key('throws');
			const thrown = [];
			for (let i = 0; i < 12; i++) thrown.push((await t.post({ key: k, body: { amount: '4.50', boom: true }, fresh: true })).status);
			const r = await t.post({ key: k, body: { amount: '4.50' } });
			check('a handler that throws, 12 times (more than the pool\'s 10 clients): 500 each time, rolled back, ' +
				'and the same key then runs (201): no pooled client leaked',
				thrown.every(s => s === 500) && r.status === 201 && !replayed(r) && await t.rows(k) === 1, [thrown, show(r)]);
		},
	},
	{
		id: 'throttle', title: '429 is not stored: its insert is rolled back and the resend runs',
		async run(t, check) {
			const k = t.key('429');
			const t1 = await t.post({ key: k, body: { amount: '5.50', throttle: true } });
			const afterFirst = [await t.rows(k), await t.keyRows(k)];
			const t2 = await t.post({ key: k, body: { amount: '5.50', throttle: true } });
			const t3 = await t.post({ key: k, body: { amount: '5.50', throttle: true } });
			check('429 is not stored (its insert rolled back); the resend runs and gets 201, then replays',
				t1.status === 429 && !replayed(t1) && afterFirst[0] === 0 && afterFirst[1] === 0 &&
				t2.status === 201 && !replayed(t2) && replayed(t3) && same(t2, t3) && await t.rows(k) === 1,
				[show(t1), afterFirst, show(t2), show(t3)]);
		},
	},
	{
		id: 'stream-refused', title: 'a streamed response cannot be stored for replay: refused clearly, nothing stored',
		async run(t, check) {
			const k = t.key('stream');
			const before = t.stderr().length;
			const r = await t.post({ key: k, body: { amount: '6.50', stream: true }, fresh: true });
			// the reason, where the developer looks: the answer's body or the server's log
			await t.waitFor(async () => /stream/i.test(t.stderr().slice(before)), 2000);
			const said = r.body.toString('utf8') + '\n' + t.stderr().slice(before);
			check('{"stream": true} -> 500, its insert rolled back, no key stored, and the answer or the ' +
				'server\'s log says a streamed response cannot be stored',
				r.status === 500 && !replayed(r) && await t.rows(k) === 0 && await t.keyRows(k) === 0 &&
				/stream/i.test(said) && /(cannot|can't|not) be (stored|replayed)|not storable/i.test(said),
				[show(r), said.slice(-400)]);
			const again = await t.post({ key: k, body: { amount: '6.50', stream: true }, fresh: true });
			check('the resend is refused the same way (not a replay), still nothing written',
				again.status === 500 && !replayed(again) && await t.rows(k) === 0 && await t.keyRows(k) === 0, show(again));
		},
	},

	// --- a feature of one app ------------------------------------------------------------
	{
		id: 'raw-body', only: ['express'], title: 'Express with no body parser: the middleware reads the body itself',
		async run(t, check) {
			const k = t.key('raw');
			const r1 = await t.post({ key: k, path: '/raw', body: { amount: '1.00' } });
			const r2 = await t.post({ key: k, path: '/raw', body: { amount: '2.00' } });
			const r3 = await t.post({ key: k, path: '/raw', body: { amount: '1.00' } });
			check('Express, no body parser: same key, different body -> 422; same body -> replay',
				r1.status === 201 && r2.status === 422 && replayed(r3) && same(r1, r3), [show(r1), show(r2), show(r3)]);
		},
	},

	// --- scope --------------------------------------------------------------------------
	{
		id: 'scope-per-user', title: 'keys are scoped per user (X-User): two users\' equal keys are two requests',
		async run(t, check) {
			const k = t.key('user');
			const a = await t.post({ key: k, user: 'alice', body: { amount: '6.00' } });
			const b = await t.post({ key: k, user: 'bob', body: { amount: '6.00' } });
			const a2 = await t.post({ key: k, user: 'alice', body: { amount: '6.00' } });
			const b2 = await t.post({ key: k, user: 'bob', body: { amount: '6.01' } });
			check('scope per user: the same key from two users is two requests, each replayed to its own user only',
				a.status === 201 && b.status === 201 && !replayed(b) && !a.body.equals(b.body) &&
				replayed(a2) && same(a, a2) && b2.status === 422 && await t.rows(k) === 2, [show(a), show(b), show(a2), show(b2)]);
		},
	},

	// --- the connection path ----------------------------------------------------------------
	{
		id: 'pool-path', title: 'the request\'s transaction reaches PostgreSQL the way the mode says (PgBouncer in transaction mode, or directly)',
		async run(t, check) {
			await t.waitFor(async () => await t.sleeping() === 0);
			const k = t.key('via');
			const first = t.post({ key: k, body: { amount: '3.50', sleep: 1 } });
			await t.waitFor(async () => await t.sleeping() > 0);
			const via = (await t.query(
				"SELECT coalesce(host(client_addr), 'socket') AS via FROM pg_stat_activity WHERE state = 'active' " +
				"AND query LIKE '%pg\\_sleep%' AND pid <> pg_backend_pid() AND datname = current_database()")).rows.map(x => x.via);
			const f = await first;
			check(`the request's transaction reached PostgreSQL ${t.bouncer ? 'through PgBouncer' : 'directly over TCP'}`,
				f.status === 201 && via.length === 1 && via[0] === (t.bouncer ? 'socket' : '127.0.0.1'), [via, show(f)]);
		},
	},

	// --- load ---------------------------------------------------------------------------------
	{
		id: 'mixed', title: '200 keys, 1 to 3 concurrent copies each, declines and mismatches, 16 clients at once',
		async run(t, check) {
			const N = 200;
			const plan = Array.from({ length: N }, (_, i) => ({
				key: t.key(`m${i}`), kind: i % 10 < 7 ? 'ok' : i % 10 === 7 ? 'decline' : 'mismatch',
				copies: 1 + (i % 3), body: i % 10 === 7 ? { amount: `${i}.00`, decline: true } : { amount: `${i}.00` },
			}));
			const results = new Map();
			let next = 0, conflicts = 0;
			async function worker() {
				while (next < plan.length) {
					const p = plan[next++];
					const rs = await Promise.all(Array.from({ length: p.copies }, () => t.postRetry(p)));
					conflicts += rs.reduce((s, x) => s + x.conflicts, 0);
					if (p.kind === 'mismatch') p.mismatch = await t.post({ key: p.key, body: { amount: '999.00' } });
					rs.push(await t.post(p));
					results.set(p.key, rs);
				}
			}
			await Promise.all(Array.from({ length: 16 }, worker));
			const badStatus = plan.filter(p => {
				const want = p.kind === 'decline' ? 402 : 201;
				return results.get(p.key).some(x => x.status !== want) || (p.kind === 'mismatch' && p.mismatch.status !== 422);
			});
			check(`mixed workload over ${N} keys (${plan.reduce((s, p) => s + p.copies + 1, 0)} requests, ` +
				`${conflicts} 409s retried): 201 / 402 declined / 422 mismatched as expected`,
				badStatus.length === 0, badStatus.slice(0, 2).map(p => results.get(p.key).map(show)));
			const badReplay = plan.filter(p => {
				const rs = results.get(p.key);
				return !rs.every(x => same(x, rs[0])) || rs.filter(x => !replayed(x)).length !== 1;
			});
			check('mixed workload: every answer of a key byte-identical, all but the first marked replayed',
				badReplay.length === 0, badReplay.slice(0, 2).map(p => results.get(p.key).map(show)));
			const counts = new Map((await t.query(
				'SELECT idem_key, count(*)::int AS n FROM payment WHERE idem_key LIKE $1 GROUP BY 1', [`${t.key('m')}%`])).rows
				.map(x => [x.idem_key, x.n]));
			const badRows = plan.filter(p => (counts.get(p.key) || 0) !== (p.kind === 'decline' ? 0 : 1));
			check('mixed workload: one business row per successful key, none per declined one',
				badRows.length === 0, badRows.slice(0, 5).map(p => [p.key, p.kind, counts.get(p.key)]));
		},
	},

	// --- phases: POST /transfers (debit, charge downstream, finish) ----------------------------------
	{
		id: 'phases-first', title: 'a phased request runs its phases once: 201, one debit, one charge downstream, one finish, stored',
		async run(t, check) {
			const k = t.key('pfirst');
			const m = t.downstream.mark();
			const r = await transfer(t, k, { amount: '12.50' });
			const id = done('12.50').exec(r.body.toString('utf8'));
			const calls = t.downstream.since(m);
			check('201, application/json, body exactly {"status":"done","charge_id":"<the downstream\'s>","amount":"12.50"}',
				r.status === 201 && !replayed(r) && json.test(r.headers['content-type'] || '') && id !== null &&
				calls.length === 1 && id[1] === calls[0].charge_id, [show(r), calls]);
			const steps = await t.steps(k);
			check('one \'debit\' and one \'finish\' row for the key', steps.debit === 1 && steps.finish === 1 && steps.other === 0, steps);
			const want = await chargeKey(t, k);
			check('one downstream call, its Idempotency-Key derive_key(key, \'charge\', scope), its body the amount, ' +
				'and no transaction held open while it ran (an external phase)',
				calls.length === 1 && calls[0].key === want && calls[0].amount === '12.50' && calls[0].openTx === 0, [calls, want]);
			const stored = (await t.query('SELECT status, (response->>\'status\')::int AS s FROM idempotency.idempotency_key ' +
				'WHERE key = $1', [k])).rows;
			check('the key is stored once, completed, with status 201',
				stored.length === 1 && stored[0].status === 'completed' && stored[0].s === 201, stored);
		},
	},
	{
		id: 'phases-replay', title: 'a phased request resent: the stored answer byte for byte, no phase runs again',
		async run(t, check) {
			const k = t.key('preplay');
			const m = t.downstream.mark();
			const a = await transfer(t, k, { amount: '13.50' });
			const b = await transfer(t, k, { amount: '13.50' });
			const c = await transfer(t, k, { amount: '13.50' }, { fresh: true });
			const steps = await t.steps(k);
			const calls = t.downstream.since(m);
			check('resent twice: status, body, Content-Type byte-identical, Idempotent-Replayed: true; ' +
				'still one debit, one finish, one downstream call',
				a.status === 201 && done('13.50').test(a.body.toString('utf8')) && !replayed(a) && replayed(b) && replayed(c) &&
				same(a, b) && same(a, c) && steps.debit === 1 && steps.finish === 1 && calls.length === 1,
				[show(a), show(b), show(c), steps, calls.length]);
		},
	},
	{
		id: 'phases-crash-charge', title: 'the process dies after the downstream answered, before the charge checkpoint: ' +
			'the resend calls downstream again with the same key and finishes once',
		async run(t, check) { await crashed(t, check, 'charge'); },
	},
	{
		id: 'phases-crash-finish', title: 'the process dies at the start of the last phase: the resend resumes there, ' +
			'downstream is not called again',
		async run(t, check) { await crashed(t, check, 'finish'); },
	},
	{
		id: 'phases-mismatch', title: 'a phased request\'s key with a different body is refused (422), nothing runs',
		async run(t, check) {
			const k = t.key('pmismatch');
			const m = t.downstream.mark();
			const a = await transfer(t, k, { amount: '14.50' });
			const r = await transfer(t, k, { amount: '14.51' });
			const again = await transfer(t, k, { amount: '14.50' });
			const steps = await t.steps(k);
			check('same key, different body -> 422, no phase ran (one debit, one finish, one downstream call); ' +
				'the first answer still replays',
				a.status === 201 && r.status === 422 && !replayed(r) && steps.debit === 1 && steps.finish === 1 &&
				t.downstream.since(m).length === 1 && replayed(again) && same(a, again), [show(a), show(r), show(again), steps]);
		},
	},
	{
		id: 'phases-busy', title: 'a duplicate while a phase holds the key: 409 with Retry-After, then the replay',
		async run(t, check) {
			await t.waitFor(async () => await t.sleeping() === 0);
			const k = t.key('pbusy');
			const first = transfer(t, k, { amount: '15.50', sleep: 1.5 });
			const inFlight = await t.waitFor(async () => await t.sleeping() > 0);
			const r = await transfer(t, k, { amount: '15.50', sleep: 1.5 });
			check('duplicate while the debit phase sleeps -> 409 with Retry-After',
				inFlight && r.status === 409 && !replayed(r) && /^[1-9][0-9]*$/.test(r.headers['retry-after'] || ''), show(r));
			const f = await first;
			const again = await transfer(t, k, { amount: '15.50', sleep: 1.5 });
			const steps = await t.steps(k);
			check('after it finished: the duplicate replays the first answer; one debit, one finish',
				f.status === 201 && replayed(again) && same(f, again) && steps.debit === 1 && steps.finish === 1,
				[show(f), show(again), steps]);
		},
	},
	{
		id: 'phases-decline', title: 'a permanent phase error (decline) is a stored 402, replayed; nothing of the phase committed',
		async run(t, check) {
			const k = t.key('pdecline');
			const m = t.downstream.mark();
			const a = await transfer(t, k, { amount: '16.50', decline: true });
			const b = await transfer(t, k, { amount: '16.50', decline: true });
			const steps = await t.steps(k);
			check('402 {"error":"card_declined"}, stored; the resend replays it byte for byte; no transfer_step row, ' +
				'no downstream call',
				a.status === 402 && !replayed(a) && a.body.toString('utf8') === '{"error":"card_declined"}' &&
				json.test(a.headers['content-type'] || '') && replayed(b) && same(a, b) && await t.keyRows(k) === 1 &&
				steps.debit + steps.finish + steps.other === 0 && t.downstream.since(m).length === 0, [show(a), show(b), steps]);
		},
	},

	// --- a crash ---------------------------------------------------------------------------------
	{
		id: 'killed', title: 'the server killed (SIGKILL) mid-request, restarted, the request resent: one effect',
		async run(t, check) {
			await t.waitFor(async () => await t.sleeping() === 0);
			const k = t.key('kill');
			const doomed = t.post({ key: k, body: { amount: '7.00', sleep: 1.5 } }).then(x => x, e => e);
			const started = await t.waitFor(async () => await t.sleeping() > 0);
			await t.kill();
			const lost = await doomed;
			await t.start();
			const r = await t.postRetry({ key: k, body: { amount: '7.00' } }, 200);
			const r2 = await t.post({ key: k, body: { amount: '7.00' } });
			check('server killed mid-request, request resent: 201 once, one business row',
				started && lost instanceof Error && r.status === 201 && !replayed(r) && replayed(r2) && same(r, r2) &&
				await t.rows(k) === 1, [show(lost), show(r), show(r2)]);
		},
	},
];

module.exports.helpers = { same, replayed, show, sleep };
