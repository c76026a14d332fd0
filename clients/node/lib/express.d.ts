// express.d.ts: types of lib/express.js, and req.db / req.idempotency on
// Express's Request (module augmentation; absent on an unguarded request,
// `required: false` without a key, hence optional).
import type { PoolClient } from 'pg';
import type { Request, RequestHandler } from 'express';
import type { GuardOptions, IdempotencyInfo } from './core';
import type { PhasedOptions } from './phased';

declare global {
	namespace Express {
		interface Request {
			/** The guarded transaction's client (set by idempotent()). */
			db?: PoolClient;
			/** The key, scope, outcome and attempts of the guarded request. */
			idempotency?: IdempotencyInfo;
			/** The raw body, when the middleware read it (no body parser before it). */
			rawBody?: Buffer;
		}
	}
}

/** A request the middleware guarded: req.db and req.idempotency are set. */
export type IdempotentRequest = Request & { db: PoolClient; idempotency: IdempotencyInfo };

/** Express middleware guarding the routes after it by the Idempotency-Key header. */
export function idempotent(opts: GuardOptions<Request>): RequestHandler;

/** An Express handler (the endpoint itself) running opts.phases under the request's Idempotency-Key. */
export function idempotentPhases(opts: PhasedOptions<Request>): RequestHandler;
