'use strict';
// core.js: what the Express and Fastify integrations share.
//
// A guarded request is one transaction on one pooled client:
//
//   BEGIN; SET LOCAL idempotency.lock_wait = '<lockWait>ms'
//   SELECT ... FROM idempotency.begin(key, request, scope, ttl)
//     replay      -> ROLLBACK, send the stored response
//     new / retry -> the handler runs its queries on this client;
//                    its response is captured, then
//                    complete(key, response, scope); COMMIT; send it
//
// A thrown handler, or an answer that `store(status)` refuses, rolls
// everything back: nothing is stored and a resend runs the handler again.
// By default (Stripe's practice) 408, 409, 425, 429 and any 5xx are not
// stored; every other answer (2xx, 3xx, other 4xx) is final and replayed.  40001/40P01 from begin() are retried
// (`retries` times) in a fresh transaction.  IK001 -> 422, IK002 -> 409 with
// Retry-After, IK003 -> 400.
//
// Stored response (the byte-exact replay convention of the extension):
//   {"status": 201, "headers": {"Content-Type": ..., "Location": ...},
//    "body": "<exact body text>"}           or "body_base64" when the body
// is not valid UTF-8 or contains NUL.

const { checkExtension } = require('./compat');

const DEFAULT_HEADERS = ['Content-Type', 'Location'];
const BEGIN_SQL =
	'SELECT outcome, status, response, attempts FROM idempotency.begin($1, $2::jsonb, $3, $4::interval)';
const COMPLETE_SQL = 'SELECT idempotency.complete($1, $2::jsonb, $3)';
const LOOKUP_SQL = 'SELECT retry_after FROM idempotency.lookup($1, $2)';
const HAS_LOOKUP_SQL =
	"SELECT to_regprocedure('idempotency.lookup(text,text)') IS NOT NULL AS has";

const hasLookup = new WeakMap();	// pool -> Promise<boolean>, asked once per pool

// parseKey(value): the Idempotency-Key header, as a structured-field string
// ("abc", RFC 8941 section 3.3.3) or bare (abc, as Stripe clients send it).
// Returns {key}, {missing: true} or {error: text}.
function parseKey(value) {
	if (value === undefined || value === null) return { missing: true };
	if (Array.isArray(value)) {
		if (value.length > 1) return { error: 'more than one Idempotency-Key header' };
		value = value[0];
	}
	const v = String(value).trim();
	if (v === '') return { missing: true };
	if (v[0] !== '"') return { key: v };
	let out = '';
	for (let i = 1; i < v.length; i++) {
		const c = v[i];
		if (c === '\\') {
			const n = v[++i];
			if (n !== '"' && n !== '\\') return { error: 'bad escape in Idempotency-Key string' };
			out += n;
		} else if (c === '"') {
			if (i !== v.length - 1) return { error: 'text after the Idempotency-Key string' };
			return { key: out };
		} else {
			const code = c.charCodeAt(0);
			if (code < 0x20 || code > 0x7e) return { error: 'Idempotency-Key string must be printable ASCII' };
			out += c;
		}
	}
	return { error: 'unterminated Idempotency-Key string' };
}

function problem(status, title, detail, headers = {}) {
	const body = JSON.stringify({ title, status, detail });
	return {
		status,
		headers: { 'Content-Type': 'application/problem+json', ...headers },
		body: Buffer.from(body, 'utf8'),
	};
}

function toBuffer(body) {
	if (body === undefined || body === null) return Buffer.alloc(0);
	if (Buffer.isBuffer(body)) return body;
	if (body instanceof Uint8Array) return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
	return Buffer.from(String(body), 'utf8');
}

// encodeResponse: status, a header getter and the body bytes -> stored jsonb
function encodeResponse(status, getHeader, body, names) {
	const headers = {};
	for (const name of names) {
		const v = getHeader(name);
		if (v !== undefined && v !== null) headers[name] = Array.isArray(v) ? v.join(', ') : String(v);
	}
	const r = { status, headers };
	const text = body.toString('utf8');
	if (!text.includes('\u0000') && Buffer.from(text, 'utf8').equals(body)) r.body = text;
	else r.body_base64 = body.toString('base64');
	return r;
}

