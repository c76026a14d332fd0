'use strict';
// test/recovery/processor.js: a fake card processor over real HTTP, with
// Stripe's idempotency rule: POST /charges with an Idempotency-Key creates a
// charge the first time and returns the same charge for every repeat of the
// key.  It counts the charges it created per key and per request (the
// shop's own key, sent in the body), which is what the suite checks.
//   GET /stats -> {byKey: {key: n}, byRequest: {request: n}, total: n}
// Prints "listening <port>" when ready.
const http = require('http');

const stored = new Map();		// Idempotency-Key -> response body
const byKey = {};
const byRequest = {};
let total = 0;

const server = http.createServer((req, res) => {
	let body = '';
	req.on('data', c => { body += c; });
	req.on('end', () => {
		if (req.method === 'GET' && req.url === '/stats') {
			res.writeHead(200, { 'Content-Type': 'application/json' });
			res.end(JSON.stringify({ byKey, byRequest, total }));
			return;
		}
		if (req.method !== 'POST' || req.url !== '/charges') { res.writeHead(404); res.end(); return; }
		const key = req.headers['idempotency-key'];
		if (!key) { res.writeHead(400); res.end('{"error":"Idempotency-Key required"}'); return; }
		if (stored.has(key)) {
			res.writeHead(200, { 'Content-Type': 'application/json', 'Idempotent-Replayed': 'true' });
			res.end(stored.get(key));
			return;
		}
		const input = JSON.parse(body || '{}');
		total++;
		byKey[key] = (byKey[key] || 0) + 1;
		byRequest[input.request] = (byRequest[input.request] || 0) + 1;
		const out = JSON.stringify({ id: `ch_${total}`, amount: input.amount });
		stored.set(key, out);
		res.writeHead(201, { 'Content-Type': 'application/json' });
		res.end(out);
	});
});
server.listen(0, '127.0.0.1', () => console.log(`listening ${server.address().port}`));
