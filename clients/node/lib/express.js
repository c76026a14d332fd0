'use strict';
// express.js: idempotent(opts) -> Express middleware (also plain node:http
// style (req, res, next)).  The handler after it finds the guarded
// transaction's client in req.db (and req.idempotency.client); whatever it
// sends is captured (writeHead/write/end), stored by complete(), committed,
// and only then written to the socket, so a client never sees an answer
// that was not stored.  A streamed answer (a stream piped into res, or
// res.flushHeaders()) cannot be stored for replay: it is refused with 500
// "Response not storable" and rolled back, as the Fastify hooks do.  A
// client that goes away does not stop the handler: its answer is still
// stored and a resend replays it.
//
// The request body is fingerprinted as req.body when a body parser
// (express.json(), ...) ran before the middleware.  Without one (req.body
// undefined and the request has a body: Content-Length > 0 or
// Transfer-Encoding), the middleware reads the raw bytes itself,
// fingerprints their SHA-256 and leaves them in req.rawBody (a Buffer); a
// body parser placed after it then finds the stream consumed.  Needs Express
// 5 or later (Express 4 does not pass a rejected async handler to next(),
// so the request would hang with its pooled client).

const crypto = require('crypto');
const { Guard, parseKey, problem, toBuffer } = require('./core');
const { PhasedEndpoint } = require('./phased');

const NOT_STORABLE = problem(500, 'Response not storable',
	'A streamed response cannot be stored for replay; send the whole body with res.send() or res.end().');

function hasBody(req) {
	if (req.headers['transfer-encoding'] !== undefined) return true;
	const n = Number(req.headers['content-length']);
	return Number.isFinite(n) && n > 0;
}

function readRaw(req) {
	return new Promise((resolve, reject) => {
		const chunks = [];
		req.on('data', c => chunks.push(c));
		req.on('end', () => resolve(Buffer.concat(chunks)));
		req.on('error', reject);
		req.on('aborted', () => reject(new Error('request aborted')));
	});
}

function send(res, { status, headers, body }, replayed) {
	res.statusCode = status;
	for (const [name, value] of Object.entries(headers)) res.setHeader(name, value);
	if (replayed) res.setHeader('Idempotent-Replayed', 'true');
	res.setHeader('Content-Length', body.length);
	res.end(body);
}

function replace(res, answer) {
	for (const name of res.getHeaderNames()) res.removeHeader(name);
	send(res, answer, false);
}

function idempotent(opts) {
	const guard = new Guard(opts);
	return function idempotencyMiddleware(req, res, next) {
		const distinct = req.headersDistinct ? req.headersDistinct['idempotency-key'] : req.headers['idempotency-key'];
		const parsed = parseKey(distinct);
		if (parsed.missing) {
			if (!guard.required) return next();
			return send(res, problem(400, 'Idempotency-Key missing',
				'This request requires an Idempotency-Key header.'), false);
		}
		if (parsed.error) return send(res, problem(400, 'Invalid Idempotency-Key', parsed.error), false);
		const scope = guard.scopeFor(req);
		const body = req.body === undefined && hasBody(req) && !req.readableEnded
			? readRaw(req).then(raw => {
				req.rawBody = raw;
				return { sha256: crypto.createHash('sha256').update(raw).digest('hex') };
			})
			: Promise.resolve(req.body);
		body.then(b => guard.start(parsed.key, scope, guard.requestFor(req, req.method, req.originalUrl || req.url, b)))
		.then(started => {
			if (started.send) return send(res, started.send, started.replayed);
			const state = started.state;
			req.idempotency = { client: state.client, key: state.key, scope, outcome: state.outcome, attempts: state.attempts };
			req.db = state.client;
			capture(res, guard, state);
			next();
		}, next);
	};
}

// capture: hold the response until it is stored; a stream piped into res
// (its 'pipe' event: pipe() and stream.pipeline()) or flushHeaders() marks
// it streamed, refused at end()
function capture(res, guard, state) {
	const { writeHead, write, end, flushHeaders } = res;
	const chunks = [];
	let streamed = false;
	const onPipe = () => { streamed = true; };
	res.on('pipe', onPipe);
	res.flushHeaders = function () { streamed = true; };
	res.writeHead = function (status, reason, headers) {
		if (typeof reason !== 'string') headers = reason;
		res.statusCode = status;
		if (headers && !Array.isArray(headers))
			for (const [n, v] of Object.entries(headers)) res.setHeader(n, v);
		return res;
	};
	res.write = function (chunk, encoding, cb) {
		if (typeof encoding === 'function') { cb = encoding; encoding = undefined; }
		if (chunk !== undefined && chunk !== null)
			chunks.push(typeof chunk === 'string' ? Buffer.from(chunk, encoding || 'utf8') : toBuffer(chunk));
		if (cb) process.nextTick(cb);
		return true;
	};
	res.end = function (chunk, encoding, cb) {
		if (typeof chunk === 'function') { cb = chunk; chunk = undefined; }
		if (typeof encoding === 'function') { cb = encoding; encoding = undefined; }
		if (chunk !== undefined && chunk !== null) res.write(chunk, encoding);
		res.writeHead = writeHead; res.write = write; res.end = end; res.flushHeaders = flushHeaders;
		res.removeListener('pipe', onPipe);
		if (streamed) {
			guard.abort(state).then(() => replace(res, NOT_STORABLE),
				err => replace(res, problem(500, 'Internal error', String(err && err.message))));
			return res;
		}
		const body = Buffer.concat(chunks);
		guard.finish(state, res.statusCode, n => res.getHeader(n), body).then(answer => {
			if (answer) return replace(res, answer);
			res.end(body, cb);
		}, err => replace(res, problem(500, 'Internal error', String(err && err.message))));
		return res;
	};
}

// idempotentPhases(opts) -> an Express handler (the endpoint itself) that
// runs opts.phases under the request's Idempotency-Key (lib/phased.js has
// the HTTP rules; runPhases the phases):
//
//   app.post('/transfers', idempotentPhases({ pool, scope: 'transfers', phases, response }))
//
// The body is fingerprinted as the guard's is (req.body, or the raw body's
// SHA-256 when no body parser ran).  An error it cannot map goes to next().
function idempotentPhases(opts) {
	const endpoint = new PhasedEndpoint(opts, 'idempotentPhases');
	return function idempotentPhasesHandler(req, res, next) {
		const distinct = req.headersDistinct ? req.headersDistinct['idempotency-key'] : req.headers['idempotency-key'];
		const body = req.body === undefined && hasBody(req) && !req.readableEnded
			? readRaw(req).then(raw => {
				req.rawBody = raw;
				return { sha256: crypto.createHash('sha256').update(raw).digest('hex') };
			})
			: Promise.resolve(req.body);
		body.then(b => endpoint.handle(req, distinct, req.method, req.originalUrl || req.url, b))
			.then(answer => send(res, answer, answer.replayed === true), next);
	};
}

module.exports = { idempotent, idempotentPhases };
