// fastify.d.ts: types of lib/fastify.js, and request.db /
// request.idempotency on Fastify's request (module augmentation).
import type { PoolClient } from 'pg';
import type { FastifyRequest, FastifyReply, preHandlerAsyncHookHandler, onSendHookHandler } from 'fastify';
import type { GuardOptions, IdempotencyInfo } from './core';
import type { PhasedOptions } from './phased';

declare module 'fastify' {
	interface FastifyRequest {
		/** The guarded transaction's client (set by idempotentFastify()). */
		db?: PoolClient;
		/** The key, scope, outcome and attempts of the guarded request. */
		idempotency?: IdempotencyInfo;
	}
}

/** Route hooks, spread into a route's options. */
export interface IdempotentHooks {
	preHandler: preHandlerAsyncHookHandler;
	onSend: onSendHookHandler<unknown>;
}

/** Hooks guarding one route by the Idempotency-Key header. */
export function idempotentFastify(opts: GuardOptions<FastifyRequest>): IdempotentHooks;

/** A Fastify route handler running opts.phases under the request's Idempotency-Key. */
export function idempotentPhasesFastify<Req extends FastifyRequest = FastifyRequest>(
	opts: PhasedOptions<Req>): (request: Req, reply: FastifyReply) => Promise<unknown>;
