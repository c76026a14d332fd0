'use strict';
// test/recovery/app.js: the shop's payment endpoint in Node, as a real
// process: POST /payments (Idempotency-Key header, {"amount": n}) runs
// order -> charge -> record -> receipt with runPhases() (pg-idempotency).
// KILL_AT=<boundary> makes the process SIGKILL itself at that boundary:
// (begin), order, charge:called (the processor charged, no checkpoint yet),
// charge, record, (complete) (stored, not yet answered).  SLOW_CHARGE_MS
// makes the charge phase take that long (longer than the lease: renewal).
const http = require('http');
const path = require('path');
const ROOT = path.resolve(__dirname, '../..');
const { Pool } = require(path.join(ROOT, 'clients/node/node_modules/pg'));
const { runPhases } = require(path.join(ROOT, 'clients/node'));

const KILL_AT = process.env.KILL_AT || '';
const SLOW_CHARGE_MS = Number(process.env.SLOW_CHARGE_MS || 0);	// a charge slower than the lease
const PROCESSOR = process.env.PROCESSOR_URL;
const pool = new Pool({ max: 4 });
const die = at => { if (KILL_AT === at) process.kill(process.pid, 'SIGKILL'); };

async function charge(ctx) {
	if (SLOW_CHARGE_MS) await new Promise(r => setTimeout(r, SLOW_CHARGE_MS));
	const res = await fetch(`${PROCESSOR}/charges`, {
		method: 'POST',
		headers: { 'Content-Type': 'application/json', 'Idempotency-Key': await ctx.deriveKey('charge') },
		body: JSON.stringify({ amount: ctx.state.order.amount, request: ctx.key }),
		signal: ctx.signal,
	});
	if (!res.ok) throw new Error(`processor answered ${res.status}`);
	const ch = await res.json();
	die('charge:called');
	return { id: ch.id };
}

const phases = [
	{ name: 'order', run: async ({ client, key, request }) => {
		const r = await client.query('INSERT INTO shop_order (idem_key, amount) VALUES ($1, $2) RETURNING id, amount',
			[key, request.amount]);
		return { id: Number(r.rows[0].id), amount: r.rows[0].amount };
	} },
	{ name: 'charge', external: true, run: charge },
	{ name: 'record', run: async ({ client, state, key }) => {
		await client.query('INSERT INTO shop_charge (idem_key, order_id, charge_id) VALUES ($1, $2, $3)',
			[key, state.order.id, state.charge.id]);
		return true;
	} },
	{ name: 'receipt', run: async ({ client, state, key }) => {
		await client.query('INSERT INTO shop_receipt (idem_key, order_id, charge_id) VALUES ($1, $2, $3)',
			[key, state.order.id, state.charge.id]);
		return true;
	} },
];
const server = http.createServer((req, res) => {
	let body = '';
	req.on('data', c => { body += c; });
	req.on('end', async () => {
		const send = (status, obj, headers = {}) => {
			res.writeHead(status, { 'Content-Type': 'application/json', ...headers });
			res.end(JSON.stringify(obj));
		};
		const key = req.headers['idempotency-key'];
		if (req.method !== 'POST' || req.url !== '/payments' || !key) return send(400, { error: 'bad request' });
		const input = JSON.parse(body || '{}');
		try {
			const r = await runPhases(pool, {
				key, scope: 'payments', request: input, lease: 1000, renewEvery: 300, phases,
				// the exact bytes to answer with, stored as text (jsonb would
				// reorder an object's keys: a replay must send the same bytes)
				response: s => ({ status: 201, body: JSON.stringify({ order: s.order.id, charge: s.charge.id,
					amount: s.order.amount }) }),
				hooks: { afterCommit: die },
			});
			if (r.status === 'failed') return send(500, r.response);
			res.writeHead(r.response.status, { 'Content-Type': 'application/json',
				...(r.outcome === 'replay' ? { 'Idempotent-Replayed': 'true' } : {}) });
			res.end(r.response.body);
		} catch (err) {
			if (err.code === 'IK002') return send(409, { error: err.message }, { 'Retry-After': '1' });
			if (err.code === 'IK001') return send(422, { error: err.message });
			send(500, { error: String(err.message) });
		}
	});
});
server.listen(0, '127.0.0.1', () => console.log(`listening ${server.address().port}`));
