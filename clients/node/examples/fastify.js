'use strict';
// Example (and test server): the Express example's POST /payments on Fastify
// ({"stream": true}: a stream as the reply, refused with 500 Response not
// storable and rolled back), and its POST /transfers (phases: debit, the
// downstream charge, finish) with idempotentPhasesFastify.
// test/conformance drives it.
const { Readable } = require('stream');
const Fastify = require('fastify');
const pg = require('pg');
const { idempotentFastify, idempotentPhasesFastify, PhaseError } = require('..');

const pool = new pg.Pool({
	host: process.env.DATABASE_HOST, port: Number(process.env.DATABASE_PORT),
	database: process.env.DATABASE_NAME, user: process.env.DATABASE_USER, max: 10,
});
const app = Fastify();
const throttled = new Set();

app.post('/payments', idempotentFastify({ pool, scope: 'payments', user: req => req.headers['x-user'] }), async (req, reply) => {
	const { amount, sleep, decline, boom, binary, throttle, stream } = req.body;
	if (decline) return reply.code(402).send({ error: 'card_declined' });
	const { rows: [p] } = await req.db.query(
		'INSERT INTO payment (idem_key, amount) VALUES ($1, $2) RETURNING id', [req.idempotency.key, amount]);
	if (sleep) await req.db.query('SELECT pg_sleep($1)', [sleep]);
	if (boom) throw new Error('boom');
	if (throttle && !throttled.has(req.idempotency.key)) {
		throttled.add(req.idempotency.key);
		return reply.code(429).header('Retry-After', '1').send({ error: 'rate_limited' });
	}
	if (stream) return reply.type('application/json').send(Readable.from([`{"id":${p.id},`, '"streamed":true}']));
	if (binary) return reply.type('application/octet-stream').send(Buffer.concat([Buffer.from([0xff, 0, 0xfe]), Buffer.from(String(p.id))]));
	reply.code(201).header('Location', `/payments/${p.id}`).type('application/json');
	return `{"status":"paid","id":${p.id},"amount":${JSON.stringify(String(amount))},"note":"caf\u00e9 \u2713"}`;
});

// POST /transfers: debit (a transaction), charge (DOWNSTREAM_URL, outside
// any transaction, with a key derived from ours), finish; lease 2 s, renewed
// every 600 ms.  X-Crash: charge / finish exits the process there.
const crash = (req, where) => { if (req.headers['x-crash'] === where) process.exit(1); };
app.post('/transfers', idempotentPhasesFastify({
	pool, scope: 'transfers', user: req => req.headers['x-user'], leaseMs: 2000, renewEveryMs: 600,
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

app.listen({ port: Number(process.env.PORT || 0), host: '127.0.0.1' }).then(() =>
	console.log(`listening ${app.server.address().port}`));
