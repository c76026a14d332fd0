'use strict';
// fastify.js: idempotentFastify(opts) -> route hooks {preHandler, onSend},
// spread into a route's options:
//
//   app.post('/payments', idempotentFastify({ pool, scope: 'payments' }), handler)
//
// preHandler begins the guarded transaction (request.db is its client) or
// answers a replay/error; onSend (which also sees the 500 of a handler that
// threw) stores the serialized payload and commits before it is written, or
// rolls back.

const { Guard, parseKey, problem } = require('./core');
const { PhasedEndpoint } = require('./phased');

const STATE = Symbol('idempotency');

function answer(reply, { status, headers, body }, replayed) {
	reply.code(status);
	for (const [name, value] of Object.entries(headers)) reply.header(name, value);
	if (replayed) reply.header('Idempotent-Replayed', 'true');
	return reply.send(body);
}

function idempotentFastify(opts) {
	const guard = new Guard(opts);
	async function preHandler(request, reply) {
		const parsed = parseKey(request.raw.headersDistinct
			? request.raw.headersDistinct['idempotency-key'] : request.headers['idempotency-key']);
		if (parsed.missing) {
			if (!guard.required) return;
			return answer(reply, problem(400, 'Idempotency-Key missing',
				'This request requires an Idempotency-Key header.'), false);
		}
		if (parsed.error) return answer(reply, problem(400, 'Invalid Idempotency-Key', parsed.error), false);
		const scope = guard.scopeFor(request);
		const req = guard.requestFor(request, request.method, request.url, request.body);
		const started = await guard.start(parsed.key, scope, req);
		if (started.send) return answer(reply, started.send, started.replayed);
		const state = started.state;
		request[STATE] = state;
		request.idempotency = { client: state.client, key: state.key, scope, outcome: state.outcome, attempts: state.attempts };
		request.db = state.client;
	}
	async function onSend(request, reply, payload) {
		const state = request[STATE];
		if (!state || state.done) return payload;
		if (payload !== null && payload !== undefined && typeof payload !== 'string' && !Buffer.isBuffer(payload)) {
			await guard.abort(state);	// a stream cannot be stored
			return swap(reply, problem(500, 'Response not storable', 'Streamed responses cannot be replayed.'));
		}
		const body = payload === null || payload === undefined ? Buffer.alloc(0)
			: Buffer.isBuffer(payload) ? payload : Buffer.from(payload, 'utf8');
		const replacement = await guard.finish(state, reply.statusCode, n => reply.getHeader(n), body);
		return replacement ? swap(reply, replacement) : payload;
	}
	return { preHandler, onSend };
}

function swap(reply, { status, headers, body }) {
	for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
	reply.code(status);
	for (const [name, value] of Object.entries(headers)) reply.header(name, value);
	return body;
}

// idempotentPhasesFastify(opts) -> a Fastify route handler that runs
// opts.phases under the request's Idempotency-Key (lib/phased.js has the
// HTTP rules; runPhases the phases):
//
//   app.post('/transfers', idempotentPhasesFastify({ pool, scope: 'transfers', phases, response }))
function idempotentPhasesFastify(opts) {
	const endpoint = new PhasedEndpoint(opts, 'idempotentPhasesFastify');
	return async function idempotentPhasesHandler(request, reply) {
		const a = await endpoint.handle(request, request.raw.headersDistinct
			? request.raw.headersDistinct['idempotency-key'] : request.headers['idempotency-key'],
		request.method, request.url, request.body);
		return answer(reply, a, a.replayed === true);
	};
}

module.exports = { idempotentFastify, idempotentPhasesFastify };
