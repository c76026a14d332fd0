// test/packages/node/app.ts: a small typed app on the packed pg-idempotency,
// compiled with `tsc --strict` (tsconfig.json) in a fresh directory where the
// package was installed from its tarball.  It serves POST /payments guarded
// by an Idempotency-Key (Express) and, on a second port, the same route with
// Fastify; prints "listening <express port> <fastify port>".
import express from 'express';
import fastify from 'fastify';
import pg from 'pg';
import {
	idempotent, idempotentFastify as rootFastify, parseKey, defaultStore, Guard,
	type GuardOptions, type IdempotencyInfo, type IdempotentRequest,
} from 'pg-idempotency';
// the root types do not import 'fastify' (an optional peer): request.db's
// type comes with the subpath
import { idempotentFastify } from 'pg-idempotency/fastify';
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
}

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

const f = fastify();
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
