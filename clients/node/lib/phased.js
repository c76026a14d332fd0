'use strict';
// phased.js: what the Express and Fastify phase integrations share: one HTTP
// request run as runPhases() under its Idempotency-Key, answered by the HTTP
// rules of the single-transaction guard (core.js):
//
//   no key -> 400; malformed or longer than 255 -> 400 (IK003)
//   same key, another request -> 422 (IK001)
//   the key held by a running attempt (its lease) -> 409 with Retry-After (IK002)
//   replay -> the stored answer byte for byte, plus Idempotent-Replayed: true
//   response(state, req) -> {status, body, headers?}: stored by complete()
//     in the guard's format ({status, headers, body | body_base64}) when
//     store(status) (default: not 408, 409, 425, 429 nor 5xx), then sent;
//     an answer that is not stored rolls the last phase back and fails the
//     key retryably (a resend resumes from the last checkpoint)
//   a phase that throws -> 500, not stored (fail(retryable)), a resend
//     resumes from the last checkpoint
//   PhaseError(message, {permanent: true, status, body}) -> fail(retryable
//     => false) stores {status (default 400), body (default {"error":
//     message})}, sent now and replayed from then on
//   taken over while running (IK004) -> 409 with Retry-After: 1
//   40001/40P01 -> 503 with Retry-After: 1

const { Guard, defaultStore, parseKey, problem, encodeResponse, decodeResponse } = require('./core');
const { runPhases, PhaseError } = require('./phases');

const WHO = 'idempotentPhases';

// an answer {status, body, headers} -> {status, headers, body: Buffer}
function toAnswer(a, who) {
	if (!a || typeof a !== 'object' || !Number.isInteger(a.status) || a.status < 100 || a.status > 599)
		throw new TypeError(`${who}: response must return {status (an HTTP status), body, headers?}`);
	const headers = {};
	for (const [n, v] of Object.entries(a.headers || {})) headers[n] = String(v);
	const has = name => Object.keys(headers).some(n => n.toLowerCase() === name);
	let body;
	if (Buffer.isBuffer(a.body) || a.body instanceof Uint8Array) {
		body = Buffer.from(a.body);
		if (!has('content-type')) headers['Content-Type'] = 'application/octet-stream';
	} else if (typeof a.body === 'string') {
		body = Buffer.from(a.body, 'utf8');
		if (!has('content-type')) headers['Content-Type'] = 'text/plain; charset=utf-8';
	} else {
		body = Buffer.from(a.body === undefined ? '' : JSON.stringify(a.body), 'utf8');
		if (!has('content-type') && a.body !== undefined) headers['Content-Type'] = 'application/json';
	}
	return { status: a.status, headers, body };
}

const stored = a => encodeResponse(a.status, n => a.headers[n], a.body, Object.keys(a.headers));

class NotStored extends Error {
	constructor(answer) { super(`answer ${answer.status} is not stored`); this.answer = answer; }
}

class PhasedEndpoint {
	// opts: pool, scope, user, request, store (as the guard's); phases
	// [{name, run(ctx), external?}] (ctx as runPhases's, plus ctx.req: the
	// framework's request); response(state, req) -> {status, body, headers?};
	// leaseMs (default 30000), renewEveryMs (default leaseMs / 3), ttlMs
	// (default idempotency.default_ttl)
	constructor(opts, who = WHO) {
		if (!opts || typeof opts !== 'object') throw new TypeError(`${who}: options are required`);
		for (const old of ['lease', 'renewEvery', 'ttl', 'lockWait', 'lockWaitMs', 'required'])
			if (opts[old] !== undefined) throw new TypeError(`${who}: unknown option ${old}` +
				(['lease', 'renewEvery', 'ttl'].includes(old) ? ` (use ${old}Ms, milliseconds)` : ''));
		this.who = who;
		this.guard = new Guard({ pool: opts.pool, scope: opts.scope, user: opts.user, request: opts.request,
			store: opts.store ?? defaultStore });
		if (!Array.isArray(opts.phases) || opts.phases.length === 0) throw new TypeError(`${who}: phases must be a non-empty array`);
		for (const p of opts.phases)
			if (!p || typeof p.run !== 'function') throw new TypeError(`${who}: every phase needs a name and run(ctx)`);
		if (typeof opts.response !== 'function') throw new TypeError(`${who}: response must be a function (state, req) => {status, body}`);
		for (const n of ['leaseMs', 'renewEveryMs', 'ttlMs'])
			if (opts[n] != null && (typeof opts[n] !== 'number' || !Number.isFinite(opts[n]) || opts[n] < 0))
				throw new TypeError(`${who}: ${n} must be a number of milliseconds >= 0`);
		this.opts = opts;
	}

	// handle(req, keyHeader, method, path, body) -> {status, headers, body: Buffer, replayed}
	async handle(req, keyHeader, method, path, body) {
		const parsed = parseKey(keyHeader);
		if (parsed.missing)
			return problem(400, 'Idempotency-Key missing', 'This request requires an Idempotency-Key header.');
		if (parsed.error) return problem(400, 'Invalid Idempotency-Key', parsed.error);
		const { guard, opts } = this;
		const key = parsed.key;
		const scope = guard.scopeFor(req);
		const request = guard.requestFor(req, method, path, body);
		const phases = opts.phases.map(p => ({ name: p.name, external: p.external,
			run: ctx => p.run(Object.assign(ctx, { req })) }));
		const response = state => {
			const a = toAnswer(opts.response(state, req), this.who);
			if (!guard.store(a.status)) throw new NotStored(a);
			return stored(a);
		};
		const failure = (err, permanent) => permanent
			? stored(toAnswer({ status: err.status ?? 400, body: err.body ?? { error: String(err.message) },
				headers: { 'Content-Type': 'application/json' } }, this.who))
			: { error: String(err && err.message) };
		try {
			const r = await runPhases(guard.pool, { key, scope, request, phases, response, failure,
				leaseMs: opts.leaseMs, renewEveryMs: opts.renewEveryMs, ttlMs: opts.ttlMs });
			const answer = decodeResponse(r.response, r.status);
			if (r.outcome === 'replay') answer.replayed = true;
			return answer;
		} catch (err) {
			const code = err && err.code;
			if (err instanceof NotStored) return err.answer;
			if (err instanceof PhaseError && err.permanent)
				return decodeResponse(failure(err, true));
			if (code === 'IK001')
				return problem(422, 'Idempotency-Key reused', 'This Idempotency-Key was used with a different request.');
			if (code === 'IK002')
				return problem(409, 'Idempotency-Key in use',
					'A request with this Idempotency-Key is being processed; retry later.',
					{ 'Retry-After': await guard.retryAfter(guard.pool, key, scope) });
			if (code === 'IK003') return problem(400, 'Invalid Idempotency-Key', err.message);
			if (code === 'IK004')
				return problem(409, 'Idempotency-Key taken over',
					'Another attempt took this request over; retry later.', { 'Retry-After': '1' });
			if (code === '40001' || code === '40P01')
				return problem(503, 'Try again', err.message, { 'Retry-After': '1' });
			throw err;
		}
	}
}

module.exports = { PhasedEndpoint, toAnswer };
