// test/packages/node/app.ts: a small typed app on the packed pg-idempotency,
// compiled with `tsc --strict` (tsconfig.json) in a fresh directory where the
// package was installed from its tarball.  It serves POST /payments guarded
// by an Idempotency-Key (Express) and, on a second port, the same route with
// Fastify; prints "listening <express port> <fastify port>".
import express from 'express';
import fastify, { type FastifyRequest } from 'fastify';
import pg from 'pg';
import {
	idempotent, idempotentFastify as rootFastify, parseKey, defaultStore, Guard,
	idempotentPhases, idempotentPhasesFastify as rootPhasesFastify, PhaseError,
	type GuardOptions, type IdempotencyInfo, type IdempotentRequest, type PhasedOptions,
} from 'pg-idempotency';
// the root types do not import 'fastify' (an optional peer): request.db's
// type comes with the subpath
import { idempotentFastify, idempotentPhasesFastify } from 'pg-idempotency/fastify';
import { idempotent as fromSubpath } from 'pg-idempotency/express';
import { parseKey as parseFromCore } from 'pg-idempotency/core';

const pool = new pg.Pool({
	host: process.env.DATABASE_HOST, port: Number(process.env.DATABASE_PORT),
	database: process.env.DATABASE_NAME, user: process.env.DATABASE_USER, max: 4,
});

// every option, typed
const options: GuardOptions<express.Request> = {
	pool,
	scope: 'payments',
	user: req => req.get('x-user') ?? null,
	lockWait: 200,
	retries: 3,
	required: true,
	headers: ['Cache-Control'],
	ttl: '1 day',
	request: req => ({ method: req.method, path: req.path, body: req.body as unknown }),
	store: status => defaultStore(status) && status !== 402,
};

// the types are not `any`: these calls must not compile (never called)
export function typeErrors(): void {
	// @ts-expect-error scope is required
	idempotent({ pool });
	// @ts-expect-error lockWait is a number of milliseconds
	idempotent({ pool, scope: 'x', lockWait: '200ms' });
	// @ts-expect-error store is a function of the status
	idempotentFastify({ pool, scope: 'x', store: true });
	// @ts-expect-error the root's idempotentFastify has the same options
	rootFastify({ pool, scope: 'x', store: true });
	// @ts-expect-error phases are required
	idempotentPhases({ pool, scope: 'x', response: () => ({ status: 201 }) });
	// @ts-expect-error leaseMs is a number of milliseconds
	idempotentPhases({ pool, scope: 'x', leaseMs: '2s', phases: [], response: () => ({ status: 201 }) });
	// @ts-expect-error response returns {status, body?, headers?}
	idempotentPhasesFastify({ pool, scope: 'x', phases: [], response: () => 'done' });
	// @ts-expect-error a phase's result is JSON
	rootPhasesFastify({ pool, scope: 'x', phases: [{ name: 'a', run: () => new Date() }], response: () => ({ status: 201 }) });
}

// phases behind one line, every option typed: the request is Express's
const phased: PhasedOptions<express.Request> = {
	pool,
	scope: req => `phased:${req.path}`,
	user: req => req.get('x-user') ?? null,
	request: req => ({ body: req.body as unknown }),
	store: status => defaultStore(status),
	leaseMs: 2000,
	renewEveryMs: 600,
	ttlMs: 86400000,
	phases: [
		{ name: 'reserve', run: async ({ client, key, req }) => {
			if (!client) throw new Error('a database phase has a client');
			if (req.body.decline) throw new PhaseError('declined', { permanent: true, status: 402, body: { error: 'declined' } });
			const { rows } = await client.query<{ n: number }>('SELECT 1 AS n');
			return { n: rows[0].n, key };
		} },
		{ name: 'call', external: true, run: async ({ client, deriveKey }) => ({ none: client === null, derived: await deriveKey('call') }) },
	],
	response: (state, req) => ({ status: 201, body: { reserved: state.reserve, called: state.call, amount: String(req.body.amount) } }),
};

// the root's structurally typed hooks fit a Fastify route (never called)
export function rootHooksFit(): void {
	fastify().post('/root', rootFastify({ pool, scope: 'root' }), async () => ({ ok: true }));
}

const parsed = parseKey('"abc"');
if (parsed.key !== undefined) {
	const k: string = parsed.key;
	void k;
}
void parseFromCore;
void fromSubpath;
void Guard;

const app = express();
app.use(express.json());
app.post('/payments', idempotent(options), async (req, res) => {
	// req.db and req.idempotency come from the module augmentation
	const db: pg.PoolClient | undefined = req.db;
	const info: IdempotencyInfo | undefined = req.idempotency;
	if (!db || !info) throw new Error('not guarded');
	const { rows } = await db.query<{ id: string }>(
		'INSERT INTO payment (idem_key, amount) VALUES ($1, $2) RETURNING id', [info.key, req.body.amount]);
	res.status(201).json({ id: Number(rows[0].id), outcome: info.outcome, attempts: info.attempts });
});
// the narrowed request type
app.post('/narrow', idempotent({ pool, scope: 'narrow' }), async (req, res) => {
	const r = req as IdempotentRequest;
	const { rows } = await r.db.query<{ n: number }>('SELECT 1 AS n');
	res.json({ n: rows[0].n, key: r.idempotency.key });
});

app.post('/phased', idempotentPhases(phased));

const f = fastify();
f.post('/phased', idempotentPhasesFastify<FastifyRequest<{ Body: { amount: string } }>>({
	pool, scope: 'fastify-phased', leaseMs: 2000,
	phases: [{ name: 'only', run: async ({ client, req }) => ({ amount: req.body.amount, db: client !== null }) }],
	response: state => ({ status: 201, body: state.only, headers: { 'Cache-Control': 'no-store' } }),
}));
f.post<{ Body: { amount: string } }>('/payments', idempotentFastify({ pool, scope: 'fastify-payments' }), async (request, reply) => {
	const db = request.db;
	const info = request.idempotency;
	if (!db || !info) throw new Error('not guarded');
	const { rows } = await db.query<{ id: string }>(
		'INSERT INTO payment (idem_key, amount) VALUES ($1, $2) RETURNING id', [info.key, request.body.amount]);
	reply.code(201);
	return { id: Number(rows[0].id), outcome: info.outcome };
});

const server = app.listen(0, '127.0.0.1', async () => {
	await f.listen({ port: 0, host: '127.0.0.1' });
	const a = server.address();
	const b = f.server.address();
	if (a === null || typeof a === 'string' || b === null || typeof b === 'string') throw new Error('no port');
	console.log(`listening ${a.port} ${b.port}`);
});
