// test/packages/node/express-only.ts: an Express app in TypeScript that uses
// only the package root and has no fastify installed (test/packages/run
// removes it): `tsc --strict` without skipLibCheck must compile it, so the
// root types must not import an optional framework (issue 29).
import express from 'express';
import pg from 'pg';
import { idempotent, idempotentPhases, runPhases, PhaseError, relay, webhook, type IdempotentRequest } from 'pg-idempotency';

const pool = new pg.Pool();
const app = express();
app.use(express.json());
app.post('/payments', idempotent({ pool, scope: 'payments', user: req => req.get('x-user') ?? null }), async (req, res) => {
	const { db, idempotency } = req as IdempotentRequest;
	const { rows } = await db.query<{ id: string }>('INSERT INTO payment (idem_key, amount) VALUES ($1, $2) RETURNING id',
		[idempotency.key, req.body.amount]);
	res.status(201).json({ id: rows[0].id });
});
app.post('/transfers', idempotentPhases({
	pool, scope: 'transfers', leaseMs: 2000,
	phases: [{ name: 'debit', run: async ({ client, req }) => { await client?.query('SELECT 1'); return { amount: String(req.body.amount) }; } }],
	response: state => ({ status: 201, body: { done: state.debit } }),
}));
void runPhases; void PhaseError; void relay; void webhook;
