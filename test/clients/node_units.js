'use strict';
// test/clients/node_units.js: what a newcomer tripped on in the Node client
// against the real database; prints "ok - ..." lines.
//   - durations in milliseconds under names that carry the unit (lockWaitMs,
//     ttlMs; runPhases leaseMs, renewEveryMs, ttlMs) and the deprecated
//     0.5.0 names still working (lockWait, ttl as interval text; lease,
//     renewEvery, ttl), checked on the key rows the database wrote; the
//     relay's visibilityMs, pollIntervalMs, retryDelayMs and webhook's
//     timeoutMs, their 0.5.0 names deprecated
//   - a mismatched resend and a busy duplicate leave no request body in the
//     server log (SERVER_LOG: the cluster's log file)
//   - examples/outbox_pattern.js: a guarded handler publishing on req.db, a
//     relay, a guarded receiver (the event once), and SIGTERM -> exit < 5 s
//   - every export of index.js is documented in clients/node/README.md
//   - an extension older than the client needs: the guard, runPhases and
//     the relay refuse it, naming both versions; after ALTER EXTENSION
//     UPDATE the next request goes through; the check is one query per
//     pool (the queries of a request counted on the wire)
// DATABASE_HOST/PORT/NAME/USER name the database.
const fs = require('fs');
const path = require('path');
const root = path.join(__dirname, '../..');
const pg = require(path.join(root, 'clients/node/node_modules/pg'));
const idem = require(path.join(root, 'clients/node'));
const { Guard, runPhases } = idem;

let failures = 0;
function check(what, ok, diag) {
	if (!ok) failures++;
	console.log(`${ok ? 'ok' : 'not ok'} - [node units] ${what}`);
	if (!ok && diag !== undefined) console.log(`# ${JSON.stringify(diag).slice(0, 600)}`);
}
function throws(f) { try { f(); return null; } catch (e) { return e; } }
const run = `${process.pid}-${Date.now()}`;

async function keyRow(pool, key, scope) {
	const r = await pool.query(`SELECT extract(epoch FROM expires_at - created_at)::float8 AS ttl,
		extract(epoch FROM locked_until - clock_timestamp())::float8 AS lease, status
		FROM idempotency.idempotency_key WHERE key = $1 AND scope = $2`, [key, scope]);
	return r.rows[0];
}

async function guarded(pool, opts, key, request = { n: 1 }) {
	const g = new Guard({ pool, ...opts });
	const s = await g.start(key, opts.scope, request);
	if (s.state) await g.finish(s.state, 201, () => undefined, Buffer.from('{}'));
	return s;
}

async function outboxPattern(pool) {
	const { spawn } = require('child_process');
	const app = spawn(process.execPath, [path.join(root, 'clients/node/examples/outbox_pattern.js')],
		{ stdio: ['ignore', 'pipe', 'pipe'], env: process.env });
	let out = '';
	app.stdout.on('data', d => { out += d; });
	app.stderr.on('data', d => { out += d; });
	const exited = new Promise(resolve => app.on('exit', (code, signal) => resolve({ code, signal, at: Date.now() })));
	const port = await new Promise(resolve => {
		const t = setTimeout(() => resolve(null), 10000);
		app.stdout.on('data', () => { const m = /listening (\d+)/.exec(out); if (m) { clearTimeout(t); resolve(Number(m[1])); } });
	});
	if (!port) { check('examples/outbox_pattern.js starts', false, out); app.kill('SIGKILL'); return; }
	const key = `order-${run}`;
	const post = () => fetch(`http://127.0.0.1:${port}/orders`, { method: 'POST',
		headers: { 'content-type': 'application/json', 'idempotency-key': key }, body: JSON.stringify({ amount: '12.50' }) });
	const a = await post();
	const b = await post();
	const id = (await a.json()).id;
	let events = [];
	for (let i = 0; i < 100 && events.length === 0; i++) {
		await new Promise(r => setTimeout(r, 100));
		events = (await pool.query("SELECT message_id FROM example_order_event WHERE body->>'order' = $1", [String(id)])).rows;
	}
	await new Promise(r => setTimeout(r, 300));	// a second delivery would land by now
	events = (await pool.query("SELECT message_id FROM example_order_event WHERE body->>'order' = $1", [String(id)])).rows;
	check('outbox pattern: 201, the resend replays, the relay delivers the event once to the guarded receiver',
		a.status === 201 && b.status === 201 && b.headers.get('idempotent-replayed') === 'true' && events.length === 1,
		[a.status, b.status, events, out.slice(-300)]);
	const t0 = Date.now();
	app.kill('SIGTERM');
	// The defect was a process that lingered about 10 s (the pool's idle
	// timeout) after the relay stopped; a clean exit takes milliseconds on
	// a quiet machine and about 2 s at a load average of 20, so the bound
	// is 5 s: well apart from both.
	const timer = new Promise(resolve => setTimeout(() => resolve(null), 15000));
	const e = await Promise.race([exited, timer]);
	if (!e) app.kill('SIGKILL');
	check(`outbox pattern: SIGTERM -> the process exits cleanly within 5 s, not after the pool's 10 s idle timeout (${e ? e.at - t0 : '> 15000'} ms)`,
		e && e.code === 0 && e.at - t0 < 5000, [e, out.slice(-300)]);
}

