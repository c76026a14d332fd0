'use strict';
// test/clients/driver.js: one HTTP test run against one example server.
//
//   node driver.js LABEL -- COMMAND [ARGS...]
//
// Starts COMMAND (an example app from clients/; it reads DATABASE_HOST/PORT/
// NAME/USER from the environment, listens on PORT=0 and prints
// "listening <port>"), sends it real HTTP requests and checks the database
// directly (PGHOST/PGPORT: the cluster, never the pooler).  Prints one line
// per check, "ok - [LABEL] ..." or "not ok - [LABEL] ...".  The server is
// killed on every exit path.
//
// The example apps all serve POST /payments: {"amount": "x"} -> 201 with
// Location and a body naming the new payment row; {"decline": true} -> 402;
// {"sleep": s} holds the transaction; {"boom": true} -> 500 after its insert;
// {"binary": true} -> 200, application/octet-stream, bytes ff 00 fe + the id;
// {"throttle": true} -> 429 after its insert the first time the server sees
// the key, then as {"amount": ...}.  The Express example also serves POST
// /raw with no body parser before it (201, {"bytes": n, ...}).
const path = require('path');
const http = require('http');
const { spawn } = require('child_process');
const pg = require(path.join(__dirname, '../../clients/node/node_modules/pg'));

const sep = process.argv.indexOf('--');
const label = process.argv[2];
const command = process.argv.slice(sep + 1);
const prefix = `${label.replace(/\W+/g, '-')}-${process.pid}-${Date.now() % 100000}-`;
const db = new pg.Pool({ database: process.env.DATABASE_NAME, max: 2 });
// An idle kept-alive socket is dropped after 2 s, before any example server
// closes it (Node and uvicorn after 5 s): a request sent on a socket the
// server is closing at that moment fails with "socket hang up"/ECONNRESET
// (seen on a loaded machine).  (timeout also makes an in-flight request emit
// 'timeout' after 2 s idle, which nobody listens to: it is not aborted.)
const agent = new http.Agent({ keepAlive: true, maxSockets: 100, timeout: 2000 });
const children = new Set();
let failures = 0;
let lastStderr = '';	// of the last server started, for diagnostics

function check(description, ok, diag) {
	if (!ok) failures++;
	console.log(`${ok ? 'ok' : 'not ok'} - [${label}] ${description}`);
	if (!ok && diag !== undefined) console.log(`# ${JSON.stringify(diag).slice(0, 600)}`);
}

function killAll() { for (const c of children) try { c.kill('SIGKILL'); } catch (e) { /* gone */ } }
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => { killAll(); process.exit(130); });

function startServer() {
	return new Promise((resolve, reject) => {
		const child = spawn(command[0], command.slice(1), {
			env: { ...process.env, PORT: '0' }, stdio: ['ignore', 'pipe', 'pipe'],
		});
		children.add(child);
		let out = '', err = '';
		const timer = setTimeout(() => reject(new Error(`server did not start: ${out} ${err}`)), 30000);
		child.stdout.on('data', d => {
			out += d;
			const m = /listening (\d+)/.exec(out);
			if (m) { clearTimeout(timer); resolve({ child, port: Number(m[1]), stderr: () => err }); }
		});
		child.stderr.on('data', d => { err += d; if (err.length > 20000) err = err.slice(-10000); lastStderr = err; });
		child.on('exit', code => { children.delete(child); clearTimeout(timer); reject(new Error(`server exited ${code}: ${err}`)); });
	});
}

function stopServer(srv) {
	return new Promise(resolve => {
		if (srv.child.exitCode !== null || srv.child.signalCode !== null) return resolve();
		srv.child.once('exit', () => resolve());
		srv.child.kill('SIGKILL');
	});
}

// post(): one request (fresh: on a new connection, not a kept-alive one,
// which a server may close after its 500); resolves {status, headers, body (Buffer)} or rejects
function post(port, { key, body, user, path = '/payments', fresh = false }) {
	const payload = Buffer.from(JSON.stringify(body), 'utf8');
	const headers = { 'Content-Type': 'application/json', 'Content-Length': payload.length };
	if (key !== undefined) headers['Idempotency-Key'] = key;
	if (user !== undefined) headers['X-User'] = user;
	return new Promise((resolve, reject) => {
		const req = http.request({ host: '127.0.0.1', port, path, method: 'POST', headers, agent: fresh ? false : agent }, res => {
			const chunks = [];
			res.on('data', c => chunks.push(c));
			res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
			res.on('error', reject);
		});
		req.on('error', reject);
		req.setTimeout(20000, () => req.destroy(new Error('no answer within 20 s')));
		req.end(payload);
	});
}

