// test/packages/node/fastify-only.ts: a Fastify app in TypeScript with
// neither express nor @types/express installed (test/packages/run removes
// them), importing 'pg-idempotency/fastify': `tsc --strict` without
// skipLibCheck must compile it.
import fastify from 'fastify';
import pg from 'pg';
import { idempotentFastify, idempotentPhasesFastify } from 'pg-idempotency/fastify';

const pool = new pg.Pool();
const f = fastify();
f.post<{ Body: { amount: string } }>('/payments', idempotentFastify({ pool, scope: 'payments' }), async (request, reply) => {
	if (!request.db || !request.idempotency) throw new Error('not guarded');
	const { rows } = await request.db.query<{ id: string }>(
		'INSERT INTO payment (idem_key, amount) VALUES ($1, $2) RETURNING id', [request.idempotency.key, request.body.amount]);
	reply.code(201);
	return { id: rows[0].id };
});
f.post('/transfers', idempotentPhasesFastify({
	pool, scope: 'transfers', leaseMs: 2000,
	phases: [{ name: 'debit', run: async ({ client }) => { await client?.query('SELECT 1'); return { ok: true }; } }],
	response: state => ({ status: 201, body: { done: state.debit } }),
}));
