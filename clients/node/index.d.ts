// index.d.ts: the types of index.js.  One line per lib module.
export { Guard, defaultStore, parseKey } from './lib/core';
import type { GuardOptions } from './lib/core';
export type { GuardOptions, IdempotencyInfo, Outcome, Answer, StoredResponse, ParsedKey, GuardState, StartResult } from './lib/core';
export * from './lib/express';
// Fastify is an optional peer dependency: the root types must compile
// without it (an Express-only app under `tsc --strict`, no skipLibCheck), so
// they do not import 'fastify'.  Its typed hooks and request.db /
// request.idempotency (module augmentation of FastifyRequest) are in
// 'pg-idempotency/fastify' (lib/fastify.d.ts): a Fastify app imports
// idempotentFastify from there.
/** Fastify route hooks (precisely typed in 'pg-idempotency/fastify'). */
export interface IdempotentFastifyHooks {
	preHandler: (request: any, reply: any) => Promise<void>;
	onSend: (request: any, reply: any, payload: unknown) => Promise<unknown>;
}
/** Hooks guarding one Fastify route; import it from 'pg-idempotency/fastify' for request.db's type. */
export declare function idempotentFastify<Req = any>(opts: GuardOptions<Req>): IdempotentFastifyHooks;
export * from './lib/phases';
export * from './lib/relay';
