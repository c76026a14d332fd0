'use strict';
// test/conformance/harness.js: the scenarios of scenarios.js against one
// example app in one mode.
//
//   node harness.js APP MODE -- COMMAND [ARGS...]
//
// Starts COMMAND (test/conformance/apps/APP.sh: it reads DATABASE_HOST/PORT/
// NAME/USER and IDEMPOTENCY_BOUNCER from the environment, listens on
// 127.0.0.1:$PORT with PORT=0 and prints "listening <port>"), runs every
// scenario that applies to APP over real HTTP and checks the database
// directly (PGHOST/PGPORT, DATABASE_NAME: the cluster, never the pooler).
// Prints one line per check, "ok - [APP MODE] <scenario>: <check>" or
// "not ok - ..." (test/conformance/run numbers them).  A scenario named for
// APP in test/conformance/exceptions still runs: while it fails it prints
// one "ok - ... # SKIP documented exception: <reason>"; once it passes,
// "not ok - ...: passes, remove its exception", so the list cannot go stale.
// The server is killed on every exit path.
//
// The fake downstream (a payment provider the /transfers phases call): an
// HTTP server in this process on 127.0.0.1, passed to the app as
// DOWNSTREAM_URL.  POST /charge {"amount": x} with an Idempotency-Key ->
// 200 {"charge_id":"ch_N"}: a new N per new key, the same charge_id for a
// key seen before; every call is logged ({key, amount, charge_id, openTx:
// the sessions of the database idle in a transaction while it was
// answered}), so a scenario can count the calls per key (t.downstream).
const fs = require('fs');
const path = require('path');
const http = require('http');
const { spawn } = require('child_process');
const pg = require(path.join(__dirname, '../../clients/node/node_modules/pg'));
const scenarios = require('./scenarios');
const { sleep } = scenarios.helpers;

const sep = process.argv.indexOf('--');
const [app, mode] = process.argv.slice(2, sep);
const command = process.argv.slice(sep + 1);
const label = `${app} ${mode}`;
const runId = `${app}-${mode}-${process.pid}-${Date.now() % 100000}`;
const db = new pg.Pool({ database: process.env.DATABASE_NAME, max: 2 });
// An idle kept-alive socket is dropped after 2 s, before any example server
// closes it (Node and uvicorn after 5 s): a request sent on a socket the
// server is closing at that moment fails with "socket hang up"/ECONNRESET
// (seen on a loaded machine).  (timeout also makes an in-flight request emit
// 'timeout' after 2 s idle, which nobody listens to: it is not aborted.)
const agent = new http.Agent({ keepAlive: true, maxSockets: 100, timeout: 2000 });
const children = new Set();
let failures = 0;
let srv = null;	// the running server: {child, port, stderr()}
let lastStderr = '';

// --- the fake downstream ---------------------------------------------------------
const downstreamLog = [];	// every call: {key, amount, charge_id, openTx}
const charges = new Map();	// Idempotency-Key -> charge_id
const downstream = http.createServer((req, res) => {
	const chunks = [];
	req.on('data', c => chunks.push(c));
	req.on('end', () => {
		let body = null;
		try { body = JSON.parse(Buffer.concat(chunks).toString('utf8')); } catch (e) { /* logged as null */ }
		const key = req.headers['idempotency-key'];
		if (req.method !== 'POST' || req.url !== '/charge' || typeof key !== 'string' || key === '') {
			downstreamLog.push({ key: key === undefined ? null : key, amount: body && body.amount, charge_id: null, bad: `${req.method} ${req.url}` });
			res.writeHead(400, { 'Content-Type': 'application/json' });
			return res.end('{"error":"POST /charge with an Idempotency-Key"}');
		}
		if (!charges.has(key)) charges.set(key, `ch_${charges.size + 1}`);
		const charge_id = charges.get(key);
		const entry = { key, amount: body && body.amount, charge_id, openTx: null };
		downstreamLog.push(entry);
		// an external phase holds no transaction open while it calls: count the
		// app's sessions idle in a transaction now (the scenarios that check it
		// have one request in flight)
		db.query("SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() " +
			"AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()").then(r => { entry.openTx = r.rows[0].n; },
			() => { entry.openTx = -1; }).then(() => {
			res.writeHead(200, { 'Content-Type': 'application/json' });
			res.end(JSON.stringify({ charge_id }));
		});
	});
});
let downstreamUrl = null;
function startDownstream() {
	return new Promise((resolve, reject) => {
		downstream.once('error', reject);
		downstream.listen(0, '127.0.0.1', () => {
			downstreamUrl = `http://127.0.0.1:${downstream.address().port}`;
			resolve();
		});
	});
}

