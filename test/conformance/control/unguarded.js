'use strict';
// test/conformance/control/unguarded.js: the negative control.  The Express
// example's POST /payments (every body flag of the contract) WITHOUT the
// guard: no key check, no transaction (each statement commits on its own),
// nothing stored, nothing refused, and connected over the cluster's unix
// socket (PGHOST) whatever DATABASE_HOST says.  test/conformance/run drives
// it through every scenario and requires each scenario to fail against it:
// a scenario this app passes could not catch the bug it is there for.
// Its POST /transfers is the phased endpoint of the contract without phases
// or a key (below).
const path = require('path');
const { Readable } = require('stream');
const node = path.join(__dirname, '../../../clients/node/node_modules/');
const express = require(node + 'express');
const pg = require(node + 'pg');

const pool = new pg.Pool({ database: process.env.DATABASE_NAME, max: 10 });	// PGHOST: the socket
const app = express();
const throttled = new Set();
app.use(express.json());
app.post('/payments', async (req, res) => {
	const key = String(req.get('idempotency-key'));
	const { amount, sleep, decline, boom, binary, throttle, stream } = req.body;
	if (decline) return res.status(402).json({ error: 'card_declined' });
	const { rows: [p] } = await pool.query(
		'INSERT INTO payment (idem_key, amount) VALUES ($1, $2) RETURNING id', [key, amount]);
	if (sleep) await pool.query('SELECT pg_sleep($1)', [sleep]);
	if (boom) throw new Error('boom');
	if (throttle && !throttled.has(key)) {
		throttled.add(key);
		return res.status(429).set('Retry-After', '1').json({ error: 'rate_limited' });
	}
	if (stream) return Readable.from([`{"id":${p.id},`, '"streamed":true}']).pipe(res.type('application/json'));
	if (binary) return res.type('application/octet-stream').send(Buffer.concat([Buffer.from([0xff, 0, 0xfe]), Buffer.from(String(p.id))]));
	res.status(201).location(`/payments/${p.id}`).type('application/json')
		.send(`{"status":"paid","id":${p.id},"amount":${JSON.stringify(String(amount))},"note":"caf\u00e9 \u2713"}`);
});
// POST /transfers without phases or a key: debit, charge (the request's own
// key sent downstream, not a derived one), finish, each committing on its
// own; X-Crash exits as the contract says
app.post('/transfers', async (req, res) => {
	const key = String(req.get('idempotency-key'));
	const { amount, sleep, decline } = req.body;
	if (decline) return res.status(402).json({ error: 'card_declined' });
	await pool.query("INSERT INTO transfer_step (idem_key, step) VALUES ($1, 'debit')", [key]);
	if (sleep) await pool.query('SELECT pg_sleep($1)', [sleep]);
	const r = await fetch(`${process.env.DOWNSTREAM_URL}/charge`, {
		method: 'POST', headers: { 'Content-Type': 'application/json', 'Idempotency-Key': key }, body: JSON.stringify({ amount }),
	});
	const charge = await r.json();
	if (req.get('x-crash') === 'charge' || req.get('x-crash') === 'finish') process.exit(1);
	await pool.query("INSERT INTO transfer_step (idem_key, step) VALUES ($1, 'finish')", [key]);
	res.status(201).type('application/json')
		.send(`{"status":"done","charge_id":${JSON.stringify(charge.charge_id)},"amount":${JSON.stringify(String(amount))}}`);
});

const server = app.listen(Number(process.env.PORT || 0), '127.0.0.1', () =>
	console.log(`listening ${server.address().port}`));