// decodeResponse: stored jsonb -> {status, headers, body}.  A key completed
// by other code (not in this shape) is sent as JSON.
function decodeResponse(r, status) {
	if (r && typeof r === 'object' && Number.isInteger(r.status)) {
		const body = typeof r.body === 'string' ? Buffer.from(r.body, 'utf8')
			: Buffer.from(r.body_base64 || '', 'base64');
		return { status: r.status, headers: { ...(r.headers || {}) }, body };
	}
	return {
		status: status === 'failed' ? 500 : 200,
		headers: { 'Content-Type': 'application/json' },
		body: Buffer.from(JSON.stringify(r), 'utf8'),
	};
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

// answers that are not final: rolled back, not stored, a resend runs again
const TRANSIENT = new Set([408, 409, 425, 429]);
function defaultStore(status) { return status < 500 && !TRANSIENT.has(status); }

// An 'error' event on a checked-out client (the server stopped, the socket
// broke) would be unhandled and end the process; the query in progress
// fails with the same error, which is where it is handled.  One listener per
// pooled client, added at its first checkout.
const listening = new WeakSet();
function survive(client) {
	if (listening.has(client)) return;
	listening.add(client);
	client.on('error', () => {});
}

// A duration option in milliseconds under its unit-carrying name (lockWaitMs)
// or its deprecated 0.5.0 name in milliseconds too (lockWait; null: none);
// both at once is a TypeError.
function msOption(opts, name, old, who) {
	const ov = old === null ? null : opts[old];
	if (opts[name] != null && ov != null)
		throw new TypeError(`${who}: ${name} and ${old} (its deprecated name) given both`);
	const v = opts[name] ?? ov;
	if (v != null && (typeof v !== 'number' || !Number.isFinite(v) || v < 0))
		throw new TypeError(`${who}: ${opts[name] != null ? name : old} must be a number of milliseconds >= 0`);
	return v ?? null;
}

class Guard {
	// opts: pool (pg.Pool, required); scope (string or req => string, required);
	// user (req => id or null: scope per authenticated user); lockWaitMs (ms,
	// default 200; lockWait: its deprecated name); retries (40001/40P01, default 3);
	// required (default true; without a key a
	// route with required: false runs unguarded, with no req.db);
	// headers (names to store, default Content-Type and Location); ttlMs
	// (ms, default the server's idempotency.default_ttl; ttl: deprecated,
	// interval text such as '7 days');
	// request (req => jsonb value to fingerprint; default method, path, body);
	// store (status => boolean: whether an answer is stored and replayed;
	// default: not 408, 409, 425, 429 nor 5xx, which roll back so that a
	// resend runs again).
	constructor(opts) {
		if (!opts || !opts.pool) throw new TypeError('idempotent: pool is required');
		if (opts.scope === undefined) throw new TypeError('idempotent: scope is required');
		this.pool = opts.pool;
		this.scope = opts.scope;
		this.user = opts.user;
		this.lockWait = Math.floor(msOption(opts, 'lockWaitMs', 'lockWait', 'idempotent') ?? 200);
		this.retries = opts.retries ?? 3;
		this.required = opts.required ?? true;
		// ttlMs, or the deprecated ttl (interval text), sent as interval text
		if (opts.ttlMs != null && opts.ttl != null)
			throw new TypeError('idempotent: ttlMs and ttl (its deprecated name) given both');
		const ttlMs = msOption(opts, 'ttlMs', null, 'idempotent');
		this.ttl = ttlMs !== null ? `${Math.max(1, Math.round(ttlMs))} milliseconds` : opts.ttl ?? null;
		this.request = opts.request;
		this.store = opts.store ?? defaultStore;
		if (typeof this.store !== 'function') throw new TypeError('idempotent: store must be a function');
		const names = [...DEFAULT_HEADERS];
		for (const h of opts.headers || [])
			if (!names.some(n => n.toLowerCase() === String(h).toLowerCase())) names.push(String(h));
		this.headerNames = names;
	}

	scopeFor(req) {
		let scope = typeof this.scope === 'function' ? this.scope(req) : this.scope;
		if (this.user) {
			const u = this.user(req);
			if (u !== undefined && u !== null && u !== '') scope = `${scope}|user:${u}`;
		}
		return String(scope);
	}

	requestFor(req, method, path, body) {
		if (this.request) return this.request(req);
		if (Buffer.isBuffer(body)) body = { base64: body.toString('base64') };
		return { method, path, body: body === undefined ? null : body };
	}

	async lookupAvailable(client) {
		let p = hasLookup.get(this.pool);
		if (!p) {
			p = client.query(HAS_LOOKUP_SQL).then(r => r.rows[0].has, () => false);
			hasLookup.set(this.pool, p);
		}
		return p;
	}

	async retryAfter(client, key, scope) {
		try {
			if (await this.lookupAvailable(client)) {
				const r = await client.query(LOOKUP_SQL, [key, scope]);
				const s = r.rows.length ? Number(r.rows[0].retry_after) : 0;
				if (s > 0) return String(Math.ceil(s));
			}
		} catch (e) { /* fall back to one second */ }
		return '1';
	}

	// start(): -> {send: {status, headers, body}, replayed} when the answer is
	// known now, or {state} (the open transaction) for the handler to run in.
	async start(key, scope, request) {
		for (let attempt = 0; ; attempt++) {
			const client = await this.pool.connect();
			survive(client);
			let inTx = false;
			try {
				await checkExtension(this.pool, client);	// a query on a pool's first request only
				await client.query(`BEGIN; SET LOCAL idempotency.lock_wait = '${this.lockWait}ms'`);
				inTx = true;
				const r = await client.query(BEGIN_SQL, [key, JSON.stringify(request), scope, this.ttl]);
				const b = r.rows[0];
				if (b.outcome === 'replay') {
					await client.query('ROLLBACK');
					client.release();
					return { send: decodeResponse(b.response, b.status), replayed: true };
				}
				return { state: { client, key, scope, outcome: b.outcome, attempts: b.attempts, done: false } };
			} catch (err) {
				let broken = null;
				if (inTx) await client.query('ROLLBACK').catch(e => { broken = e; });
				const code = err && err.code;
				if (code === 'IK002') {
					const ra = broken ? '1' : await this.retryAfter(client, key, scope);
					client.release(broken || undefined);
					return { send: problem(409, 'Idempotency-Key in use',
						'A request with this Idempotency-Key is being processed; retry later.',
						{ 'Retry-After': ra }) };
				}
				client.release(broken || (code ? undefined : err));
				if (code === 'IK001')
					return { send: problem(422, 'Idempotency-Key reused',
						'This Idempotency-Key was used with a different request.') };
				if (code === 'IK003')
					return { send: problem(400, 'Invalid Idempotency-Key', err.message) };
				if (code === '40001' || code === '40P01') {
					if (attempt < this.retries) {
						await sleep(5 * (attempt + 1) + Math.random() * 20);
						continue;
					}
					return { send: problem(503, 'Try again', err.message, { 'Retry-After': '1' }) };
				}
				throw err;
			}
		}
	}

	// finish(): store a final response (store(status)) and commit, or roll back.
	// Returns null when the captured response may be sent, else a replacement.
	async finish(state, status, getHeader, body) {
		if (state.done) return null;
		state.done = true;
		const { client } = state;
		if (!this.store(status)) {
			await this.abortClient(client);
			return null;
		}
		try {
			const stored = encodeResponse(status, getHeader, body, this.headerNames);
			await client.query(COMPLETE_SQL, [state.key, JSON.stringify(stored), state.scope]);
			await client.query('COMMIT');
			client.release();
			return null;
		} catch (err) {
			await this.abortClient(client);
			if (err.code === '40001' || err.code === '40P01')
				return problem(503, 'Try again', err.message, { 'Retry-After': '1' });
			return problem(500, 'Could not store the response', err.message);
		}
	}

	// abort(): the handler failed or the client went away: roll back.
	async abort(state) {
		if (state.done) return;
		state.done = true;
		await this.abortClient(state.client);
	}

	async abortClient(client) {
		try {
			await client.query('ROLLBACK');
			client.release();
		} catch (e) {
			client.release(e);
		}
	}
}

module.exports = { Guard, defaultStore, parseKey, problem, toBuffer, encodeResponse, decodeResponse, msOption };
