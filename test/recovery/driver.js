'use strict';
// test/recovery/driver.js: the phase-kill suite.  For each application
// (Node, Python) and each phase boundary, start the app with KILL_AT set,
// send a payment, see the process die by SIGKILL, start a fresh app, resend
// the same request until the lapsed lease lets it through, resend once more,
// and check:
//   - the final answer is 201 and identical across resends (the last one
//     a replay),
//   - every database phase committed exactly once (order, charge record,
//     receipt rows for the request),
//   - the processor created exactly one charge for the request.
// Prints "ok N - ..." / "not ok N - ..." lines.
//   node driver.js <processor-url> <label>=<command> ...
const { spawn } = require('child_process');
const path = require('path');
const ROOT = path.resolve(__dirname, '../..');
const { Pool } = require(path.join(ROOT, 'clients/node/node_modules/pg'));

const PROCESSOR = process.argv[2];
const APPS = process.argv.slice(3).map(a => {
	const i = a.indexOf('=');
	return { label: a.slice(0, i), argv: a.slice(i + 1).split(' ') };
});
const BOUNDARIES = ['', '(begin)', 'order', 'charge:called', 'charge', 'record', '(complete)'];

let n = 0;
let failed = 0;
function check(ok, what, extra) {
	n++;
	if (!ok) failed++;
	console.log(`${ok ? 'ok' : 'not ok'} ${n} - ${what}`);
	if (!ok && extra !== undefined) console.log(`# ${JSON.stringify(extra)}`);
}
const sleep = ms => new Promise(r => setTimeout(r, ms));

function startApp(app, killAt, extraEnv = {}) {
	return new Promise((resolve, reject) => {
		const child = spawn(app.argv[0], app.argv.slice(1), {
			env: { ...process.env, KILL_AT: killAt, PROCESSOR_URL: PROCESSOR, ...extraEnv },
			stdio: ['ignore', 'pipe', 'pipe'],
		});
		let out = '';
		let err = '';
		const exited = new Promise(r => child.on('exit', (code, signal) => r({ code, signal })));
		child.stderr.on('data', d => { err += d; });
		child.stdout.on('data', d => {
			out += d;
			const m = /listening (\d+)/.exec(out);
			if (m) resolve({ child, port: Number(m[1]), exited, stderr: () => err });
		});
		exited.then(x => reject(new Error(`app exited before listening: ${JSON.stringify(x)} ${err}`)));
	});
}

async function post(port, key) {
	try {
		const res = await fetch(`http://127.0.0.1:${port}/payments`, {
			method: 'POST',
			headers: { 'Content-Type': 'application/json', 'Idempotency-Key': key },
			body: JSON.stringify({ amount: 30 }),
		});
		return { status: res.status, body: await res.text(), replayed: res.headers.get('idempotent-replayed') === 'true' };
	} catch (e) {
		return { error: String(e.cause && e.cause.code || e.message) };
	}
}

// resend until the lapsed lease lets it through (409 meanwhile)
async function resend(port, key) {
	const deadline = Date.now() + 15000;
	for (;;) {
		const r = await post(port, key);
		if (r.status !== 409 || Date.now() > deadline) return r;
		await sleep(200);
	}
}

async function main() {
	const pool = new Pool({ max: 2 });
	const stats = async () => (await fetch(`${PROCESSOR}/stats`)).json();
	const t0 = Date.now();
	for (const app of APPS) {
		// the asyncio app runs the same steps as app.py's sync helper, written
		// again for asyncio; uvicorn starts slowly, so it gets the boundaries
		// that differ most (before the first phase, mid-phase after the
		// external call, after complete) and the slow phase
		const boundaries = app.label === 'python-async' ? ['', '(begin)', 'charge:called', '(complete)'] : BOUNDARIES;
		for (const killAt of boundaries) {
			const key = `${app.label}-${killAt || 'none'}`;
			const what = `[${app.label}] killed at ${killAt || '(nowhere)'}:`;
			let first;
			let a = await startApp(app, killAt);
			first = await post(a.port, key);
			if (killAt) {
				const x = await a.exited;
				check(x.signal === 'SIGKILL' && first.error !== undefined,
					`${what} the app died by SIGKILL and the request got no answer`, { x, first, stderr: a.stderr() });
				a = await startApp(app, '');
			}
			const r1 = killAt ? await resend(a.port, key) : first;
			const r2 = await post(a.port, key);
			a.child.kill('SIGTERM');
			await a.exited;
			check(r1.status === 201 && !!r1.body && r2.status === 201 && r2.body === r1.body && r2.replayed,
				`${what} 201, and a resend replays the same bytes`, { r1, r2, stderr: a.stderr() });
			const c = (await pool.query(
				`SELECT (SELECT count(*) FROM shop_order WHERE idem_key = $1)::int AS orders,
				        (SELECT count(*) FROM shop_charge WHERE idem_key = $1)::int AS charges,
				        (SELECT count(*) FROM shop_receipt WHERE idem_key = $1)::int AS receipts,
				        (SELECT status FROM idempotency.idempotency_key WHERE key = $1 AND scope = 'payments') AS status`,
				[key])).rows[0];
			check(c.orders === 1 && c.charges === 1 && c.receipts === 1 && c.status === 'completed',
				`${what} every database phase committed once`, c);
			const s = await stats();
			check(s.byRequest[key] === 1, `${what} the processor charged once`, { charges: s.byRequest[key] });
			const body = r1.body ? JSON.parse(r1.body) : {};
			const ch = (await pool.query('SELECT charge_id FROM shop_charge WHERE idem_key = $1', [key])).rows;
			check(ch.length === 1 && body.charge === ch[0].charge_id,
				`${what} the answer names the charge that was recorded`, { body, ch });
		}
	}
	// a phase slower than the lease (2.5 s against 1 s): the helper renews the
	// lease while it runs, so a duplicate sent meanwhile is told to wait (409)
	// instead of taking the key over and charging a second time
	for (const app of APPS) {
		const key = `${app.label}-slow`;
		const what = `[${app.label}] a charge slower than the lease:`;
		const a = await startApp(app, '', { SLOW_CHARGE_MS: '2500' });
		const firstP = post(a.port, key);
		await sleep(1600);
		const dup = await post(a.port, key);
		const first = await firstP;
		const again = await post(a.port, key);
		a.child.kill('SIGTERM');
		await a.exited;
		check(dup.status === 409, `${what} a duplicate during the phase gets 409 (the lease was renewed)`, dup);
		check(first.status === 201 && again.status === 201 && again.body === first.body && again.replayed,
			`${what} the request completes, and a resend replays it`, { first, again });
		const s = await stats();
		const c = (await pool.query(
			`SELECT (SELECT count(*) FROM shop_order WHERE idem_key = $1)::int AS orders,
			        (SELECT attempts FROM idempotency.idempotency_key WHERE key = $1 AND scope = 'payments') AS attempts`,
			[key])).rows[0];
		check(s.byRequest[key] === 1 && c.orders === 1 && c.attempts === 1,
			`${what} one attempt, one order, one charge`, { charges: s.byRequest[key], c });
	}
	await pool.end();
	console.log(`# ${n} checks in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
	process.exit(failed ? 1 : 0);
}
main().catch(e => { console.log(`not ok ${n + 1} - driver: ${e.stack}`); process.exit(1); });