async function main() {
	const pool = new pg.Pool({
		host: process.env.DATABASE_HOST, port: Number(process.env.DATABASE_PORT),
		database: process.env.DATABASE_NAME, user: process.env.DATABASE_USER, max: 4,
	});
	try {
		// --- the guard: lockWaitMs, ttlMs; lockWait, ttl deprecated -------------
		const base = { pool, scope: `units-${run}` };
		let g = new Guard({ ...base, lockWaitMs: 50, ttlMs: 3600000 });
		check('Guard({lockWaitMs: 50, ttlMs: 3600000}): 50 ms, an hour', g.lockWait === 50 && g.ttl === '3600000 milliseconds', [g.lockWait, g.ttl]);
		g = new Guard(base);
		check('Guard defaults: lock wait 200 ms, the server\'s ttl', g.lockWait === 200 && g.ttl === null);
		g = new Guard({ ...base, lockWait: 75, ttl: '7 days' });
		check('deprecated lockWait (ms) and ttl (interval text) still work', g.lockWait === 75 && g.ttl === '7 days');
		const both = [throws(() => new Guard({ ...base, lockWaitMs: 1, lockWait: 1 })),
			throws(() => new Guard({ ...base, ttlMs: 1, ttl: '1 day' }))];
		check('a unit-carrying name and its deprecated alias together: TypeError', both.every(e => e instanceof TypeError), both.map(String));
		const bad = [throws(() => new Guard({ ...base, lockWaitMs: '200ms' })), throws(() => new Guard({ ...base, ttlMs: -1 })),
			throws(() => new Guard({ ...base, ttlMs: Infinity }))];
		check('a duration that is not a number of ms >= 0: TypeError', bad.every(e => e instanceof TypeError), bad.map(String));

		await guarded(pool, { ...base, ttlMs: 3600000 }, `ttlms-${run}`);
		let row = await keyRow(pool, `ttlms-${run}`, base.scope);
		check('ttlMs: 3600000 -> the key lives an hour (expires_at - created_at, in the database)',
			row && Math.abs(row.ttl - 3600) < 1, row);
		await guarded(pool, { ...base, ttl: '7 days' }, `ttl-${run}`);
		row = await keyRow(pool, `ttl-${run}`, base.scope);
		check("deprecated ttl: '7 days' -> the key lives 7 days", row && Math.abs(row.ttl - 7 * 86400) < 1, row);

		// --- runPhases: leaseMs, renewEveryMs, ttlMs; lease, renewEvery, ttl -------
		const phases = [{ name: 'one', run: () => 1 }];
		for (const [label, opts] of [['leaseMs: 20000, ttlMs: 7200000', { leaseMs: 20000, ttlMs: 7200000, renewEveryMs: 60000 }],
			['deprecated lease: 20000, ttl: 7200000', { lease: 20000, ttl: 7200000, renewEvery: 60000 }]]) {
			const key = `phases-${label.split(':')[0]}-${run}`;
			let seen = null;
			const r = await runPhases(pool, { key, scope: base.scope, phases, response: () => ({ ok: true }), ...opts,
				hooks: { afterCommit: async name => { if (name === '(begin)') seen = await keyRow(pool, key, base.scope); } } });
			check(`runPhases ${label} (ms): the lease is 20 s, the key lives 2 hours (in the database)`,
				r.outcome === 'new' && seen && Math.abs(seen.lease - 20) < 2 && Math.abs(seen.ttl - 7200) < 1, seen);
		}
		const e = await runPhases(pool, { key: `both-${run}`, phases, response: () => null, leaseMs: 1, lease: 1 }).then(() => null, x => x);
		check('runPhases: leaseMs and lease together: TypeError, nothing begun',
			e instanceof TypeError && !(await keyRow(pool, `both-${run}`, '')), String(e));

		// --- relay: visibilityMs, pollIntervalMs, retryDelayMs; webhook timeoutMs;
		// their 0.5.0 names (visibility, pollInterval, retryDelay, timeout) deprecated
		const quiet = { pool, handleSignals: false, onError: () => {} };
		const r1 = idem.relay('units-relay', () => {}, { ...quiet, visibilityMs: 2000, pollIntervalMs: 300, retryDelayMs: 100 });
		const r2 = idem.relay('units-relay', () => {}, { ...quiet, visibility: 2000, pollInterval: 300, retryDelay: 100 });
		const r3 = idem.relay('units-relay', () => {}, quiet);
		await Promise.all([r1.stop(), r2.stop(), r3.stop()]);
		const durations = x => [x.opts.visibilityMs, x.opts.pollIntervalMs, x.opts.retryDelayMs];
		check('relay: visibilityMs, pollIntervalMs, retryDelayMs (ms); the deprecated visibility, pollInterval, retryDelay ' +
			'the same; defaults 30000, 5000, 1000',
			[r1, r2].every(x => String(durations(x)) === '2000,300,100') && String(durations(r3)) === '30000,5000,1000',
			[r1, r2, r3].map(durations));
		const both2 = ['visibility', 'pollInterval', 'retryDelay'].map(old =>
			throws(() => idem.relay('units-relay', () => {}, { ...quiet, [old]: 10, [`${old}Ms`]: 10 })));
		check('relay: a unit-carrying name and its deprecated alias together: TypeError', both2.every(e => e instanceof TypeError), both2.map(String));
		const silent = require('http').createServer(() => {});	// never answers
		await new Promise(r => silent.listen(0, '127.0.0.1', r));
		const url = `http://127.0.0.1:${silent.address().port}/`;
		const timed = [];
		for (const o of [{ timeoutMs: 200 }, { timeout: 200 }]) {
			const t0 = Date.now();
			const err = await idem.webhook(url, o)({ messageId: 'm', headers: {}, payload: {} }).then(() => null, x => x);
			timed.push([err && err.message, Date.now() - t0]);
		}
		silent.close();
		check('webhook: timeoutMs: 200 and the deprecated timeout: 200 give up after 200 ms',
			timed.every(([m, ms]) => /no answer in 200 ms/.test(m) && ms < 2000), timed);
		check('webhook: timeoutMs and timeout together: TypeError',
			throws(() => idem.webhook(url, { timeoutMs: 1, timeout: 1 })) instanceof TypeError);

		// --- idempotentPhases / idempotentPhasesFastify: the error paths (the
		// conformance suite has the rest) --------------------------------------
		await phasedErrors(pool);

		// --- no request body in the server log -----------------------------------
		const log = process.env.SERVER_LOG;
		const marker = `card-4111-${run}`;
		const from = log ? fs.statSync(log).size : 0;
		const scope = `log-${run}`;
		await guarded(pool, { pool, scope }, `mismatch-${run}`, { card: `${marker}-a` });
		const mm = await guarded(pool, { pool, scope }, `mismatch-${run}`, { card: `${marker}-b` });
		const g1 = new Guard({ pool, scope, lockWaitMs: 50 });
		const held = await g1.start(`busy-${run}`, scope, { card: `${marker}-c` });
		const busy = await g1.start(`busy-${run}`, scope, { card: `${marker}-c` });
		await g1.abort(held.state);
		check('a mismatched resend is 422, a busy duplicate 409',
			mm.send && mm.send.status === 422 && busy.send && busy.send.status === 409, [mm.send && mm.send.status, busy.send && busy.send.status]);
		await new Promise(r => setTimeout(r, 300));	// the logger's flush
		if (!log) { check('SERVER_LOG names the cluster log', false); return; }
		const text = fs.readFileSync(log, 'utf8').slice(from);
		const errors = text.split('\n').filter(l => /IK00[12]|STATEMENT/.test(l));
		check('the server log has the two ERRORs (IK001, IK002) and no request body in them or their statements',
			/IK001|reused|different request/i.test(text) && errors.length >= 2 && !text.includes(marker), errors.slice(0, 6));

		// --- examples/outbox_pattern.js: guarded handler + publish, relay,
		// guarded receiver, and a clean shutdown -------------------------------
		await outboxPattern(pool);

		// --- the README documents every export ------------------------------------
		const readme = fs.readFileSync(path.join(root, 'clients/node/README.md'), 'utf8');
		// claim()'s row type (0.5.0 shipped its column as attempt): what the
		// relay reads and what both READMEs name
		const cols = (await pool.query(`SELECT array_agg(attname::text ORDER BY attnum) AS c FROM pg_attribute
			WHERE attrelid = 'idempotency.outbox_claim'::regclass AND attnum > 0`)).rows[0].c;
		const pyReadme = fs.readFileSync(path.join(root, 'clients/python/README.md'), 'utf8');
		check("idempotency.outbox_claim's column is attempt, as the message field and both READMEs say",
			cols.includes('attempt') && !cols.includes('attempts') && /`attempt` \(1 on the first delivery/.test(readme) &&
			/`attempt` \(1 on the first delivery/.test(pyReadme) && /\battempt: number/.test(
				fs.readFileSync(path.join(root, 'clients/node/lib/relay.d.ts'), 'utf8')), cols);
		// (an extension's version: the portable edition installed by psql -f has none to update)
		if (process.env.IDEMPOTENCY_EDITION !== 'portable') await versions(pool);
		const missing = Object.keys(idem).filter(n => !new RegExp('`' + n + '\\b').test(readme));
		check(`clients/node/README.md documents every export of index.js (${Object.keys(idem).length})`, missing.length === 0, missing);
	} finally {
		await pool.end();
	}
}

// the compatibility rule (docs/clients.md#versions) on a database whose
// extension is 0.5.0, then updated
async function versions(admin) {
	const compat = require(path.join(root, 'clients/node/lib/compat'));
	const db = `compat_${process.pid}`;
	await admin.query(`DROP DATABASE IF EXISTS ${db}`);
	await admin.query(`CREATE DATABASE ${db}`);
	const old = new pg.Pool({ host: process.env.DATABASE_HOST, port: Number(process.env.DATABASE_PORT),
		database: db, user: process.env.DATABASE_USER, max: 2 });
	let sent = 0;
	old.on('connect', c => { const q = c.query; c.query = function (...a) { sent++; return q.apply(this, a); }; });
	try {
		await old.query("CREATE EXTENSION idempotency VERSION '0.5.0'");
		const g = new Guard({ pool: old, scope: 'compat' });
		const e1 = await g.start('k1', 'compat', { n: 1 }).then(() => null, e => e);
		const e2 = await runPhases(old, { key: 'k2', phases: [{ name: 'a', run: () => 1 }], response: () => ({}) })
			.then(() => null, e => e);
		const errs = [];
		const r = idem.relay('compat', async () => {}, { pool: old, handleSignals: false, retryDelayMs: 10000,
			onError: e => errs.push(e) });
		for (let i = 0; i < 100 && errs.length === 0; i++) await new Promise(res => setTimeout(res, 20));
		await r.stop();
		const want = 'pg-idempotency 0.6.0 needs the idempotency extension 0.6.0 or newer; this database has 0.5.0 ' +
			'(ALTER EXTENSION idempotency UPDATE; a plain install: the portable upgrade script)';
		check(`an extension older than the client: the guard, runPhases and the relay refuse it: "${want}"`,
			[e1, e2, errs[0]].every(e => e instanceof idem.ExtensionVersionError && e.message === want &&
				e.found === '0.5.0' && e.needed === idem.EXTENSION_MIN) && idem.VERSION === '0.6.0',
			[e1, e2, errs[0]].map(String));
		await old.query('ALTER EXTENSION idempotency UPDATE');
		const before = compat.versionQueries();
		const counts = [];
		for (let i = 0; i < 11; i++) {
			const at = sent;
			const s = await guarded(old, { scope: 'compat' }, `after-${i}`);
			if (!s.state) throw new Error(`request ${i}: ${JSON.stringify(s)}`);
			counts.push(sent - at);
		}
		const later = counts.slice(1);
		check(`after ALTER EXTENSION UPDATE the next request goes through; the version is asked once per pool: ` +
			`queries per request ${counts.join(' ')} (the first one more)`,
			compat.versionQueries() - before === 1 && later.every(n => n === later[0]) && counts[0] === later[0] + 1,
			{ counts, queries: compat.versionQueries() - before });
	} finally {
		await old.end();
		await admin.query(`DROP DATABASE IF EXISTS ${db}`);
	}
}

// phases "a" (a row in payment, amount 1), "b" (external: throws the first
// time a key asks, body fail_once), "c" (amount 3); the response is 503 with
// Retry-After the first time a key asks (unavailable_once), else 201
async function phasedErrors(pool) {
	const express = require(path.join(root, 'clients/node/node_modules/express'));
	const fastify = require(path.join(root, 'clients/node/node_modules/fastify'));
	const failedOnce = new Set(), unavailable = new Set();
	const opts = () => ({
		pool, scope: `ph-${run}`, leaseMs: 5000,
		phases: [
			{ name: 'a', run: async ({ client, key, req }) => {
				if (req.body.permanent) throw new idem.PhaseError('no such account', { permanent: true });
				await client.query('INSERT INTO payment (idem_key, amount) VALUES ($1, 1)', [key]);
				return { a: 1 };
			} },
			{ name: 'b', external: true, run: async ({ key, req, deriveKey }) => {
				if (req.body.fail_once && !failedOnce.has(key)) { failedOnce.add(key); throw new Error('downstream down'); }
				return { b: await deriveKey('b') };
			} },
			{ name: 'c', run: async ({ client, key }) => {
				await client.query('INSERT INTO payment (idem_key, amount) VALUES ($1, 3)', [key]);
				return { c: 3 };
			} },
		],
		response: (state, req) => {
			const key = req.headers['idempotency-key'];
			if (req.body.unavailable_once && !unavailable.has(key)) {
				unavailable.add(key);
				return { status: 503, body: { state }, headers: { 'Retry-After': '7' } };
			}
			return { status: 201, body: { state } };
		},
	});
	const app = express();
	app.use(express.json());
	app.post('/ph', idem.idempotentPhases(opts()));
	app.use((err, req, res, next) => res.status(500).json({ error: String(err.message) }));	// eslint-disable-line no-unused-vars
	const server = await new Promise(r => { const s = app.listen(0, '127.0.0.1', () => r(s)); });
	const f = fastify();
	f.post('/ph', idem.idempotentPhasesFastify(opts()));
	await f.listen({ port: 0, host: '127.0.0.1' });
	const rows = async k => Number((await pool.query('SELECT count(*) FROM payment WHERE idem_key = $1', [k])).rows[0].count);
	const status = async k => (await pool.query("SELECT coalesce(min(status || ':' || coalesce(retryable::text, '-')), 'none') AS s " +
		'FROM idempotency.idempotency_key WHERE key = $1', [k])).rows[0].s;
	try {
		for (const [label, port] of [['Express', server.address().port], ['Fastify', f.server.address().port]]) {
			const post = async (key, body, headers) => {
				const h = { 'Content-Type': 'application/json', ...(headers || (key ? { 'Idempotency-Key': key } : {})) };
				const r = await fetch(`http://127.0.0.1:${port}/ph`, { method: 'POST', headers: h, body: JSON.stringify(body) });
				return { status: r.status, headers: r.headers, text: await r.text() };
			};
			const P = `ph-${label}-${run}`;
			const none = await post(null, { n: 1 });
			const bad = await post(`${P}-bad`, { n: 1 }, { 'Idempotency-Key': '"unterminated' });
			check(`${label} idempotentPhases: no key -> 400, a malformed key -> 400 (problem+json), nothing stored`,
				none.status === 400 && bad.status === 400 && /problem\+json/.test(none.headers.get('content-type') || '') &&
				await status(`${P}-bad`) === 'none', [none, bad]);
			let k = `${P}-fail`;
			const a = await post(k, { fail_once: true });
			const after = [await rows(k), await status(k)];
			const b = await post(k, { fail_once: true });
			const c = await post(k, { fail_once: true });
			check(`${label} idempotentPhases: a phase that throws -> 500, the key failed retryably (phase a committed); ` +
				'the resend resumes after a (one a, one c), then replays',
				a.status === 500 && String(after) === '1,failed:true' && b.status === 201 && c.status === 201 &&
				c.headers.get('idempotent-replayed') === 'true' && b.text === c.text && !b.headers.get('idempotent-replayed') &&
				await rows(k) === 2 && await status(k) === 'completed:-', [a, after, b.status, c.status]);
			k = `${P}-503`;
			const u = await post(k, { unavailable_once: true });
			const uAfter = [await rows(k), await status(k)];
			const u2 = await post(k, { unavailable_once: true });
			check(`${label} idempotentPhases: a 503 answer is not stored (the last phase rolled back, the key failed ` +
				'retryably, Retry-After sent); the resend runs the last phase again: 201, one a, one c',
				u.status === 503 && u.headers.get('retry-after') === '7' && String(uAfter) === '1,failed:true' &&
				u2.status === 201 && await rows(k) === 2 && await status(k) === 'completed:-', [u.status, uAfter, u2.status]);
			k = `${P}-perm`;
			const p1 = await post(k, { permanent: true });
			const p2 = await post(k, { permanent: true });
			check(`${label} idempotentPhases: a permanent PhaseError without a status -> 400 {"error":"<message>"} ` +
				'(application/json), stored (failed, not retryable), replayed',
				p1.status === 400 && p1.text === '{"error":"no such account"}' && /application\/json/.test(p1.headers.get('content-type') || '') &&
				p2.headers.get('idempotent-replayed') === 'true' && p2.text === p1.text && await rows(k) === 0 &&
				await status(k) === 'failed:false', [p1, p2.status, await status(k)]);
		}
		const bad = [
			throws(() => idem.idempotentPhases({ pool, scope: 's', phases: [], response: () => ({ status: 201 }) })),
			throws(() => idem.idempotentPhases({ pool, scope: 's', lease: 2000, phases: opts().phases, response: () => ({ status: 201 }) })),
			throws(() => idem.idempotentPhases({ pool, scope: 's', leaseMs: '2s', phases: opts().phases, response: () => ({ status: 201 }) })),
			throws(() => idem.idempotentPhases({ pool, phases: opts().phases, response: () => ({ status: 201 }) })),
		];
		check('idempotentPhases: no phases, the unit-less lease, a leaseMs that is not a number, no scope: TypeError',
			bad.every(e => e instanceof TypeError), bad.map(String));
	} finally {
		server.close();
		await f.close();
	}
}

main().then(() => process.exit(failures ? 1 : 0), err => { console.log(`not ok - [node units] ${err.stack}`); process.exit(1); });
