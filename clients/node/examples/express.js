'use strict';
// Example (and test server): POST /payments guarded by an Idempotency-Key.
// Body {"amount": "49.90"} -> 201; {"decline": true} -> 402 (stored too);
// {"sleep": s} holds the transaction s seconds; {"boom": true} fails after
// its insert (500, rolled back); {"throttle": true} -> 429 (rolled back, not
// stored) the first time a key is seen, then 201; {"binary": true} -> 200, a body that is not
// UTF-8 and has a NUL; {"stream": true} pipes a stream into the response after
// its insert, which the middleware refuses (500 Response not storable, rolled
// back).  X-User plays the authenticated user.  (test/conformance drives it.)
// Database from DATABASE_HOST/PORT/NAME/USER; prints "listening <port>".
const { Readable } = require('stream');
const express = require('express');
const pg = require('pg');
const { idempotent, idempotentPhases, PhaseError } = require('..');

const pool = new pg.Pool({
	host: process.env.DATABASE_HOST, port: Number(process.env.DATABASE_PORT),
	database: process.env.DATABASE_NAME, user: process.env.DATABASE_USER, max: 10,
});
const app = express();
const throttled = new Set();

// no body parser before this route: the middleware reads the raw body itself
// (fingerprinted by its SHA-256; the bytes are in req.rawBody)
app.post('/raw', idempotent({ pool, scope: 'raw' }), (req, res) =>
	res.status(201).json({ bytes: req.rawBody.length, n: Math.random() }));

app.use(express.json());

app.post('/payments', idempotent({ pool, scope: 'payments', user: req => req.get('x-user') }), async (req, res) => {
	const { amount, sleep, decline, boom, binary, throttle, stream } = req.body;
	if (decline) return res.status(402).json({ error: 'card_declined' });
	const { rows: [p] } = await req.db.query(
		'INSERT INTO payment (idem_key, amount) VALUES ($1, $2) RETURNING id', [req.idempotency.key, amount]);
	if (sleep) await req.db.query('SELECT pg_sleep($1)', [sleep]);
	if (boom) throw new Error('boom');
	if (throttle && !throttled.has(req.idempotency.key)) {
		throttled.add(req.idempotency.key);
		return res.status(429).set('Retry-After', '1').json({ error: 'rate_limited' });
	}
	if (stream) return Readable.from([`{"id":${p.id},`, '"streamed":true}']).pipe(res.type('application/json'));
	if (binary) return res.type('application/octet-stream').send(Buffer.concat([Buffer.from([0xff, 0, 0xfe]), Buffer.from(String(p.id))]));
	res.status(201).location(`/payments/${p.id}`).type('application/json')
		.send(`{"status":"paid","id":${p.id},"amount":${JSON.stringify(String(amount))},"note":"caf\u00e9 \u2713"}`);
});

// POST /transfers: a request that calls another system, as phases under one
// key (lease 2 s, renewed every 600 ms): debit (a transaction), charge (the
// downstream, DOWNSTREAM_URL, outside any transaction, with a key derived
// from ours), finish.  X-Crash: charge / finish exits the process there.
const crash = (req, where) => { if (req.get('x-crash') === where) process.exit(1); };
app.post('/transfers', idempotentPhases({
	pool, scope: 'transfers', user: req => req.get('x-user'), leaseMs: 2000, renewEveryMs: 600,
	phases: [
		{ name: 'debit', run: async ({ client, key, req }) => {
			if (req.body.decline) throw new PhaseError('card declined', { permanent: true, status: 402, body: { error: 'card_declined' } });
			await client.query("INSERT INTO transfer_step (idem_key, step) VALUES ($1, 'debit')", [key]);
			if (req.body.sleep) await client.query('SELECT pg_sleep($1)', [req.body.sleep]);
			return { debited: req.body.amount };
		} },
		{ name: 'charge', external: true, run: async ({ deriveKey, req }) => {
			const r = await fetch(`${process.env.DOWNSTREAM_URL}/charge`, { method: 'POST',
				headers: { 'Content-Type': 'application/json', 'Idempotency-Key': await deriveKey('charge') },
				body: JSON.stringify({ amount: req.body.amount }) });
			if (!r.ok) throw new Error(`downstream answered ${r.status}`);
			const charge = await r.json();
			crash(req, 'charge');
			return charge;
		} },
		{ name: 'finish', run: async ({ client, key, req }) => {
			crash(req, 'finish');
			await client.query("INSERT INTO transfer_step (idem_key, step) VALUES ($1, 'finish')", [key]);
		} },
	],
	response: (state, req) => ({ status: 201, body: { status: 'done', charge_id: state.charge.charge_id, amount: req.body.amount } }),
}));

const server = app.listen(Number(process.env.PORT || 0), '127.0.0.1', () =>
	console.log(`listening ${server.address().port}`));
