'use strict';
// receiver.js PORT: the webhook receiver of the outbox suite.  Express with
// our own idempotent() middleware on the receiver database: the effect
// (a row in effect) commits with the message id as the Idempotency-Key, so
// a redelivery replays instead of repeating it.  Every arrival is logged
// (arrival, autocommit) before the guard, to count redeliveries.
const express = require('express');
const pg = require('pg');
const { idempotent } = require('../../clients/node');

const pool = new pg.Pool({ database: 'receiver', max: 20 });
pool.on('error', () => {});	// a server restart: the pool reconnects
const delay = Number(process.env.RECEIVER_DELAY_MS || 0);
const app = express();
app.use(express.json({ limit: '2mb' }));
app.post('/hook', async (req, res, next) => {
	try {
		await pool.query('INSERT INTO arrival (message_id) VALUES ($1)', [req.get('idempotency-key') || null]);
	} catch (e) { return res.status(503).json({ error: 'database down' }); }
	next();
}, idempotent({ pool, scope: 'hooks', lockWait: 100 }), async (req, res) => {
	await req.db.query('INSERT INTO effect (message_id, key, seq) VALUES ($1, $2, $3)',
		[req.get('idempotency-key'), req.body.key, req.body.seq]);
	if (delay) await new Promise(r => setTimeout(r, delay));
	res.status(200).json({ ok: true });
});
app.use((err, req, res, next) => { res.status(500).json({ error: String(err.message) }); });
const server = app.listen(Number(process.argv[2]), '127.0.0.1', () => console.log('listening'));
process.on('SIGTERM', () => { server.close(); pool.end(); });
