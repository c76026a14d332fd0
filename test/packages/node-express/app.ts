// test/packages/node-express/app.ts: an app that uses Express only; fastify
// (an optional peer dependency of pg-idempotency) is not installed.  It must
// compile with `tsc --strict --noEmit` and skipLibCheck false: the package's
// root types must not import 'fastify'.
import express from 'express';
import pg from 'pg';
import { idempotent, runPhases, relay, type IdempotencyInfo } from 'pg-idempotency';

const pool = new pg.Pool();
const app = express();
app.use(express.json());
app.post('/payments', idempotent({ pool, scope: 'payments' }), async (req, res) => {
	const info: IdempotencyInfo | undefined = req.idempotency;
	res.status(201).json({ key: info?.key });
});
void runPhases;
void relay;
export default app;