const sleep = ms => new Promise(r => setTimeout(r, ms));

// postRetry(): what a well-behaved client does with 409: wait and resend.
// Retry-After is honoured up to 100 ms, to keep the suite fast.
async function postRetry(port, opts, tries = 100) {
	let conflicts = 0;
	for (;;) {
		const r = await post(port, opts);
		if (r.status !== 409 || --tries <= 0) { r.conflicts = conflicts; return r; }
		conflicts++;
		await sleep(Math.min(100, 1000 * Number(r.headers['retry-after'] || 1)));
	}
}

const same = (a, b) => a.status === b.status && a.body.equals(b.body) &&
	a.headers['content-type'] === b.headers['content-type'] && a.headers.location === b.headers.location;
const replayed = r => r.headers['idempotent-replayed'] === 'true';
const show = r => r && { status: r.status, headers: r.headers, body: r.body && r.body.toString() };

async function rows(key) {
	return Number((await db.query('SELECT count(*) FROM payment WHERE idem_key = $1', [key])).rows[0].count);
}
async function keyRows(key) {
	return Number((await db.query('SELECT count(*) FROM idempotency.idempotency_key WHERE key = $1', [key])).rows[0].count);
}
// a positive signal that a request is inside its transaction: its pg_sleep
async function sleeping() {
	return Number((await db.query(
		"SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%pg\\_sleep%' AND pid <> pg_backend_pid()")).rows[0].count);
}
async function waitFor(cond, ms = 15000) {
	const end = Date.now() + ms;
	while (Date.now() < end) { if (await cond()) return true; await sleep(20); }
	return false;
}

// a hung server (say, a pool deadlock) fails the run instead of hanging it
const deadline = setTimeout(() => {
	check('run finished within 120 s', false);
	process.exit(1);
}, 120000);

