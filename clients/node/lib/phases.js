'use strict';
// phases.js: a request that calls other systems, run as named phases under
// one idempotency key in lease mode, resumable after a crash (recovery
// points, idempotency.checkpoint()).
//
//   begin(key, request, scope, ttl, lease)        autocommit; commits the lease
//     replay -> return the stored response; nothing runs
//     new    -> run every phase
//     retry  -> skip the phases up to recovery_point; state = recovery_state
//   for each phase still to run:
//     BEGIN; result = phase.run(ctx); checkpoint(key, name, state, attempt);
//     COMMIT                                       (the phase's writes and its
//                                                   point commit together)
//     an `external: true` phase runs outside a transaction (no connection
//     held open during a slow call) and checkpoints in autocommit after it
//   the last phase's transaction completes the key instead of checkpointing:
//     complete(key, response(state), scope, attempt)
//
// State: an object; each phase's result is stored under its name
// (state.order, state.charge, ...) and comes back on a retry.  ctx.deriveKey
// (step) is idempotency.derive_key(key, step, scope): the same on every
// attempt, so another system's Idempotency-Key makes a repeated call a
// replay.  While a phase runs, the lease is renewed every `renewEvery` ms
// (idempotency.renew); if the key was taken over, ctx.signal aborts and the
// checkpoint is refused (IK004): this attempt stops, the new one goes on.
//
// A phase that throws rolls its transaction back; the key is failed
// retryably (fail(retryable => true)), so a resend retries from the last
// point.  Throw an error with `permanent = true` to end the request for
// good: fail(retryable => false) stores {error: message}, replayed from
// then on.

const { checkExtension } = require('./compat');

const BEGIN_SQL =
	'SELECT outcome, status, response, attempts, recovery_point, recovery_state' +
	' FROM idempotency.begin($1, $2::jsonb, $3, $4::interval, $5::interval)';
const CHECKPOINT_SQL = 'SELECT idempotency.checkpoint($1, $2, $3::jsonb, $4, $5)';
const COMPLETE_SQL = 'SELECT idempotency.complete($1, $2::jsonb, $3, $4)';
const FAIL_SQL = 'SELECT idempotency.fail($1, $2::jsonb, $3, $4, $5)';
const RENEW_SQL = 'SELECT idempotency.renew($1, $2::interval, $3, $4)';
const DERIVE_SQL = 'SELECT idempotency.derive_key($1, $2, $3) AS k';

// PhaseError(message, {permanent, cause, status, body}): status and body are
// the HTTP answer the framework integrations (lib/phased.js) store and
// replay for a permanent error (default 400, {"error": message})
class PhaseError extends Error {
	constructor(message, { permanent = false, cause, status, body } = {}) {
		super(message, cause ? { cause } : undefined);
		this.name = 'PhaseError';
		this.permanent = permanent;
		if (status !== undefined) this.status = status;
		if (body !== undefined) this.body = body;
	}
}

function ms(v) { return `${Math.max(1, Math.round(v))} milliseconds`; }

// a duration option in milliseconds: its unit-carrying name (leaseMs) or its
// deprecated 0.5.0 name (lease), not both
function msOption(opts, name, old) {
	if (opts[name] != null && opts[old] != null)
		throw new TypeError(`runPhases: ${name} and ${old} (its deprecated name) given both`);
	const v = opts[name] ?? opts[old];
	if (v != null && (typeof v !== 'number' || !Number.isFinite(v) || v < 0))
		throw new TypeError(`runPhases: ${opts[name] != null ? name : old} must be a number of milliseconds >= 0`);
	return v ?? null;
}

