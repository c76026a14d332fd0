// index.d.ts: the types of index.js.  One line per lib module, except
// Fastify: the root must compile in an app that does not install fastify (an
// optional peer), so it does not import lib/fastify.d.ts (which imports
// 'fastify'); idempotentFastify is declared here with structural hook types,
// and request.db / request.idempotency are added to FastifyRequest by an
// augmentation that needs no import (it applies when fastify is installed).
// 'pg-idempotency/fastify' has the hooks typed by Fastify's own types.
// Express's types come from @types/express, which an Express app in
// TypeScript installs anyway.
import type { PoolClient } from 'pg';
import type { GuardOptions, IdempotencyInfo } from './lib/core';
import type { PhasedOptions } from './lib/phased';
export { Guard, defaultStore, parseKey } from './lib/core';
export type { GuardOptions, IdempotencyInfo, Outcome, Answer, StoredResponse, ParsedKey, GuardState, StartResult } from './lib/core';
export * from './lib/express';
export * from './lib/phases';
export * from './lib/phased';
export * from './lib/relay';
export { VERSION, EXTENSION_MIN, ExtensionVersionError } from './lib/compat';

declare module 'fastify' {
	interface FastifyRequest {
		/** The guarded transaction's client (set by idempotentFastify()). */
		db?: PoolClient;
		/** The key, scope, outcome and attempts of the guarded request. */
		idempotency?: IdempotencyInfo;
	}
}

/** Route hooks, spread into a Fastify route's options (typed by Fastify in 'pg-idempotency/fastify'). */
export interface IdempotentHooks {
	preHandler(request: any, reply: any): Promise<unknown>;
	onSend(request: any, reply: any, payload: any): Promise<unknown>;
}

/** Hooks guarding one Fastify route by the Idempotency-Key header. */
export function idempotentFastify<Req = any>(opts: GuardOptions<Req>): IdempotentHooks;

/** A Fastify route handler running opts.phases under the request's Idempotency-Key (typed by Fastify in 'pg-idempotency/fastify'). */
export function idempotentPhasesFastify<Req = any>(opts: PhasedOptions<Req>): (request: any, reply: any) => Promise<unknown>;
