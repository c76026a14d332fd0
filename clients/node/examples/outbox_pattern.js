'use strict';
// Example: the outbox pattern end to end, in one process.
//   POST /orders            guarded by an Idempotency-Key; inserts the order
//                           and publishes an event in the same transaction
//                           (idempotency.publish() on req.db: both commit
//                           with the key, or neither)
//   relay('order-events')   delivers each event with webhook(): a POST with
//                           Idempotency-Key: <message id>, at least once
//   POST /hooks/orders      the receiver, guarded by that key: a redelivery
//                           replays instead of recording the event twice
//   SIGTERM / SIGINT        a clean shutdown: stop the relay (handlers in
//                           hand finish, the rest is released), stop the HTTP
//                           server, end the pool; the process exits at once
// Database from DATABASE_HOST/PORT/NAME/USER; PORT (default: any free one);
// prints "listening <port>".
const express = require('express');
const pg = require('pg');
const { idempotent, relay, webhook } = require('..');

const pool = new pg.Pool({
	host: process.env.DATABASE_HOST, port: Number(process.env.DATABASE_PORT),
	database: process.env.DATABASE_NAME, user: process.env.DATABASE_USER, max: 10,
});
const app = express();
app.use(express.json());

app.post('/orders', idempotent({ pool, scope: 'orders' }), async (req, res) => {
	const { rows: [order] } = await req.db.query(
		'INSERT INTO example_order (amount) VALUES ($1) RETURNING id', [req.body.amount]);
	await req.db.query('SELECT idempotency.publish($1, $2::jsonb, $3)',
		['order-events', JSON.stringify({ order: Number(order.id), amount: req.body.amount }), `order-${order.id}`]);
	res.status(201).location(`/orders/${order.id}`).json({ id: Number(order.id) });
});

app.post('/hooks/orders', idempotent({ pool, scope: 'order-events-receiver' }), async (req, res) => {
	await req.db.query('INSERT INTO example_order_event (message_id, body) VALUES ($1, $2)',
		[req.idempotency.key, req.body]);
	res.status(200).json({ received: true });
});

async function setup() {
	await pool.query('CREATE TABLE IF NOT EXISTS example_order (id bigserial PRIMARY KEY, amount numeric)');
	await pool.query('CREATE TABLE IF NOT EXISTS example_order_event (message_id text, body jsonb)');
	await pool.query("SELECT idempotency.create_topic('order-events')").catch(err => {
		if (err.code !== '42710') throw err;	// the topic exists already
	});
}

setup().then(() => {
	const server = app.listen(Number(process.env.PORT || 0), '127.0.0.1', () => {
		const port = server.address().port;
		// handleSignals: false: the shutdown below stops the relay itself,
		// then what else keeps the process alive (the server, the pool)
		const events = relay('order-events', webhook(`http://127.0.0.1:${port}/hooks/orders`), { pool, handleSignals: false });
		let stopping = false;
		const shutdown = async () => {
			if (stopping) return;
			stopping = true;
			await events.stop();			// deliveries in hand finish (the receiver still serves)
			await new Promise(resolve => {
				server.close(resolve);		// no new connections; resolves when all are closed
				server.closeIdleConnections();	// the webhook's keep-alive connection
			});
			await pool.end();			// idle clients would keep the process ~10 s
		};
		process.once('SIGTERM', shutdown);
		process.once('SIGINT', shutdown);
		console.log(`listening ${port}`);
	});
}, err => { console.error(err); process.exit(1); });