// runPhases(pool, opts) -> {outcome, response, attempts, resumedFrom}
//   pool        pg.Pool (required)
//   key         the idempotency key (required); scope (default '')
//   request     JSON-able request, fingerprinted (IK001 if reused differently)
//   leaseMs     ms (default 30000): how long an attempt holds the key
//               between renewals; a crashed attempt is taken over after it
//   renewEveryMs  ms (default leaseMs / 3)
//   ttlMs       ms or null (idempotency.default_ttl)
//   (lease, renewEvery, ttl: their deprecated 0.5.0 names, ms too)
//   phases      [{name, run(ctx), external?}], run in order; names unique
//   response    (state) => JSON-able, stored by complete() and returned
//   hooks       {afterCommit(name)}: called after each phase's commit
//               (name '(begin)' after begin, '(complete)' after the last)
//   failure     (err, permanent) => JSON-able: what fail() stores for a phase
//               that threw (default {error: err.message}; the framework
//               integrations store their HTTP answer)
// ctx: {client (null for external phases), state, request, key, scope, attempt,
//       outcome, deriveKey(step), signal}
async function runPhases(pool, opts = {}) {
	const { key, scope = '', request = null, phases, response, hooks = {} } = opts;
	if (!pool || typeof pool.connect !== 'function') throw new TypeError('runPhases: pool is required');
	const lease = msOption(opts, 'leaseMs', 'lease') ?? 30000;
	const ttl = msOption(opts, 'ttlMs', 'ttl');
	const renewEvery = msOption(opts, 'renewEveryMs', 'renewEvery') || Math.max(50, Math.floor(lease / 3));
	if (!Array.isArray(phases) || phases.length === 0) throw new TypeError('runPhases: phases must be a non-empty array');
	if (typeof response !== 'function') throw new TypeError('runPhases: response must be a function');
	const names = phases.map(p => p.name);
	if (names.some(n => typeof n !== 'string' || n === '') || new Set(names).size !== names.length)
		throw new TypeError('runPhases: phase names must be unique non-empty strings');
	const afterCommit = hooks.afterCommit || (async () => {});
	const failure = opts.failure || (err => ({ error: String(err.message || err) }));
	if (typeof failure !== 'function') throw new TypeError('runPhases: failure must be a function');

	await checkExtension(pool);	// a query on the pool's first use only
	const b = (await pool.query(BEGIN_SQL, [key, request === null ? null : JSON.stringify(request),
		scope, ttl === null ? null : ms(ttl), ms(lease)])).rows[0];
	if (b.outcome === 'replay')
		return { outcome: 'replay', status: b.status, response: b.response, attempts: b.attempts, resumedFrom: b.recovery_point };
	const attempt = b.attempts;
	await afterCommit('(begin)');

	let start = 0;
	let state = {};
	if (b.outcome === 'retry' && b.recovery_point !== null) {
		const i = names.indexOf(b.recovery_point);
		if (i < 0) throw new PhaseError(`recovery point "${b.recovery_point}" is not one of the phases (${names.join(', ')})`);
		start = i + 1;
		state = b.recovery_state && typeof b.recovery_state === 'object' ? b.recovery_state : {};
	}

	// the heartbeat: renew the lease while phases run
	const abort = new AbortController();
	let renewing = Promise.resolve();
	const timer = setInterval(() => {
		renewing = renewing.then(() => pool.query(RENEW_SQL, [key, ms(lease), attempt, scope]))
			.catch(err => { if (err.code === 'IK004') abort.abort(err); });
	}, renewEvery);
	if (timer.unref) timer.unref();

	const derived = new Map();
	const deriveKey = async step => {
		if (!derived.has(step)) derived.set(step, (await pool.query(DERIVE_SQL, [key, step, scope])).rows[0].k);
		return derived.get(step);
	};
	const ctxOf = client => ({ client, state, request, key, scope, attempt, outcome: b.outcome, deriveKey, signal: abort.signal });

	try {
		// resumed after the last phase committed but before complete(): finish
		if (start === phases.length) {
			const out = response(state);
			await pool.query(COMPLETE_SQL, [key, JSON.stringify(out), scope, attempt]);
			await afterCommit('(complete)');
			return { outcome: b.outcome, response: out, attempts: attempt, resumedFrom: b.recovery_point };
		}
		let out;
		for (let i = start; i < phases.length; i++) {
			const phase = phases[i];
			const last = i === phases.length - 1;
			if (abort.signal.aborted) throw abort.signal.reason;
			if (phase.external) {
				const result = await phase.run(ctxOf(null));
				state = { ...state, [phase.name]: result === undefined ? null : result };
				if (last) {
					out = response(state);
					await pool.query(COMPLETE_SQL, [key, JSON.stringify(out), scope, attempt]);
				} else
					await pool.query(CHECKPOINT_SQL, [key, phase.name, JSON.stringify(state), attempt, scope]);
			} else {
				const client = await pool.connect();
				let ok = false;
				try {
					await client.query('BEGIN');
					const result = await phase.run(ctxOf(client));
					state = { ...state, [phase.name]: result === undefined ? null : result };
					if (last) {
						out = response(state);
						await client.query(COMPLETE_SQL, [key, JSON.stringify(out), scope, attempt]);
					} else
						await client.query(CHECKPOINT_SQL, [key, phase.name, JSON.stringify(state), attempt, scope]);
					await client.query('COMMIT');
					ok = true;
				} finally {
					if (!ok) await client.query('ROLLBACK').catch(() => {});
					client.release(!ok);
				}
			}
			await afterCommit(last ? '(complete)' : phase.name);
		}
		return { outcome: b.outcome, response: out, attempts: attempt, resumedFrom: b.recovery_point };
	} catch (err) {
		// taken over (IK004): the new attempt owns the key; store nothing
		if (err && err.code !== 'IK004' && !abort.signal.aborted) {
			const permanent = err instanceof PhaseError && err.permanent;
			let stored;
			try { stored = failure(err, permanent); } catch (e) { stored = { error: String(err.message || err) }; }
			await pool.query(FAIL_SQL, [key, JSON.stringify(stored), scope, !permanent, attempt]).catch(() => {});
		}
		throw err;
	} finally {
		clearInterval(timer);
		await renewing.catch(() => {});
	}
}

module.exports = { runPhases, PhaseError };