async function main() {
	let srv = await startServer();
	const P = prefix;
	let r;

	// --- the key header -------------------------------------------------
	r = await post(srv.port, { body: { amount: '1.00' } });
	check('missing Idempotency-Key -> 400', r.status === 400, show(r));
	r = await post(srv.port, { key: '"unterminated', body: { amount: '1.00' } });
	check('malformed structured-field key -> 400', r.status === 400, show(r));
	r = await post(srv.port, { key: 'x'.repeat(300), body: { amount: '1.00' } });
	check('key longer than 255 characters -> 400 (IK003)', r.status === 400, show(r));
	const sf = await post(srv.port, { key: `"${P}sf"`, body: { amount: '2.00' } });
	const bare = await post(srv.port, { key: `${P}sf`, body: { amount: '2.00' } });
	check('"k" (structured-field string) and bare k are one key: 201, then its replay',
		sf.status === 201 && !replayed(sf) && replayed(bare) && same(sf, bare) && await rows(`${P}sf`) === 1,
		[show(sf), show(bare)]);

	// --- 50 concurrent identical POSTs -----------------------------------
	const k50 = `${P}c50`;
	const all = await Promise.all(Array.from({ length: 50 }, () =>
		postRetry(srv.port, { key: k50, body: { amount: '49.90' } })));
	check('50 concurrent identical POSTs: exactly one business row', await rows(k50) === 1, await rows(k50));
	check('50 concurrent identical POSTs: 50 byte-identical 201 responses, 49 marked Idempotent-Replayed',
		all.every(x => x.status === 201 && same(x, all[0])) && all.filter(replayed).length === 49,
		all.filter(x => !same(x, all[0])).slice(0, 2).map(show));
	check('stored body replayed byte for byte (not re-serialized by jsonb)',
		/^\{"status":"paid","id":\d+,"amount":"49.90","note":"café ✓"\}$/.test(all[0].body.toString('utf8')) &&
		/^\/payments\/\d+$/.test(all[0].headers.location || ''), show(all[0]));

	// --- a body that is not UTF-8 and has a NUL --------------------------
	const kbin = `${P}bin`;
	const b1 = await post(srv.port, { key: kbin, body: { amount: '8.00', binary: true } });
	const b2 = await post(srv.port, { key: kbin, body: { amount: '8.00', binary: true } });
	const b64 = (await db.query("SELECT response ? 'body_base64' AS b FROM idempotency.idempotency_key WHERE key = $1",
		[kbin])).rows.map(x => x.b);
	check('a body that is not UTF-8 and has a NUL: stored as body_base64, replayed byte for byte',
		b1.status === 200 && b1.body.subarray(0, 3).equals(Buffer.from([0xff, 0, 0xfe])) && !replayed(b1) &&
		replayed(b2) && same(b1, b2) && b64.length === 1 && b64[0] === true, [show(b1), show(b2), b64]);

	// --- 422 --------------------------------------------------------------
	r = await post(srv.port, { key: k50, body: { amount: '50.00' } });
	check('same key, different body -> 422, nothing written', r.status === 422 && await rows(k50) === 1, show(r));

	// --- 409 + Retry-After while in flight ----------------------------------
	await waitFor(async () => await sleeping() === 0);
	const kb = `${P}busy`;
	const first = post(srv.port, { key: kb, body: { amount: '3.00', sleep: 1.5 } });
	const inFlight = await waitFor(async () => await sleeping() > 0);
	const via = (await db.query(
		"SELECT coalesce(host(client_addr), 'socket') AS via FROM pg_stat_activity WHERE state = 'active' " +
		"AND query LIKE '%pg\\_sleep%' AND pid <> pg_backend_pid()")).rows.map(x => x.via);
	const bouncer = process.env.IDEMPOTENCY_BOUNCER === '1';
	check(`the request's transaction reached PostgreSQL ${bouncer ? 'through PgBouncer' : 'directly over TCP'}`,
		via.length === 1 && via[0] === (bouncer ? 'socket' : '127.0.0.1'), via);
	r = await post(srv.port, { key: kb, body: { amount: '3.00', sleep: 1.5 } });
	check('duplicate while the first is in flight -> 409 with Retry-After',
		inFlight && r.status === 409 && /^[1-9][0-9]*$/.test(r.headers['retry-after'] || ''), show(r));
	const f = await first;
	r = await post(srv.port, { key: kb, body: { amount: '3.00', sleep: 1.5 } });
	check('after it finished: the duplicate replays the first answer',
		f.status === 201 && replayed(r) && same(f, r) && await rows(kb) === 1, [show(f), show(r)]);

	// --- handler error: rolled back, not stored -------------------------
	const ke = `${P}boom`;
	r = await post(srv.port, { key: ke, body: { amount: '4.00', boom: true }, fresh: true });
	check('handler error -> 500, its insert rolled back, no key stored',
		r.status === 500 && await rows(ke) === 0 && await keyRows(ke) === 0, show(r));
	r = await post(srv.port, { key: ke, body: { amount: '4.00' } });
	check('after a 500 the key is free: a resend runs the handler (201, one row)',
		r.status === 201 && !replayed(r) && await rows(ke) === 1, show(r));

	// --- a handler that throws, more times than the server's pool has clients
	const kt = `${P}throws`;
	const thrown = [];
	for (let i = 0; i < 12; i++) thrown.push((await post(srv.port, { key: kt, body: { amount: '4.50', boom: true }, fresh: true })).status);
	r = await post(srv.port, { key: kt, body: { amount: '4.50' } });
	check('a handler that throws, 12 times (more than the pool\'s 10 clients): 500 each time, rolled back, ' +
		'and the same key then runs (201): no pooled client leaked',
		thrown.every(s => s === 500) && r.status === 201 && !replayed(r) && await rows(kt) === 1, [thrown, show(r)]);

	// --- 429 is not stored: the resend runs ---------------------------------
	const k429 = `${P}429`;
	const t1 = await post(srv.port, { key: k429, body: { amount: '5.50', throttle: true } });
	const afterFirst = [await rows(k429), await keyRows(k429)];
	const t2 = await post(srv.port, { key: k429, body: { amount: '5.50', throttle: true } });
	const t3 = await post(srv.port, { key: k429, body: { amount: '5.50', throttle: true } });
	check('429 is not stored (its insert rolled back); the resend runs and gets 201, then replays',
		t1.status === 429 && !replayed(t1) && afterFirst[0] === 0 && afterFirst[1] === 0 &&
		t2.status === 201 && !replayed(t2) && replayed(t3) && same(t2, t3) && await rows(k429) === 1,
		[show(t1), afterFirst, show(t2), show(t3)]);

	// --- Express with no body parser: the middleware reads the body ---------
	if (/^express/.test(label)) {
		const kr = `${P}raw`;
		const r1 = await post(srv.port, { key: kr, path: '/raw', body: { amount: '1.00' } });
		const r2 = await post(srv.port, { key: kr, path: '/raw', body: { amount: '2.00' } });
		const r3 = await post(srv.port, { key: kr, path: '/raw', body: { amount: '1.00' } });
		check('Express, no body parser: same key, different body -> 422; same body -> replay',
			r1.status === 201 && r2.status === 422 && replayed(r3) && same(r1, r3), [show(r1), show(r2), show(r3)]);
	}

	// --- scope per user -------------------------------------------------
	const ku = `${P}user`;
	const a = await post(srv.port, { key: ku, user: 'alice', body: { amount: '6.00' } });
	const b = await post(srv.port, { key: ku, user: 'bob', body: { amount: '6.00' } });
	const a2 = await post(srv.port, { key: ku, user: 'alice', body: { amount: '6.00' } });
	check('scope per user: the same key from two users is two requests',
		a.status === 201 && b.status === 201 && !replayed(b) && !a.body.equals(b.body) &&
		replayed(a2) && same(a, a2) && await rows(ku) === 2, [show(a), show(b), show(a2)]);

	// --- mixed workload ---------------------------------------------------
	const N = 200;
	const plan = Array.from({ length: N }, (_, i) => ({
		key: `${P}m${i}`, kind: i % 10 < 7 ? 'ok' : i % 10 === 7 ? 'decline' : 'mismatch',
		copies: 1 + (i % 3), body: i % 10 === 7 ? { amount: `${i}.00`, decline: true } : { amount: `${i}.00` },
	}));
	const results = new Map();
	let next = 0, conflicts = 0;
	async function worker() {
		while (next < plan.length) {
			const p = plan[next++];
			const rs = await Promise.all(Array.from({ length: p.copies }, () => postRetry(srv.port, p)));
			conflicts += rs.reduce((s, x) => s + x.conflicts, 0);
			if (p.kind === 'mismatch') p.mismatch = await post(srv.port, { key: p.key, body: { amount: '999.00' } });
			rs.push(await post(srv.port, p));
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
	const counts = new Map((await db.query(
		'SELECT idem_key, count(*)::int AS n FROM payment WHERE idem_key LIKE $1 GROUP BY 1', [`${P}m%`])).rows
		.map(x => [x.idem_key, x.n]));
	const badRows = plan.filter(p => (counts.get(p.key) || 0) !== (p.kind === 'decline' ? 0 : 1));
	check('mixed workload: one business row per successful key, none per declined one',
		badRows.length === 0, badRows.slice(0, 5).map(p => [p.key, p.kind, counts.get(p.key)]));

	// --- the server killed mid-request ------------------------------------
	await waitFor(async () => await sleeping() === 0);
	const kk = `${P}kill`;
	const doomed = post(srv.port, { key: kk, body: { amount: '7.00', sleep: 1.5 } }).then(x => x, e => e);
	const started = await waitFor(async () => await sleeping() > 0);
	await stopServer(srv);
	const lost = await doomed;
	srv = await startServer();
	r = await postRetry(srv.port, { key: kk, body: { amount: '7.00' } }, 200);
	const r2 = await post(srv.port, { key: kk, body: { amount: '7.00' } });
	check('server killed mid-request, request resent: 201 once, one business row',
		started && lost instanceof Error && r.status === 201 && !replayed(r) && replayed(r2) && same(r, r2) &&
		await rows(kk) === 1, [String(lost), show(r), show(r2)]);

	await stopServer(srv);
}

main().then(async () => {
	clearTimeout(deadline);
	if (failures) console.log(`# server stderr: ${lastStderr.slice(-3000).replace(/\n/g, '\n# ')}`);
	await db.end();
	process.exit(failures ? 1 : 0);
}, err => {
	check(`run completed (${err && err.stack ? err.stack.split('\n').slice(0, 3).join(' | ') : err})`, false);
	console.log(`# server stderr: ${lastStderr.slice(-3000).replace(/\n/g, '\n# ')}`);
	process.exit(1);
});
