'use strict';
// relay.js URL NAME: a relay of topic "hooks" delivering to URL with
// webhook(); stops gracefully on SIGTERM (the relay's own handling) and
// prints its counts as JSON.
const pg = require('pg');
const { relay, webhook } = require('../../clients/node');

const pool = new pg.Pool({ database: 'shop', max: 6 });
pool.on('error', () => {});
const hook = webhook(process.argv[2], { timeoutMs: 5000 });
const r = relay('hooks', async m => { try { return await hook(m); } catch (e) { if (process.env.OUTBOX_DEBUG) console.log('nack', m.key, e.message, e.body); throw e; } }, {
	pool, batchSize: 4, concurrency: 4, visibilityMs: 2000, pollIntervalMs: 500, retryDelayMs: 200,
	onError: err => { if (process.env.OUTBOX_DEBUG) console.log('error', err.message); },
});
console.log(`${process.argv[3]} started`);
r.done.then(async () => {
	console.log(`${process.argv[3]} stopped ${JSON.stringify(r.counts)}`);
	await pool.end();
	process.exit(0);
});