function print(ok, description, diag, directive = '') {
	if (!ok) failures++;
	console.log(`${ok ? 'ok' : 'not ok'} - [${label}] ${description}${directive}`);
	if (!ok && diag !== undefined) console.log(`# ${JSON.stringify(diag).slice(0, 600)}`);
}

// --- the exceptions list: "<app> <mode|*> <scenario> <reason...>" ------------
// (<scenario> may end in "*": every scenario whose id starts with the rest,
// e.g. "phases-*" for an app that has no POST /transfers yet)
const namesScenario = (pattern, id) => pattern === id ||
	(pattern.endsWith('*') && pattern.length > 1 && id.startsWith(pattern.slice(0, -1)));
// the list every edition shares, then (EDITION=portable in run, passed as
// CONFORMANCE_EDITION) the portable edition's own, exceptions-portable
function readExceptions() {
	const files = ['exceptions'];
	if (process.env.CONFORMANCE_EDITION === 'portable') files.push('exceptions-portable');
	const list = [];
	for (const name of files) {
		for (const [i, line] of fs.readFileSync(path.join(__dirname, name), 'utf8').split('\n').entries()) {
			if (/^\s*(#|$)/.test(line)) continue;
			const m = /^(\S+)\s+(\S+)\s+(\S+)\s+(\S.*)$/.exec(line);
			if (!m) throw new Error(`${name} line ${i + 1}: want "<app> <mode|*> <scenario> <reason>": ${line}`);
			list.push({ app: m[1], mode: m[2], scenario: m[3], reason: m[4].trim(), line: `${name}:${i + 1}` });
		}
	}
	return list;
}

// --- the server ----------------------------------------------------------------
function killAll() { for (const c of children) try { c.kill('SIGKILL'); } catch (e) { /* gone */ } }
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => { killAll(); process.exit(130); });

function startServer() {
	return new Promise((resolve, reject) => {
		const child = spawn(command[0], command.slice(1), {
			env: { ...process.env, PORT: '0', DOWNSTREAM_URL: downstreamUrl }, stdio: ['ignore', 'pipe', 'pipe'],
		});
		children.add(child);
		let out = '', err = '';
		const timer = setTimeout(() => reject(new Error(`server did not start within 120 s: ${out} ${err.slice(-2000)}`)), 120000);
		child.stdout.on('data', d => {
			out += d;
			const m = /listening (\d+)/.exec(out);
			if (m) { clearTimeout(timer); resolve({ child, port: Number(m[1]), stderr: () => err }); }
		});
		child.stderr.on('data', d => { err += d; if (err.length > 200000) err = err.slice(-100000); lastStderr = err; });
		child.on('exit', code => { children.delete(child); clearTimeout(timer); reject(new Error(`server exited ${code}: ${err.slice(-2000)}`)); });
	});
}

function stopServer(s) {
	return new Promise(resolve => {
		if (!s || s.child.exitCode !== null || s.child.signalCode !== null) return resolve();
		s.child.once('exit', () => resolve());
		s.child.kill('SIGKILL');
	});
}
const alive = s => s && s.child.exitCode === null && s.child.signalCode === null;

// --- HTTP ------------------------------------------------------------------------
// post(): one request (fresh: on a new connection, not a kept-alive one,
// which a server may close after its 500; headers: extra request headers);
// resolves {status, headers, body (Buffer)} or rejects
function post({ key, body, user, path: p = '/payments', fresh = false, headers: extra = {} }) {
	const payload = Buffer.from(JSON.stringify(body), 'utf8');
	const headers = { ...extra, 'Content-Type': 'application/json', 'Content-Length': payload.length };
	if (key !== undefined) headers['Idempotency-Key'] = key;
	if (user !== undefined) headers['X-User'] = user;
	return new Promise((resolve, reject) => {
		const req = http.request({ host: '127.0.0.1', port: srv.port, path: p, method: 'POST', headers, agent: fresh ? false : agent }, res => {
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

// postRetry(): what a well-behaved client does with 409: wait and resend.
// Retry-After is honoured up to 100 ms, to keep the suite fast; a 409
// without one is counted (no_retry_after) and waited for 100 ms.
async function postRetry(opts, tries = 100) {
	let conflicts = 0, bare = 0;
	for (;;) {
		const r = await post(opts);
		if (r.status !== 409 || --tries <= 0) { r.conflicts = conflicts; r.no_retry_after = bare; return r; }
		conflicts++;
		if (!/^[0-9]+$/.test(r.headers['retry-after'] || '')) bare++;
		await sleep(Math.min(100, 1000 * Number(r.headers['retry-after'] || 1)));
	}
}

async function query(sql, params) { return db.query(sql, params); }
async function count(sql, params) { return Number((await db.query(sql, params)).rows[0].count); }
async function waitFor(cond, ms = 15000) {
	const end = Date.now() + ms;
	while (Date.now() < end) { if (await cond()) return true; await sleep(20); }
	return false;
}

function context(scenario) {
	return {
		app, mode, bouncer: process.env.IDEMPOTENCY_BOUNCER === '1',
		key: name => `${runId}-${scenario.id}-${name}`,
		post, postRetry, query, waitFor,
		rows: key => count('SELECT count(*) FROM payment WHERE idem_key = $1', [key]),
		// the /transfers phases' rows of a key: {debit: n, finish: n, other: n}
		steps: async key => {
			const n = { debit: 0, finish: 0, other: 0 };
			for (const r of (await db.query('SELECT step, count(*)::int AS n FROM transfer_step WHERE idem_key = $1 GROUP BY 1', [key])).rows)
				n[r.step in n && r.step !== 'other' ? r.step : 'other'] += r.n;
			return n;
		},
		// the fake downstream: t.downstream.mark() -> a position in its log;
		// t.downstream.since(mark) -> the calls after it [{key, amount, charge_id}]
		downstream: {
			url: () => downstreamUrl,
			mark: () => downstreamLog.length,
			since: m => downstreamLog.slice(m),
		},
		keyRows: key => count('SELECT count(*) FROM idempotency.idempotency_key WHERE key = $1', [key]),
		// a positive signal that a request is inside its transaction: its pg_sleep
		sleeping: () => count("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' " +
			"AND query LIKE '%pg\\_sleep%' AND pid <> pg_backend_pid() AND datname = current_database()"),
		kill: async () => { await stopServer(srv); },
		// the server process exited by itself within ms (an X-Crash)
		exited: (ms = 5000) => waitFor(async () => !alive(srv), ms),
		start: async () => { srv = await startServer(); },
		stderr: () => srv.stderr(),
	};
}

// one scenario: its checks, or (an exception) one line for all of them
async function runScenario(s, exception) {
	const results = [];
	const check = (description, ok, diag) => results.push({ description, ok: Boolean(ok), diag });
	let timer;
	try {
		if (!alive(srv)) {
			print(false, `${s.id}: the server was running before it (restarted)`, lastStderr.slice(-600));
			srv = await startServer();
		}
		await Promise.race([s.run(context(s), check), new Promise((_, reject) => {
			timer = setTimeout(() => reject(new Error('did not finish within 90 s')), 90000);
		})]);
	} catch (err) {
		results.push({ description: `completed (${err && err.stack ? err.stack.split('\n').slice(0, 3).join(' | ') : err})`, ok: false });
		// its requests may still be running: the next scenario gets a fresh server
		await stopServer(srv);
		srv = await startServer();
	} finally {
		clearTimeout(timer);
	}
	if (results.length === 0) results.push({ description: 'made a check', ok: false });
	if (exception) {
		const failed = results.filter(r => !r.ok);
		if (failed.length) {
			print(true, `${s.id}: ${s.title}`, undefined,
				` # SKIP documented exception (test/conformance/${exception.line}): ${exception.reason}` +
				` [fails: ${failed.map(r => r.description).join('; ').slice(0, 300)}]`);
		} else {
			print(false, `${s.id}: passes, but test/conformance/${exception.line} lists it as an exception: remove the line`);
		}
		return;
	}
	for (const r of results) print(r.ok, `${s.id}: ${r.description}`, r.diag);
}

async function main() {
	const exceptions = readExceptions();
	const ids = new Set(scenarios.map(s => s.id));
	for (const e of exceptions) {
		if (![...ids].some(id => namesScenario(e.scenario, id)))
			print(false, `test/conformance/${e.line} names no scenario: ${e.scenario}`);
	}
	await startDownstream();
	srv = await startServer();
	for (const s of scenarios) {
		if (s.only && !s.only.includes(app)) continue;
		const exception = exceptions.find(e => e.app === app && (e.mode === '*' || e.mode === mode) && namesScenario(e.scenario, s.id));
		await runScenario(s, exception);
	}
	await stopServer(srv);
}

// a hung run fails instead of hanging the suite
const deadline = setTimeout(() => {
	print(false, 'the run finished within 600 s');
	process.exit(1);
}, 600000);

main().then(async () => {
	clearTimeout(deadline);
	if (failures) console.log(`# server stderr: ${lastStderr.slice(-3000).replace(/\n/g, '\n# ')}`);
	await db.end();
	downstream.close();
	process.exit(failures ? 1 : 0);
}, err => {
	print(false, `run completed (${err && err.stack ? err.stack.split('\n').slice(0, 3).join(' | ') : err})`);
	console.log(`# server stderr: ${lastStderr.slice(-3000).replace(/\n/g, '\n# ')}`);
	process.exit(1);
});
