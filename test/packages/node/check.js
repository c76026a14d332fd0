'use strict';
// test/packages/node/check.js: run from the fresh app directory after tsc:
// starts dist/app.js (the typed app on the installed tarball), sends it real
// HTTP requests and checks the database.  Prints "ok - ..." / "not ok - ...".
//   node check.js      (DATABASE_HOST/PORT/NAME/USER name the database)
const { spawn } = require('child_process');
const pg = require('pg');

let failures = 0;
function check(what, ok, diag) {
	if (!ok) failures++;
	console.log(`${ok ? 'ok' : 'not ok'} - [node package] ${what}`);
	if (!ok && diag !== undefined) console.log(`# ${JSON.stringify(diag).slice(0, 600)}`);
}

async function post(port, path, key, body) {
	const headers = { 'Content-Type': 'application/json' };
	if (key) headers['Idempotency-Key'] = key;
	const r = await fetch(`http://127.0.0.1:${port}${path}`, { method: 'POST', headers, body: JSON.stringify(body) });
	return { status: r.status, headers: r.headers, text: await r.text() };
}

async function main() {
	const app = spawn(process.execPath, ['dist/app.js'], { stdio: ['ignore', 'pipe', 'pipe'] });
	let err = '';
	app.stderr.on('data', d => { err += d; });
	const ports = await new Promise((resolve, reject) => {
		let out = '';
		app.stdout.on('data', d => {
			out += d;
			const m = /listening (\d+) (\d+)/.exec(out);
			if (m) resolve([Number(m[1]), Number(m[2])]);
		});
		app.on('exit', code => reject(new Error(`app exited with ${code}: ${err}`)));
		setTimeout(() => reject(new Error(`app did not start: ${err}`)), 20000);
	});
	const db = new pg.Pool({
		host: process.env.DATABASE_HOST, port: Number(process.env.DATABASE_PORT),
		database: process.env.DATABASE_NAME, user: process.env.DATABASE_USER, max: 1,
	});
	try {
		for (const [name, port] of [['express', ports[0]], ['fastify', ports[1]]]) {
			const key = `pack-${name}-${process.pid}`;
			const a = await post(port, '/payments', key, { amount: '12.50' });
			check(`${name}: a guarded request is served (201)`, a.status === 201, a);
			const b = await post(port, '/payments', key, { amount: '12.50' });
			check(`${name}: the resend replays the stored answer`,
				b.status === 201 && b.headers.get('idempotent-replayed') === 'true' && b.text === a.text, b);
			const { rows } = await db.query('SELECT count(*)::int AS n FROM payment WHERE idem_key = $1', [key]);
			check(`${name}: one payment row for two requests`, rows[0].n === 1, rows);
			const pk = `pack-phased-${name}-${process.pid}`;
			const p1 = await post(port, '/phased', pk, { amount: '3.00' });
			const p2 = await post(port, '/phased', pk, { amount: '3.00' });
			const p3 = await post(port, '/phased', pk, { amount: '3.01' });
			check(`${name}: a phased endpoint (idempotentPhases${name === 'fastify' ? 'Fastify' : ''}): 201, the replay, 422 for another body`,
				p1.status === 201 && /"3\.00"/.test(p1.text) && p2.status === 201 && p2.text === p1.text &&
				p2.headers.get('idempotent-replayed') === 'true' && p3.status === 422, [p1, p2, p3]);
			const c = await post(port, '/payments', null, { amount: '1' });
			check(`${name}: a request without a key is refused (400 problem+json)`,
				c.status === 400 && /problem\+json/.test(c.headers.get('content-type') || ''), c);
		}
	} finally {
		await db.end();
		app.kill();
	}
}

main().then(() => process.exit(failures ? 1 : 0),
	e => { check('the app runs', false, String(e && e.stack || e)); process.exit(1); });
