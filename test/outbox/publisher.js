'use strict';
// publisher.js N KEYS: N guarded payments through once(), 4 connections at
// a time.  Each one inserts a payment, bumps its customer's counter (seq,
// in commit order: the counter row is locked until commit) and publishes
// {key, seq} on topic "hooks" with message_key = the customer, all in one
// statement.  A request that fails (the server stopped) is sent again with
// the same idempotency key until it answers: it is replayed if it had
// committed, so each payment publishes exactly one message.  Every 10th
// request is also sent a second time: a replay publishes nothing.
// Prints "published N replays R".
const pg = require('pg');

const N = Number(process.argv[2]), KEYS = Number(process.argv[3]);
const pool = new pg.Pool({ database: 'shop', max: 4 });
pool.on('error', () => {});
const SQL = `SELECT outcome FROM idempotency.once($1, $2::jsonb,
  'WITH c AS (INSERT INTO counter AS c (key, n) VALUES ($1, 1)
              ON CONFLICT (key) DO UPDATE SET n = c.n + 1 RETURNING n),
        p AS (INSERT INTO payment (key, amount) VALUES ($1, $2::int) RETURNING id),
        m AS (SELECT idempotency.publish(''hooks'', jsonb_build_object(''key'', $1::text, ''seq'', c.n, ''payment'', p.id), $1) AS message_id
                FROM c, p),
        s AS (INSERT INTO sent (message_id) SELECT m.message_id FROM m)
   SELECT m.message_id FROM m', $3, $4)`;
const sleep = ms => new Promise(r => setTimeout(r, ms));

async function send(i) {
	const key = `customer-${i % KEYS}`;
	for (;;) {
		try {
			const r = await pool.query(SQL, [`pay-${i}`, JSON.stringify({ i }), key, String(i)]);
			return r.rows[0].outcome;
		} catch (e) {
			await sleep(100);	// the server is restarting: same key again
		}
	}
}

(async () => {
	let next = 0, replays = 0;
	async function worker() {
		while (next < N) {
			const i = next++;
			await send(i);
			if (i % 10 === 0 && (await send(i)) === 'replay') replays++;
			await sleep(10);
		}
	}
	await Promise.all([worker(), worker(), worker(), worker()]);
	console.log(`published ${N} replays ${replays}`);
	await pool.end();
})();
